"""Fits: raw microbenchmark tables (calibrate/bench.py) → the parameters of a profile (sim/config/profiles.py).

Pure numpy and pandas (no torch), so fits can be re-run, and tested, without the engine. Every fit takes
the fastest of each point's repeats (contention on a shared machine only ever adds time, so the minimum is
the most repeatable estimate of the uncontended cost; Python's ``timeit`` documentation makes the same
point), then minimises the *relative* squared error (each point weighted by
1 / measured), so microsecond and second points count alike, with non-negative coefficients (an exact
search over which coefficients are free; at most three). Each reports its MAPE: the mean over points of
|fit − fastest| / fastest, in percent.

| fit              | model                                                             | from table     |
| ---------------- | ----------------------------------------------------------------- | -------------- |
| ``fit_link``     | t(s) = t0 + s / BW, plus the size → GB/s table of the fastest     | copy.csv       |
| ``fit_gather``   | g(N, bytes) = N · frag_cost + bytes / rate  (threads = 1)         | recall.csv     |
| ``fit_compute``  | layer(B, T) = base + per_request · B + per_token · T;             | compute.csv    |
|                  | head(B) = head_base + head_per_request · B                        |                |
| ``fit_selection``| select(C) = base + per_block · C                                  | selection.csv  |
| ``fit_gpu_gather``| t(N, bytes) = launch + (bytes + N · half) / BW (io: gpu_gather)  | recall.csv     |

``fit_gather`` fits what gather-scatter costs beyond one coalesced copy of its bytes (the measured
gather_scatter time minus the link model's copy time for those bytes), because the simulator charges a
gather-scatter recall as host gather plus one copy (sim/step/link.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from sim.config import ComputeProfile, SelectionProfile
from sim.step import link


@dataclass(frozen=True)
class LinearFit:
    """Coefficients (same order as the design columns), MAPE in percent and number of points."""

    coef: tuple[float, ...]
    mape_pct: float
    points: int


def fit_relative_nonneg(x: np.ndarray, y: np.ndarray) -> LinearFit:
    """Minimise Σ ((x·β − y) / y)² over β ≥ 0.

    Args:
        x: float [n, k] design matrix (k ≤ 4), n ≥ k.
        y: float [n], positive measurements.

    Raises:
        ValueError: if shapes disagree, some y ≤ 0 or there are fewer points than coefficients.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n, k = x.shape
    if y.shape != (n,) or n < k:
        raise ValueError(f"need y of shape ({n},) and at least {k} points, got y {y.shape}")
    if (y <= 0).any() or not np.isfinite(y).all():
        raise ValueError(f"measurements must be positive and finite, got min {y.min()}")
    xs, ones = x / y[:, None], np.ones(n)
    best, best_err = np.zeros(k), np.inf
    for size in range(k, 0, -1):
        for free in combinations(range(k), size):
            beta = np.zeros(k)
            sol, *_ = np.linalg.lstsq(xs[:, free], ones, rcond=None)
            if (sol < 0).any():
                continue
            beta[list(free)] = sol
            err = float(((xs @ beta - 1.0) ** 2).sum())
            if err < best_err - 1e-15:
                best, best_err = beta, err
    mape = float(np.mean(np.abs(x @ best - y) / y) * 100)
    return LinearFit(tuple(float(b) for b in best), mape, n)


def fastest(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Minimum of ``value`` over repeats per ``keys`` point, as a flat DataFrame."""
    return df.groupby(keys, as_index=False)[value].min()


@dataclass(frozen=True)
class LinkFit:
    """`fit_link`'s result: t(s) = latency + s / bandwidth, and the measured table."""

    latency_us: float
    bandwidth_gbps: float
    size_table: list[tuple[int, float]]  # (size_bytes, GB/s of the fastest copy)
    mape_pct: float


def fit_link(copy: pd.DataFrame) -> LinkFit:
    """t(s) = t0 + s / BW over copy.csv, and the measured size → GB/s table.

    Raises:
        ValueError: if fewer than two sizes were measured or the fitted bandwidth is zero.
    """
    med = fastest(copy, ["size_bytes"], "seconds")
    if len(med) < 2:
        raise ValueError(f"copy.csv needs at least two sizes, got {len(med)}")
    sizes, seconds = med["size_bytes"].to_numpy(float), med["seconds"].to_numpy(float)
    fit = fit_relative_nonneg(np.column_stack([np.ones_like(sizes), sizes]), seconds)
    t0, inv_bw = fit.coef
    if inv_bw <= 0:
        raise ValueError("copy times do not grow with size: cannot fit a bandwidth")
    table = [(int(s), float(s / t / 1e9)) for s, t in zip(sizes, seconds)]
    return LinkFit(t0 * 1e6, 1.0 / inv_bw / 1e9, table, fit.mape_pct)


def table_copy_s(size_table: list[tuple[int, float]], sizes: np.ndarray) -> np.ndarray:
    """Copy seconds of each size from a (size_bytes, GB/s) table, by the simulator's own rule (sim/step/link.py)."""
    log_sizes = np.log([s for s, _ in size_table])
    bps = np.array([g * 1e9 for _, g in size_table])
    return link.table_copy_s(np.asarray(sizes, dtype=float), log_sizes, bps)


@dataclass(frozen=True)
class GatherFit:
    """`fit_gather`'s result: host gather time = N * fragment_us + bytes / gbps (one thread)."""

    fragment_us: float
    gbps: float
    mape_pct: float  # of the whole gather_scatter recall (gather + copy) against its measurement
    per_fragment_mape_pct: float  # of the simulator's per_fragment model (N copies of the fragment size)


def fit_gather(recall: pd.DataFrame, size_table: list[tuple[int, float]]) -> GatherFit:
    """Host gather cost from recall.csv: gather_scatter time minus one copy of its bytes.

    Raises:
        ValueError: if recall.csv has no gather_scatter rows or the residual is never positive.
    """
    gs = fastest(
        recall[recall["mode"] == "gather_scatter"], ["fragment_bytes", "num_fragments", "recall_bytes"], "seconds"
    )
    if gs.empty:
        raise ValueError("recall.csv has no gather_scatter rows")
    nbytes = gs["recall_bytes"].to_numpy(float)
    frags = gs["num_fragments"].to_numpy(float)
    total = gs["seconds"].to_numpy(float)
    copy = table_copy_s(size_table, nbytes)
    residual = total - copy
    keep = residual > 0.02 * total  # where the copy alone explains (almost) everything there is no gather to fit
    if keep.sum() < 2:
        frag_cost, inv_rate = 0.0, 0.0
    else:
        fit = fit_relative_nonneg(np.column_stack([frags[keep], nbytes[keep]]), residual[keep])
        frag_cost, inv_rate = fit.coef
    pred = copy + frags * frag_cost + nbytes * inv_rate
    mape = float(np.mean(np.abs(pred - total) / total) * 100)
    pf = fastest(recall[recall["mode"] == "per_fragment"], ["fragment_bytes", "num_fragments"], "seconds")
    pf_mape = float("nan")
    if not pf.empty:
        pf_pred = pf["num_fragments"].to_numpy(float) * table_copy_s(size_table, pf["fragment_bytes"].to_numpy(float))
        pf_mape = float(np.mean(np.abs(pf_pred - pf["seconds"]) / pf["seconds"]) * 100)
    gbps = 1.0 / inv_rate / 1e9 if inv_rate > 0 else 1e4  # no per-byte cost measurable: a rate far above any link
    return GatherFit(frag_cost * 1e6, gbps, mape, pf_mape)


def fit_call_us(recall: pd.DataFrame) -> float:
    """Host-side cost of one copy call in µs (the card's ``h2d_call_us``): the fastest per-copy time of the
    ``per_fragment`` loops in recall.csv (seconds / fragments, over every fragment size), 0 when there are none.

    The simulator charges a loop of N copies N · max(call, t(s)) (sim/step/link.py), so this floor never makes a
    measured copy slower than the loop that measured it.
    """
    pf = recall[recall["mode"] == "per_fragment"]
    if pf.empty:
        return 0.0
    return float((pf["seconds"] / pf["num_fragments"]).min() * 1e6)


@dataclass(frozen=True)
class GpuGatherFit:
    """The card's ``gpu_gather_*`` terms (sim/step/link.py) fitted to the engine's gpu_gather recalls."""

    launch_us: float
    gbps: float
    half_bytes: float  # fragment size at half the peak rate
    mape_pct: float
    points: int


def fit_gpu_gather(recall: pd.DataFrame) -> GpuGatherFit | None:
    """``t = launch + (bytes + N · half) / BW`` from recall.csv's ``gpu_gather`` rows (measured on CUDA only).

    Linear in (1, N, bytes) with coefficients (launch, half / BW, 1 / BW).

    Returns:
        The fit, or None when recall.csv has no gpu_gather rows (a CPU calibration).

    Raises:
        ValueError: if the time does not grow with the bytes (no bandwidth to fit).
    """
    gg = fastest(recall[recall["mode"] == "gpu_gather"], ["fragment_bytes", "num_fragments", "recall_bytes"], "seconds")
    if gg.empty:
        return None
    n, nbytes = gg["num_fragments"].to_numpy(float), gg["recall_bytes"].to_numpy(float)
    fit = fit_relative_nonneg(np.column_stack([np.ones_like(n), n, nbytes]), gg["seconds"].to_numpy(float))
    launch, per_fragment, inv_bw = fit.coef
    if inv_bw <= 0:
        raise ValueError("gpu_gather times do not grow with bytes: cannot fit a bandwidth")
    return GpuGatherFit(launch * 1e6, 1.0 / inv_bw / 1e9, per_fragment / inv_bw, fit.mape_pct, fit.points)


def fit_compute(compute: pd.DataFrame, model_name: str) -> ComputeProfile:
    """Per-layer and head decode time from compute.csv.

    Raises:
        ValueError: if there are fewer than three (batch, context) points.
    """
    # A point is (batch, context); its rounds differ by a token or two of context, so group by the point (not by
    # attended tokens, which would leave one round per group and nothing to take the fastest of).
    keys = ["batch_size", "context_tokens"]
    layer = fastest(compute, keys, "layer_s").merge(compute.groupby(keys, as_index=False)["attended_tokens"].mean())
    head = fastest(compute, keys, "head_s")
    if len(layer) < 3:
        raise ValueError(f"compute.csv needs at least three (batch, context) points, got {len(layer)}")
    b, t = layer["batch_size"].to_numpy(float), layer["attended_tokens"].to_numpy(float)
    lf = fit_relative_nonneg(np.column_stack([np.ones_like(b), b, t]), layer["layer_s"].to_numpy(float))
    hb = head["batch_size"].to_numpy(float)
    hf = fit_relative_nonneg(np.column_stack([np.ones_like(hb), hb]), head["head_s"].clip(lower=1e-9).to_numpy(float))
    return ComputeProfile(
        model=model_name,
        layer_base_us=lf.coef[0] * 1e6,
        layer_per_request_us=lf.coef[1] * 1e6,
        layer_per_token_ns=lf.coef[2] * 1e9,
        head_base_us=hf.coef[0] * 1e6,
        head_per_request_us=hf.coef[1] * 1e6,
        mape_pct=lf.mape_pct,
        head_mape_pct=hf.mape_pct,
        points=lf.points,
    )


def fit_selection(selection: pd.DataFrame) -> SelectionProfile:
    """Per-layer selection time from selection.csv.

    Raises:
        ValueError: if fewer than two candidate counts were measured.
    """
    med = fastest(selection, ["batch_size", "candidate_blocks"], "seconds")
    if med["candidate_blocks"].nunique() < 2:
        raise ValueError("selection.csv needs at least two candidate_blocks values")
    c = med["candidate_blocks"].to_numpy(float)
    fit = fit_relative_nonneg(np.column_stack([np.ones_like(c), c]), med["seconds"].to_numpy(float))
    return SelectionProfile(
        base_us=fit.coef[0] * 1e6, per_block_ns=fit.coef[1] * 1e9, mape_pct=fit.mape_pct, points=fit.points
    )
