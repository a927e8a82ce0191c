"""Microbenchmarks of the real engine, one function per measured quantity; each returns a raw DataFrame.

| function            | table (CSV)      | columns                                                                  |
| ------------------- | ---------------- | ------------------------------------------------------------------------ |
| ``bench_copy``      | ``copy.csv``     | size_bytes, repeat, seconds                                              |
| ``bench_recall``    | ``recall.csv``   | mode, fragment_bytes, num_fragments, recall_bytes, repeat, seconds       |
| ``bench_compute``   | ``compute.csv``  | batch_size, context_tokens, attended_tokens, repeat, layer_s, head_s     |
| ``bench_selection`` | ``selection.csv``| batch_size, candidate_blocks, repeat, seconds                            |
| ``bench_matmul``    | ``matmul.csv``   | size, repeat, seconds, tflops                                            |

``bench_recall`` lives in calibrate/bench_recall.py, the one recall microbenchmark (``pulseinfer engine-bench``
summarises the same measurement).

What each measures (all times from issue to completion; ``torch.cuda.synchronize`` around each sample on a
GPU, ``perf_counter_ns`` on a CPU):

* copy: one host → device copy of ``size_bytes`` (pinned host memory on CUDA). Sources rotate through a
  buffer far larger than the caches, so each copy reads cold memory, as a recall of blocks does. On a CPU
  the "device" is a second host tensor.
* recall: the engine's ``per_fragment`` and ``gather_scatter`` I/O (engine/io.py) moving ``num_fragments``
  random host blocks of ``fragment_bytes`` into random device blocks, both modes on the same blocks,
  interleaved.
* compute: decode steps of the engine's ``OffloadedDecoder`` with every block resident (calibrate/harness.py)
  for each (batch, context) point, round-robin over the points; ``layer_s`` is the median per-layer span of
  a step, ``head_s`` the step span minus its layers (embedding, LM head, argmax, bookkeeping).
* selection: the engine's selection of one layer (the layer's query predicted from the residual stream,
  Quest scores over the candidates' summaries, SoloHead top-k, block ids) for ``batch_size`` requests
  holding ``candidate_blocks`` offloaded blocks in total.
* matmul: a square GEMM in the card's dtype, for the prefill roofline's peak (prefill is not validated).

Repeats interleave the points where that is cheap (copy, recall) so drift on a shared machine hits them
alike; fits take the fastest repeat of each point (calibrate/fit.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pandas as pd
import torch

from calibrate.harness import EnginePolicy, build_decoder, timed_step
from engine.model import DecoderConfig, init_weights, project_query

COPY_COLUMNS = ["size_bytes", "repeat", "seconds"]
COMPUTE_COLUMNS = ["batch_size", "context_tokens", "attended_tokens", "repeat", "layer_s", "head_s"]
SELECTION_COLUMNS = ["batch_size", "candidate_blocks", "repeat", "seconds"]
MATMUL_COLUMNS = ["size", "repeat", "seconds", "tflops"]


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], cuda: bool) -> float:
    """Seconds from issue to completion of ``fn()`` (synchronised on CUDA)."""
    _sync(cuda)
    start = time.perf_counter_ns()
    fn()
    _sync(cuda)
    return (time.perf_counter_ns() - start) * 1e-9


@dataclass(frozen=True)
class BenchGrid:
    """The points each benchmark measures. ``quick_grid`` and ``full_grid`` give the shipped choices."""

    copy_sizes_bytes: tuple[int, ...]
    copy_buffer_bytes: int
    fragment_bytes: tuple[int, ...]
    fragment_counts: tuple[int, ...]
    host_pool_bytes: int
    compute_batches: tuple[int, ...]
    compute_contexts: tuple[int, ...]
    compute_steps: int
    selection_batches: tuple[int, ...]
    selection_contexts: tuple[int, ...]
    matmul_size: int
    repeats: int


# The smallest grid that still fits every term: a 2-layer calibration in seconds
# (tests/calibrate, scripts/bench_validation_loop.py).
TINY_GRID = BenchGrid(
    copy_sizes_bytes=tuple(4096 * 4**i for i in range(7)),  # 4 KiB … 16 MiB
    copy_buffer_bytes=64 << 20,
    fragment_bytes=(16 << 10, 64 << 10),
    fragment_counts=(16, 128, 512),
    host_pool_bytes=64 << 20,
    compute_batches=(1, 2, 4),
    compute_contexts=(1024, 2048, 4096),
    compute_steps=5,
    selection_batches=(1, 4),
    selection_contexts=(2048, 4096),
    matmul_size=256,
    repeats=3,
)


def quick_grid(cuda: bool) -> BenchGrid:
    """Small grid: under 2 minutes on a 2-core CPU (`pulseinfer calibrate --quick`)."""
    return BenchGrid(
        copy_sizes_bytes=tuple(4096 * 4**i for i in range(8)),  # 4 KiB … 64 MiB
        copy_buffer_bytes=(512 << 20) if cuda else (160 << 20),
        fragment_bytes=(8 << 10, 32 << 10, 128 << 10),
        fragment_counts=(16, 128, 512),
        host_pool_bytes=(1 << 30) if cuda else (160 << 20),
        compute_batches=(1, 4, 8),
        compute_contexts=(1024, 4096, 12288),
        compute_steps=3,
        selection_batches=(1, 8),
        selection_contexts=(2048, 16384),
        matmul_size=2048 if cuda else 512,
        repeats=3,
    )


def full_grid(cuda: bool) -> BenchGrid:
    """The default grid: more points and repeats (minutes on a CPU)."""
    return BenchGrid(
        copy_sizes_bytes=tuple(4096 * 2**i for i in range(15)),  # 4 KiB … 64 MiB
        copy_buffer_bytes=(1 << 30) if cuda else (256 << 20),
        fragment_bytes=(4 << 10, 8 << 10, 32 << 10, 128 << 10),
        fragment_counts=(16, 64, 256, 1024),
        host_pool_bytes=(2 << 30) if cuda else (512 << 20),
        compute_batches=(1, 2, 4, 8, 16),
        compute_contexts=(512, 2048, 8192, 16384),
        compute_steps=5,
        selection_batches=(1, 4, 16),
        selection_contexts=(2048, 8192, 32768),
        matmul_size=8192 if cuda else 1024,
        repeats=7,
    )


def bench_copy(sizes: Iterable[int], buffer_bytes: int, repeats: int, device: str) -> pd.DataFrame:
    """One host → device copy per size, sources rotating through ``buffer_bytes`` of host memory.

    Raises:
        ValueError: if a size exceeds half the buffer.
    """
    sizes = list(sizes)
    if max(sizes) * 2 > buffer_bytes:
        raise ValueError(f"copy size {max(sizes)} must be at most half of buffer_bytes={buffer_bytes}")
    cuda = torch.device(device).type == "cuda"
    src = torch.ones(buffer_bytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(max(sizes), dtype=torch.uint8, device=device)
    rows = []
    offset = 0
    for repeat in range(repeats + 1):  # repeat 0 warms up and is dropped
        for size in sizes:
            if offset + size > buffer_bytes:
                offset = 0
            view = src[offset : offset + size]
            seconds = timed(lambda v=view, s=size: dst[:s].copy_(v, non_blocking=True), cuda)
            offset += size
            if repeat:
                rows.append((size, repeat - 1, seconds))
    return pd.DataFrame(rows, columns=COPY_COLUMNS)


def bench_compute(
    config: DecoderConfig,
    batches: Iterable[int],
    contexts: Iterable[int],
    steps: int,
    device: str,
    seed: int = 0,
    warmup_steps: int = 2,
) -> pd.DataFrame:
    """Dense decode steps of the engine for each (batch, context): per-layer and head seconds.

    Every request of a point has the same context. All points are built first, then decoded round-robin,
    one step per point per round (``warmup_steps`` unrecorded rounds, then ``steps`` recorded), so drift of
    a shared machine's speed spreads over every point instead of biasing the points measured last.
    """
    resident = EnginePolicy("resident", resident=True)
    points = [(b, c) for b in batches for c in contexts]
    weights = init_weights(config, seed, device)
    decoders = [
        build_decoder(config, resident, [c] * b, warmup_steps + steps + 1, device, seed, weights) for b, c in points
    ]
    rows = []
    for rnd in range(warmup_steps + steps):
        for (batch, ctx), decoder in zip(points, decoders):
            tokens = torch.zeros(batch, dtype=torch.int64, device=device)
            _, step_s, layers = timed_step(decoder, list(range(batch)), tokens)
            if rnd < warmup_steps:
                continue
            attended = batch * (ctx + 1 + rnd)  # the context grows by one token per step
            rows.append((batch, ctx, attended, rnd - warmup_steps, statistics.median(layers), step_s - sum(layers)))
    return pd.DataFrame(rows, columns=COMPUTE_COLUMNS)


def bench_selection(
    config: DecoderConfig,
    policy: EnginePolicy,
    batches: Iterable[int],
    contexts: Iterable[int],
    repeats: int,
    device: str,
    seed: int = 0,
) -> pd.DataFrame:
    """The engine's per-layer selection (predicted query, Quest scores, top-k) for offloaded requests.

    Runs ``OffloadedDecoder._select`` — the exact code a decode step runs — on a prepared step.
    """
    cuda = torch.device(device).type == "cuda"
    weights = init_weights(config, seed, device)
    rows = []
    for batch in batches:
        for ctx in contexts:
            decoder = build_decoder(config, policy, [ctx] * batch, 4, device, seed, weights)
            ids = list(range(batch))
            st = decoder.cache.prepare_step(ids)
            x = torch.randn(batch, config.hidden_size, generator=torch.Generator().manual_seed(seed)).to(
                device=device, dtype=config.dtype
            )
            layer = decoder.weights.layers[0]
            candidates = int(st.candidate_valid.sum())

            def select(x=x, st=st, decoder=decoder, layer=layer) -> None:
                decoder._select(0, project_query(config, layer, x, st.positions), st)

            timed(select, cuda)  # warm-up
            for repeat in range(repeats):
                rows.append((batch, candidates, repeat, timed(select, cuda)))
            decoder.cache.finish_step(st)
            del decoder
    return pd.DataFrame(rows, columns=SELECTION_COLUMNS)


def bench_matmul(size: int, dtype: torch.dtype, repeats: int, device: str) -> pd.DataFrame:
    """A square GEMM of ``size``: seconds and achieved TFLOP/s (2·n³ FLOPs)."""
    cuda = torch.device(device).type == "cuda"
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    timed(lambda: a @ b, cuda)
    rows = []
    for repeat in range(repeats):
        seconds = timed(lambda: a @ b, cuda)
        rows.append((size, repeat, seconds, 2 * size**3 / seconds / 1e12))
    return pd.DataFrame(rows, columns=MATMUL_COLUMNS)
