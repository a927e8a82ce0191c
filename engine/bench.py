"""Recall microbenchmark: `per_fragment` vs `gather_scatter` on the same fragments, next to a plain copy.

For each fragment size, both modes recall the same randomly chosen host blocks into the same randomly
chosen free device slots of one layer. Repeats interleave the modes (per_fragment, gather_scatter,
plain copy, then again), so drift on a shared machine hits all of them alike; the table reports medians.
A plain copy of one large contiguous buffer host -> device is the peak.

Geometry: num_kv_heads = 1, head_dim = 128, bf16, so one block is one fragment: the K and V of one head
of one block, which is what a head-wise selector moves per (block, head); block_size =
fragment_bytes / 512 (8 KiB = 16 tokens). Times are wall-clock from issue to completion
(`torch.cuda.synchronize` before and after on a GPU), so host-side gather and launch costs count.
On a CPU-only machine the "device" pool is a separate preallocated CPU tensor standing in for device
memory: the copies "to the device" are memory-to-memory copies into it (engine/io.py explains how
gather_scatter maps onto it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from engine.io import make_io
from engine.pools import make_pools

BENCH_COLUMNS = ["mode", "fragment_bytes", "num_fragments", "gbps", "seconds"]
RECALL_MODES = ("per_fragment", "gather_scatter")
HEAD_DIM = 128
DTYPE = torch.bfloat16
_BYTES_PER_TOKEN = 2 * HEAD_DIM * DTYPE.itemsize  # K and V of one head


@dataclass(frozen=True)
class BenchSettings:
    fragment_bytes: tuple[int, ...] = (4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10)
    recall_bytes: int = 4 << 20  # recalled per measurement: num_fragments = recall_bytes // fragment_bytes
    host_pool_bytes: int = 256 << 20  # the host pool the fragments are drawn from (far larger than caches)
    plain_copy_bytes: int = 64 << 20  # the peak's contiguous copy
    repeats: int = 15
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        for f in self.fragment_bytes:
            if f < _BYTES_PER_TOKEN or f % _BYTES_PER_TOKEN:
                raise ValueError(f"fragment_bytes {f} must be a positive multiple of {_BYTES_PER_TOKEN}")
            if self.recall_bytes < f or self.host_pool_bytes < 2 * self.recall_bytes:
                raise ValueError(
                    f"recall_bytes={self.recall_bytes} must be >= fragment_bytes {f} and host_pool_bytes="
                    f"{self.host_pool_bytes} >= 2 * recall_bytes"
                )
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats} must be >= 1")


def quick_settings(device: str = "cpu") -> BenchSettings:
    """Fewer repeats and smaller pools: finishes in seconds on a CPU."""
    return BenchSettings(host_pool_bytes=64 << 20, plain_copy_bytes=32 << 20, repeats=5, device=device)


def _timed(fn: Callable[[], object], cuda: bool) -> float:
    """Seconds from issue to completion of fn()."""
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter_ns()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter_ns() - start) * 1e-9


def _plain_copy(settings: BenchSettings) -> Callable[[], object]:
    cuda = torch.device(settings.device).type == "cuda"
    src = torch.ones(settings.plain_copy_bytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(settings.plain_copy_bytes, dtype=torch.uint8, device=settings.device)
    return lambda: dst.copy_(src, non_blocking=True)


def _recalls(settings: BenchSettings, fragment_bytes: int, gen: torch.Generator) -> dict[str, Callable[[], object]]:
    """For one fragment size: a zero-argument recall per mode, all moving the same fragments.

    Raises:
        RuntimeError: if the two modes do not leave byte-identical device pools.
    """
    n = settings.recall_bytes // fragment_bytes
    device_pool, host_pool = make_pools(
        1, 2 * n, settings.host_pool_bytes // fragment_bytes, fragment_bytes // _BYTES_PER_TOKEN, 1, HEAD_DIM, DTYPE,
        settings.device,
    )  # fmt: skip
    src = torch.randperm(host_pool.num_blocks, generator=gen)[:n]
    dst = torch.randperm(device_pool.num_blocks, generator=gen)[:n]
    host_pool.layers[0][src] = torch.randn((n, *host_pool.block_shape), generator=gen).to(DTYPE)
    ios = {mode: make_io(mode, host_pool, device_pool) for mode in RECALL_MODES}
    results = []
    for io in ios.values():
        device_pool.layers[0].zero_()
        io.recall(0, src, dst)
        io.wait(0)
        results.append(device_pool.layers[0].clone())
    if not torch.equal(*results):
        raise RuntimeError(f"per_fragment and gather_scatter pools differ at fragment_bytes={fragment_bytes}")
    return {mode: (lambda io=io: io.recall(0, src, dst)) for mode, io in ios.items()}


def run_bench(settings: BenchSettings) -> pd.DataFrame:
    """Measure every mode and fragment size; one row per (mode, fragment_bytes) with median seconds.

    Returns:
        DataFrame with BENCH_COLUMNS; `gbps` is bytes moved / median seconds / 1e9. The plain copy is one
        row with fragment_bytes = plain_copy_bytes and num_fragments = 1.
    """
    cuda = torch.device(settings.device).type == "cuda"
    gen = torch.Generator().manual_seed(settings.seed)
    plain = _plain_copy(settings)
    plain_s: list[float] = []
    rows = []
    for fragment_bytes in settings.fragment_bytes:
        fns = _recalls(settings, fragment_bytes, gen)
        fns["plain_copy"] = plain
        samples: dict[str, list[float]] = {mode: [] for mode in fns}
        for fn in fns.values():  # warm-up
            _timed(fn, cuda)
        for _ in range(settings.repeats):
            for mode, fn in fns.items():
                samples[mode].append(_timed(fn, cuda))
        plain_s += samples.pop("plain_copy")
        n = settings.recall_bytes // fragment_bytes
        for mode, times in samples.items():
            seconds = statistics.median(times)
            rows.append((mode, fragment_bytes, n, n * fragment_bytes / seconds / 1e9, seconds))
    seconds = statistics.median(plain_s)
    rows.append(("plain_copy", settings.plain_copy_bytes, 1, settings.plain_copy_bytes / seconds / 1e9, seconds))
    return pd.DataFrame(rows, columns=BENCH_COLUMNS)


def format_table(results: pd.DataFrame) -> str:
    """One line per fragment size: GB/s of both modes, gather_scatter / per_fragment, gather_scatter / plain."""
    plain = results[results["mode"] == "plain_copy"].iloc[0]
    wide = results[results["mode"] != "plain_copy"].pivot(index="fragment_bytes", columns="mode", values="gbps")
    counts = results.groupby("fragment_bytes")["num_fragments"].first()
    lines = [
        f"{'fragment':>9} {'fragments':>9} {'per_fragment':>12} {'gather_scatter':>14} {'gs/pf':>6} {'gs/plain':>8}",
        f"{'KiB':>9} {'':>9} {'GB/s':>12} {'GB/s':>14} {'x':>6} {'x':>8}",
    ]
    for fragment_bytes, row in wide.iterrows():
        pf, gs = row["per_fragment"], row["gather_scatter"]
        lines.append(
            f"{fragment_bytes / 1024:>9.0f} {counts[fragment_bytes]:>9d} {pf:>12.2f} {gs:>14.2f} "
            f"{gs / pf:>6.1f} {gs / plain['gbps']:>8.2f}"
        )
    lines.append(f"plain copy of {plain['fragment_bytes'] / 2**20:.0f} MiB: {plain['gbps']:.2f} GB/s (the peak)")
    return "\n".join(lines)
