"""The recall microbenchmark: ``per_fragment`` vs ``gather_scatter`` (engine/io.py) on the same fragments.

One code path behind ``pulseinfer calibrate`` (the raw ``recall.csv`` the gather fit reads) and
``pulseinfer engine-bench`` (medians and GB/s next to a plain copy, ``engine_bench.csv``)::

    bench_recall(points, ...)   raw rows, RECALL_COLUMNS: one per (mode, fragment_bytes, num_fragments, repeat)
       └─ _recall_ios           per fragment size: pools, both I/O modes, a byte-identity check
    run_bench(BenchSettings)    bench_recall at a constant recalled size + a plain copy -> medians, BENCH_COLUMNS
    format_table(results)       engine-bench's text table

Geometry: num_kv_heads = 1, head_dim = 128, bf16, so one block is one fragment: the K and V of one head
of one block, which is what a head-wise selector moves per (block, head); block_size =
fragment_bytes / 512 tokens (8 KiB = 16 tokens).

Procedure: per fragment size, one host pool far larger than the caches and one device pool holding the
largest count. For every repeat (repeat 0 warms up and is dropped) and fragment count, a fresh random draw
of host blocks and of distinct device blocks; both modes recall that same draw one after the other, then the
plain copy (when asked for) runs, so drift on a shared machine hits them alike. Times are wall-clock from
issue to completion (``torch.cuda.synchronize`` before and after on a GPU, ``perf_counter_ns`` on a CPU),
so host-side gather and launch costs count. The plain copy is one contiguous host -> device copy, the peak.
On a CPU-only machine the "device" pool is a separate preallocated CPU tensor standing in for device
memory: the copies "to the device" are memory-to-memory copies into it (engine/io.py explains how
gather_scatter maps onto it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pandas as pd
import torch

from calibrate.bench import timed
from engine import triton_gather
from engine.io import RecallIO, make_io
from engine.pools import make_pools

RECALL_COLUMNS = ["mode", "fragment_bytes", "num_fragments", "recall_bytes", "repeat", "seconds"]
BENCH_COLUMNS = ["mode", "fragment_bytes", "num_fragments", "gbps", "seconds"]
RECALL_MODES = ("per_fragment", "gather_scatter")  # every device; recall_modes adds gpu_gather where it is real
HEAD_DIM = 128
DTYPE = torch.bfloat16
TOKEN_BYTES = 2 * HEAD_DIM * DTYPE.itemsize  # K and V of one head: 512 B


def bench_recall(
    points: Iterable[tuple[int, int]],
    host_pool_bytes: int,
    repeats: int,
    device: str,
    seed: int = 0,
    plain_copy_bytes: int = 0,
) -> pd.DataFrame:
    """Time both recall modes at every (fragment_bytes, num_fragments) point (module docstring).

    Args:
        points: (fragment_bytes, num_fragments) pairs; fragment sizes are measured one after the other in
            first-seen order, the counts of one size interleaved.
        host_pool_bytes: bytes of the host pool the fragments are drawn from (per fragment size).
        repeats: recorded repeats per point, >= 1 (one more, unrecorded, warms up).
        device: torch device of the device pool ("cpu", "cuda", "cuda:N").
        seed: seeds the block draws and the check's data.
        plain_copy_bytes: > 0 also times one contiguous host -> device copy of that size after the modes at
            every (repeat, point): rows with mode "plain_copy", fragment_bytes = plain_copy_bytes,
            num_fragments = 1.

    Returns:
        DataFrame with RECALL_COLUMNS; seconds per sample, recall_bytes = num_fragments * fragment_bytes.

    Raises:
        ValueError: if a fragment size is not a positive multiple of 512 bytes, a count is below 1, the host
            pool holds fewer than twice the largest count of a size, or repeats < 1.
        RuntimeError: if the two modes leave different device blocks (engine/io.py's contract).
    """
    by_size = _group_points(points, host_pool_bytes, repeats)
    cuda = torch.device(device).type == "cuda"
    gen = torch.Generator().manual_seed(seed)
    plain = _plain_copy(plain_copy_bytes, device) if plain_copy_bytes > 0 else None
    rows = []
    for frag, counts in by_size.items():
        ios, num_host, num_device = _recall_ios(frag, counts[-1], host_pool_bytes, device, gen)
        for repeat in range(repeats + 1):
            for n in counts:
                src = torch.randperm(num_host, generator=gen)[:n]
                dst = torch.randperm(num_device, generator=gen)[:n]
                samples = [
                    (mode, frag, n, timed(lambda io=io, s=src, d=dst: (io.recall(0, s, d), io.wait(0)), cuda))
                    for mode, io in ios.items()
                ]
                if plain is not None:
                    samples.append(("plain_copy", plain_copy_bytes, 1, timed(plain, cuda)))
                if repeat:
                    rows += [(mode, f, k, f * k, repeat - 1, s) for mode, f, k, s in samples]
        del ios
    return pd.DataFrame(rows, columns=RECALL_COLUMNS)


def _group_points(points: Iterable[tuple[int, int]], host_pool_bytes: int, repeats: int) -> dict[int, list[int]]:
    """fragment_bytes -> sorted distinct counts, checked (see `bench_recall`'s Raises)."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    by_size: dict[int, list[int]] = {}
    for frag, n in points:
        check_fragment_bytes(frag)
        if n < 1:
            raise ValueError(f"num_fragments {n} must be >= 1")
        by_size.setdefault(frag, []).append(n)
    if not by_size:
        raise ValueError("points is empty: give at least one (fragment_bytes, num_fragments)")
    for frag, counts in by_size.items():
        counts[:] = sorted(set(counts))
        if host_pool_bytes // frag < 2 * counts[-1]:
            raise ValueError(
                f"host_pool_bytes={host_pool_bytes} holds {host_pool_bytes // frag} blocks of {frag} B; "
                f"need 2x {counts[-1]}"
            )
    return by_size


def recall_modes(device: str) -> tuple[str, ...]:
    """The recall modes timed on ``device``: ``RECALL_MODES``, plus ``gpu_gather`` on CUDA when the Triton kernel
    is available (elsewhere GpuGatherIO falls back to a copy and its times would not be a gather kernel's)."""
    if torch.device(device).type == "cuda" and triton_gather.available():
        return (*RECALL_MODES, "gpu_gather")
    return RECALL_MODES


def check_fragment_bytes(fragment_bytes: int) -> None:
    """Raise ValueError unless fragment_bytes is a positive multiple of TOKEN_BYTES (whole tokens of one head)."""
    if fragment_bytes < TOKEN_BYTES or fragment_bytes % TOKEN_BYTES:
        raise ValueError(f"fragment_bytes {fragment_bytes} must be a positive multiple of {TOKEN_BYTES}")


def _recall_ios(
    fragment_bytes: int, max_count: int, host_pool_bytes: int, device: str, gen: torch.Generator
) -> tuple[dict[str, RecallIO], int, int]:
    """Pools for one fragment size and an I/O engine per mode: (ios by mode, host blocks, device blocks).

    Both modes first recall the same max_count random blocks (random data); their device blocks must be equal.

    Raises:
        RuntimeError: if they are not.
    """
    num_host = host_pool_bytes // fragment_bytes
    device_pool, host_pool = make_pools(
        1, max_count, num_host, fragment_bytes // TOKEN_BYTES, 1, HEAD_DIM, DTYPE, device
    )
    ios = {mode: make_io(mode, host_pool, device_pool) for mode in recall_modes(device)}
    src = torch.randperm(num_host, generator=gen)[:max_count]
    dst = torch.randperm(max_count, generator=gen)
    host_pool.layers[0][src] = torch.randn((max_count, *host_pool.block_shape), generator=gen, dtype=DTYPE)
    dst_dev = dst.to(device_pool.device)
    results = []
    for io in ios.values():
        device_pool.layers[0].zero_()
        io.recall(0, src, dst)
        io.wait(0)
        results.append(device_pool.layers[0][dst_dev].cpu())
    if not all(torch.equal(results[0], r) for r in results[1:]):
        raise RuntimeError(f"recall modes {list(ios)} give different device blocks at fragment_bytes={fragment_bytes}")
    return ios, num_host, max_count


def _plain_copy(nbytes: int, device: str) -> Callable[[], object]:
    """One contiguous host -> device copy of nbytes (pinned host memory on CUDA)."""
    cuda = torch.device(device).type == "cuda"
    src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return lambda: dst.copy_(src, non_blocking=True)


@dataclass(frozen=True)
class BenchSettings:
    """``pulseinfer engine-bench``: a constant recalled size per fragment size, next to a plain copy.

    Raises:
        ValueError: (on construction) a fragment size that is not whole tokens or exceeds recall_bytes, a
            host pool smaller than twice recall_bytes, or repeats < 1.
    """

    fragment_bytes: tuple[int, ...] = (4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10)
    recall_bytes: int = 4 << 20  # recalled per measurement: num_fragments = recall_bytes // fragment_bytes
    host_pool_bytes: int = 256 << 20  # the host pool the fragments are drawn from (far larger than caches)
    plain_copy_bytes: int = 64 << 20  # the peak's contiguous copy
    repeats: int = 15
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        for f in self.fragment_bytes:
            check_fragment_bytes(f)
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


def run_bench(settings: BenchSettings) -> pd.DataFrame:
    """`bench_recall` at recall_bytes per fragment size, plus the plain copy; medians per (mode, fragment_bytes).

    Returns:
        DataFrame with BENCH_COLUMNS: per fragment size a per_fragment and a gather_scatter row, then one
        plain_copy row (fragment_bytes = plain_copy_bytes, num_fragments = 1); ``seconds`` is the median over
        repeats, ``gbps`` bytes moved / seconds / 1e9.

    Raises:
        RuntimeError: as `bench_recall`.
    """
    points = [(f, settings.recall_bytes // f) for f in settings.fragment_bytes]
    raw = bench_recall(
        points, settings.host_pool_bytes, settings.repeats, settings.device, settings.seed, settings.plain_copy_bytes
    )
    raw["last"] = raw["mode"] == "plain_copy"  # the peak's row comes after every recall row
    keys = ["last", "mode", "fragment_bytes", "num_fragments"]
    medians = raw.groupby(keys, sort=False)["seconds"].median().reset_index()
    medians = medians.sort_values("last", kind="stable")
    medians["gbps"] = medians["fragment_bytes"] * medians["num_fragments"] / medians["seconds"] / 1e9
    return medians[BENCH_COLUMNS].reset_index(drop=True)


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
