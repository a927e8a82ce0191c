"""Selection statistics (calibrate/selection_stats.py's table) -> the simulator's ``recall_stats`` (no torch here).

`fit_recall_stats` produces a dict that `sim.config.RecallStatsSpec` accepts (docs/design.md "Recall model",
sim/step/recall.py):

* ``change_mean_by_depth``: one knot per layer l, (l / (L - 1), mean change fraction of layer l over the
  warm steps t >= 1). Depth is normalised so that a 30-layer model's curve applies to a 40-layer one: the
  simulator interpolates it at its own layers' depths (Model assumption: change depends on relative depth).
  Means are clipped into [CLIP, 1 - CLIP] because the spec needs the open interval (0, 1); a layer whose
  selection never changes (budget covering every candidate) is clipped, with a warning, and listed by
  `selection_summary`.
* ``change_shape_a``: the Kumaraswamy shape a, by the method of moments: each layer's b is tied to its mean
  through `sim.step.distributions.kumaraswamy_b(mean, a)` (as the simulator does), and a minimises the squared
  difference between the model's and the measured per-layer standard deviations of the change fraction.
  Not maximum likelihood: measured fractions are counts / k and hit exactly 0 and 1, where the Kumaraswamy
  log-density is infinite. The measured spread includes the count granularity (at most 1 / (2k) in
  standard deviation), which the simulator's stochastic rounding adds again; the fit does not remove it.
* ``returning_frac``: sum of returning blocks / sum of changed-in blocks over steps t >= w, where the w-step
  history is complete (all layers pooled).
* ``working_set_steps``: w, the window the table's ``returning_blocks`` were counted over.

`selection_summary` gives what the recall model does not draw but a profile should record: per-layer
measured miss fractions (SoloHead and head-wise, with the table's LRU buffer), head-wise union ratio
|U_h S_h| / k, fragments per step, and the clipped layers.
"""

from __future__ import annotations

import warnings
from math import exp, lgamma, log

import numpy as np
import pandas as pd

from calibrate.selection_structure import fit_structure
from sim.config import RecallStatsSpec
from sim.step.distributions import kumaraswamy_b

CLIP = 1e-3  # change means are kept in [CLIP, 1 - CLIP]
A_RANGE = (0.05, 50.0)  # search interval of the Kumaraswamy shape a
NEEDED_COLUMNS = (
    "budget_tokens", "working_set_steps", "layer", "step", "change_frac", "changed_blocks", "returning_blocks",
)  # fmt: skip


def kumaraswamy_moment(n: int, a: float, b: float) -> float:
    """E[X^n] of Kumaraswamy(a, b): b * B(1 + n / a, b)."""
    return exp(log(b) + lgamma(1 + n / a) + lgamma(b) - lgamma(1 + n / a + b))


def kumaraswamy_std(mean: float, a: float) -> float:
    """Standard deviation of the Kumaraswamy with shape a whose b gives `mean` (the simulator's tie)."""
    b = kumaraswamy_b(mean, a)
    return max(kumaraswamy_moment(2, a, b) - kumaraswamy_moment(1, a, b) ** 2, 0.0) ** 0.5


def fit_shape_a(means: np.ndarray, stds: np.ndarray) -> float:
    """Kumaraswamy a minimising sum_l (std_model(mean_l, a) - std_l)^2: a log grid, then golden section.

    Args:
        means: float [L], per-layer means in (0, 1).
        stds: float [L], per-layer measured standard deviations.

    Raises:
        ValueError: if the arrays are empty or differ in length.
    """
    if len(means) == 0 or len(means) != len(stds):
        raise ValueError(f"means ({len(means)}) and stds ({len(stds)}) must be non-empty and equally long")

    def loss(log_a: float) -> float:
        a = exp(log_a)
        return float(sum((kumaraswamy_std(m, a) - s) ** 2 for m, s in zip(means, stds)))

    grid = np.linspace(log(A_RANGE[0]), log(A_RANGE[1]), 41)
    best = int(np.argmin([loss(x) for x in grid]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (5**0.5 - 1) / 2
    for _ in range(40):
        x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (lo, x2) if loss(x1) < loss(x2) else (x1, hi)
    return float(exp((lo + hi) / 2))


def _check(df: pd.DataFrame, num_layers: int, working_set_steps: int) -> pd.DataFrame:
    """The warm rows (step >= 1) of a one-budget table; raises ValueError naming what does not fit."""
    missing = [c for c in NEEDED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"selection stats table lacks columns {missing}")
    budgets = sorted(df["budget_tokens"].unique().tolist())
    if len(budgets) != 1:
        raise ValueError(f"selection stats hold budgets {budgets}; fit one: df[df.budget_tokens == b]")
    windows = sorted(df["working_set_steps"].unique().tolist())
    if windows != [working_set_steps]:
        raise ValueError(f"returning blocks were counted with working_set_steps={windows}, not {working_set_steps}")
    layers = sorted(df["layer"].unique().tolist())
    if layers != list(range(num_layers)):
        raise ValueError(f"num_layers={num_layers} but the table has layers {layers[:3]}..{layers[-3:]}")
    warm = df[df["step"] >= 1]
    if warm.empty:
        raise ValueError("selection stats need at least two steps (change is measured from step 1)")
    return warm


def layer_change(df: pd.DataFrame) -> pd.DataFrame:
    """Per layer over warm steps: mean and std (ddof 0) of change_frac, clipped mean, and whether it was clipped."""
    warm = df[df["step"] >= 1]
    g = warm.groupby("layer")["change_frac"]
    out = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0)})
    out["clipped_mean"] = out["mean"].clip(CLIP, 1 - CLIP)
    out["clipped"] = out["clipped_mean"] != out["mean"]
    return out


def returning_frac(df: pd.DataFrame, working_set_steps: int) -> float:
    """Returning / changed-in blocks over steps t >= w (complete history); 0.0 when nothing changed."""
    full = df[df["step"] >= working_set_steps]
    changed = float(full["changed_blocks"].sum())
    return float(full["returning_blocks"].sum()) / changed if changed > 0 else 0.0


def working_set_ratio(df: pd.DataFrame, working_set_steps: int) -> float:
    """Mean over steps t >= w of distinct blocks selected in the last w steps / selected blocks (W / k)."""
    settled = df[df["step"] >= working_set_steps]
    return float((settled["working_set_blocks"] / settled["selected_blocks"].clip(lower=1)).mean())


def fit_recall_stats(
    df: pd.DataFrame, num_layers: int, working_set_steps: int = 12, block_size: int | None = None
) -> dict:
    """Fit the simulator's recall statistics to one budget's selection statistics (module docstring).

    Args:
        df: rows of calibrate.selection_stats.STATS_COLUMNS for one budget_tokens, layers 0..num_layers-1.
        num_layers: L of the measured model (depth of layer l is l / (L - 1)).
        working_set_steps: w; must equal the table's ``working_set_steps``.
        block_size: tokens per block of the measurement; when given, the structure (fresh-block misses, per-layer
            spread, drift, topic shifts; calibrate/selection_structure.py) and the head-wise miss ratio are fitted
            too.

    Returns:
        {"change_mean_by_depth": [[depth, mean], ...] (one knot per layer), "change_shape_a": float,
        "returning_frac": float, "working_set_steps": int, "working_set_ratio": float (measured W / k),
        "headwise_union_ratio": float}, valid for sim.config.RecallStatsSpec.

    Raises:
        ValueError: if the table holds several budgets, other layers, another w, or fewer than two steps.
    """
    _check(df, num_layers, working_set_steps)
    change = layer_change(df)
    if change["clipped"].any():
        clipped = change.index[change["clipped"]].tolist()
        warnings.warn(f"change means of layers {clipped} clipped into [{CLIP}, {1 - CLIP}]", stacklevel=2)
    depth = np.arange(num_layers) / max(num_layers - 1, 1)
    fit_rows = change[~change["clipped"]]
    if fit_rows.empty:  # nothing changes anywhere: the shape is irrelevant, keep the spec default
        a = RecallStatsSpec().change_shape_a
    else:
        a = fit_shape_a(fit_rows["clipped_mean"].to_numpy(), fit_rows["std"].to_numpy())
    stats = {
        "change_mean_by_depth": [[float(d), float(m)] for d, m in zip(depth, change["clipped_mean"])],
        "change_shape_a": a,
        "returning_frac": returning_frac(df, working_set_steps),
        "working_set_steps": int(working_set_steps),
        "working_set_ratio": max(1.0, working_set_ratio(df, working_set_steps)),
        "headwise_union_ratio": max(1.0, float(df[df["step"] >= 1]["union_ratio"].mean())),
    }
    if block_size is not None:
        stats.update(fit_structure(df, block_size, working_set_steps))
        settled = df[df["step"] >= working_set_steps]
        solo, head = float(settled["miss_frac"].mean()), float(settled["headwise_miss_frac"].mean())
        stats["headwise_miss_ratio"] = max(1.0, head / solo) if solo > 0 else 1.0
    RecallStatsSpec.model_validate(stats)
    return stats


def selection_summary(df: pd.DataFrame, num_layers: int) -> dict:
    """Measured figures a profile records beside ``recall_stats`` (one budget).

    Miss fractions and fragments are means over steps t >= w (``working_set_steps``), once the LRU buffer,
    empty at step 0, has had w steps to fill; change and union ratio over t >= 1.

    Returns:
        Plain floats/ints/lists: budget_tokens, buffer_blocks, steps, per_layer_change_frac,
        per_layer_miss_frac, per_layer_headwise_miss_frac, per_layer_union_ratio, per_layer_closed_form_miss_frac
        (sim/step/recall.py's c (1 - rho h) with the fitted means and returning_frac, for comparison with the explicit
        LRU buffer), miss_frac, headwise_miss_frac, closed_form_miss_frac (means over layers), union_ratio
        (mean |U_h S_h| / k), working_set_ratio (mean distinct blocks of the last w steps / k; without it the
        simulator assumes 1 + w m), fragments_per_step_solohead and fragments_per_step_headwise (mean per layer
        and step), clipped_layers.

    Raises:
        ValueError: as `fit_recall_stats` for the budget and layers.
    """
    w = int(df["working_set_steps"].iloc[0])
    warm = _check(df, num_layers, w)
    settled = df[df["step"] >= w]
    change = layer_change(df)
    closed = closed_form_miss(df, change["clipped_mean"].to_numpy(), w)
    by_layer = settled.groupby("layer")
    return {
        "budget_tokens": int(df["budget_tokens"].iloc[0]),
        "buffer_blocks": int(df["buffer_blocks"].iloc[0]),
        "steps": int(df["step"].max() + 1),
        "per_layer_change_frac": _floats(change["mean"]),
        "per_layer_miss_frac": _floats(by_layer["miss_frac"].mean()),
        "per_layer_headwise_miss_frac": _floats(by_layer["headwise_miss_frac"].mean()),
        "per_layer_closed_form_miss_frac": _floats(pd.Series(closed)),
        "per_layer_union_ratio": _floats(warm.groupby("layer")["union_ratio"].mean()),
        "miss_frac": float(settled["miss_frac"].mean()),
        "headwise_miss_frac": float(settled["headwise_miss_frac"].mean()),
        "closed_form_miss_frac": float(np.mean(closed)),
        "union_ratio": float(warm["union_ratio"].mean()),
        "working_set_ratio": working_set_ratio(df, w),
        "fragments_per_step_solohead": float(settled["solohead_fragments"].mean()),
        "fragments_per_step_headwise": float(settled["headwise_fragments"].mean()),
        "clipped_layers": [int(x) for x in change.index[change["clipped"]]],
    }


def closed_form_miss(df: pd.DataFrame, means: np.ndarray, working_set_steps: int) -> np.ndarray:
    """The simulator's expected miss fraction per layer, m_l (1 - rho h), h = clip((B - k) / (k (r - 1)), 0, 1)
    (sim/step/recall.py with a measured working_set_ratio r), rho the table's returning fraction, k its median
    selected blocks."""
    rho = returning_frac(df, working_set_steps)
    k = max(float(df["selected_blocks"].median()), 1.0)
    growth = max(working_set_ratio(df, working_set_steps) - 1.0, 1e-9)  # measured (W − k) / k, as the sim uses it
    hit = np.clip((float(df["buffer_blocks"].iloc[0]) - k) / (k * growth), 0.0, 1.0)
    return means * (1.0 - rho * hit)


def _floats(series: pd.Series) -> list[float]:
    return [round(float(x), 6) for x in series.to_numpy()]
