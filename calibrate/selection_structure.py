"""Fit the persistent structure of recalls (sim/config/measured.py ``RecallStatsSpec``) from the engine's per
(layer, step) selection statistics: per-layer spread, drift, its step-to-step correlation, topic shifts and the
misses of blocks that just left the recent window.

From one budget's table (calibrate/selection_stats.py columns), after the first ``working_set_steps`` steps:

* **fresh blocks** — every ``block_size`` steps a block leaves the recent window and, never recalled, misses in
  every layer that selects it: ``fresh_block_frac`` = (mean misses at those steps − at the others) / layers, the
  steps being those of the context phase (mod ``block_size``) with the most misses (needs ≥ block_size steps);
* **per-layer spread** — layers differ in misses far more than in change (the share of returning blocks differs
  too, and layers that change more also miss a larger share of it): the simulator multiplies the depth curve of
  change by a lognormal factor per (request, layer), so ``layer_sigma`` is the factor's spread that, times the
  measured curve's, gives the measured coefficient of variation of per-layer misses (moment match:
  cv_f² = (1 + cv_miss²) / (1 + cv_change²) − 1, σ = sqrt(ln(1 + cv_f²))). The log-sd of misses / change
  ignores that correlation and left the simulated CV across layers at ~0.6 of the engine's (issue 16);
* **drift** — s_t = misses of step t / their mean (steps without a fresh block): Poisson noise alone gives
  var(log s) ≈ 1 / mean; what is left is the drift, ``drift_sigma`` = sqrt(max(var(log s) − 1 / mean, 0)), with
  ``drift_corr`` = the lag-1 autocorrelation of log s scaled by the drift's share of its variance;
* **topic shifts** — runs of steps with s ≥ ``SHIFT_LEVEL``: ``burst_prob`` = runs / steps, ``burst_steps`` = mean
  run length, ``burst_change_frac`` = mean change fraction in them.

The per-request factor cannot be measured on one text and keeps its default.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SHIFT_LEVEL = 3.0  # a step with this many times the mean misses (outside a fresh block) is a topic shift


def layer_sigma(per_layer_misses: np.ndarray, per_layer_change: np.ndarray) -> float:
    """Spread of the lognormal per-layer factor that makes change × factor as variable across layers as the
    measured misses (float arrays [L]; module docstring: a moment match of coefficients of variation)."""

    def cv2(x: np.ndarray) -> float:
        return float(np.var(x) / np.mean(x) ** 2)

    factor_cv2 = max((1.0 + cv2(per_layer_misses)) / (1.0 + cv2(per_layer_change)) - 1.0, 0.0)
    return float(np.sqrt(np.log1p(factor_cv2)))


def fit_structure(df: pd.DataFrame, block_size: int, working_set_steps: int = 12) -> dict:
    """Structure parameters from one budget's selection statistics.

    Args:
        df: rows with ``layer``, ``step``, ``context_tokens``, ``change_frac``, ``missing_blocks`` for one budget.
        block_size: P, tokens per block (a block leaves the recent window every P steps).
        working_set_steps: w; the first w steps (cold buffer, growing history) are left out.

    Returns:
        {"fresh_block_frac", "layer_sigma", "drift_sigma", "drift_corr", "burst_prob", "burst_steps",
        "burst_change_frac"}, valid for ``RecallStatsSpec``.

    Raises:
        ValueError: if fewer than three steps remain after the first w.
    """
    df = df[df["step"] >= working_set_steps]
    miss = df.pivot(index="step", columns="layer", values="missing_blocks").astype(float)
    if len(miss) < 3:
        raise ValueError(f"need >= 3 steps after the first {working_set_steps} to fit the structure, got {len(miss)}")
    ctx = df.groupby("step")["context_tokens"].first().reindex(miss.index).to_numpy()
    # the phase of the context (mod block_size) at which a block leaves the window: the one with the most misses
    phase = ctx % block_size
    by_phase = pd.Series(miss.sum(axis=1).to_numpy()).groupby(phase).mean()
    fresh = phase == by_phase.idxmax() if len(by_phase) == block_size else np.zeros(len(ctx), dtype=bool)
    plain = miss[~fresh]
    layers = miss.shape[1]
    fresh_frac = (miss[fresh].sum(axis=1).mean() - plain.sum(axis=1).mean()) / layers if fresh.any() else 0.0
    change = df.pivot(index="step", columns="layer", values="change_frac").mean().clip(lower=1e-3)
    per_layer = plain.mean().clip(lower=1e-3)
    per_step = plain.sum(axis=1).to_numpy()
    s = np.clip(per_step / per_step.mean(), 1e-3, None)
    log_s = np.log(s)
    total_var = float(log_s.var())
    drift_var = max(total_var - 1.0 / per_step.mean(), 0.0)
    lag1 = float(np.corrcoef(log_s[:-1], log_s[1:])[0, 1]) if total_var > 0 else 0.0
    corr = float(np.clip(lag1 * total_var / drift_var, 0.0, 0.95)) if drift_var > 0 else 0.0
    shifting = s >= SHIFT_LEVEL
    runs = int(np.count_nonzero(shifting[1:] & ~shifting[:-1]) + shifting[0])
    shift_change = df.pivot(index="step", columns="layer", values="change_frac")[~fresh].to_numpy()[shifting]
    return {
        "fresh_block_frac": float(np.clip(fresh_frac, 0.0, 1.0)),
        "layer_sigma": layer_sigma(per_layer.to_numpy(), change.to_numpy()),
        "drift_sigma": float(np.sqrt(drift_var)),
        "drift_corr": corr,
        "burst_prob": runs / len(s),
        "burst_steps": float(shifting.sum() / runs) if runs else 4.0,
        "burst_change_frac": float(np.clip(np.nanmean(shift_change), 0.01, 1.0)) if runs else 0.5,
    }
