"""Search figure: how an Optuna search over a policy's knobs went (trials.csv of `pulseinfer search`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from plots.style import MissingData, new_figure, require_columns


def search_trials(trials: pd.DataFrame, tpot_p99_bound_s: float | None = None) -> Figure:
    """Left: each trial's goodput in trial order (feasible trials filled, the others hollow) and the best feasible
    goodput so far. Right: decode tokens/s against p99 TPOT per trial, the TPOT bound as a vertical line.

    Args:
        trials: trials.csv (study/search_results.py): trial, feasible (bool), goodput_requests_per_s (req/s),
            decode_tokens_per_s (tok/s), tpot_p99_s (s); failed trials (NaN metrics) are left out.
        tpot_p99_bound_s: the SLO's p99 TPOT bound (s), or None.

    Raises:
        MissingData: a column is missing or no trial has metrics.
    """
    require_columns(trials, ["trial", "feasible", "goodput_requests_per_s", "decode_tokens_per_s", "tpot_p99_s"],
                    "trials.csv")  # fmt: skip
    done = trials.dropna(subset=["goodput_requests_per_s", "tpot_p99_s"]).sort_values("trial")
    if done.empty:
        raise MissingData("trials.csv: no trial finished with metrics")
    feasible = done["feasible"].astype(str).str.lower().eq("true").to_numpy()
    fig, (ax_g, ax_t) = new_figure(1, 2, width=11.0, height=4.0)
    trial, goodput = done["trial"].to_numpy(), done["goodput_requests_per_s"].to_numpy(dtype=float)
    ax_g.scatter(trial[feasible], goodput[feasible], color="tab:red", s=22, label="feasible (meets the SLO)")
    ax_g.scatter(trial[~feasible], goodput[~feasible], facecolors="none", edgecolors="tab:gray", s=22,
                 label="infeasible")  # fmt: skip
    best = np.maximum.accumulate(np.where(feasible, goodput, -np.inf))
    shown = np.isfinite(best)
    if shown.any():
        ax_g.step(trial[shown], best[shown], where="post", color="black", linewidth=1.2, label="best feasible so far")
    ax_g.set(xlabel="trial", ylabel="goodput [req/s within the SLO]", title="Goodput per trial")
    ax_g.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are numbered 0, 1, ...
    ax_g.grid(True, alpha=0.3)
    ax_g.legend(fontsize=8)
    tpot_ms = done["tpot_p99_s"].to_numpy(dtype=float) * 1e3
    tokens = done["decode_tokens_per_s"].to_numpy(dtype=float)
    ax_t.scatter(tpot_ms[feasible], tokens[feasible], color="tab:red", s=22, label="feasible")
    ax_t.scatter(tpot_ms[~feasible], tokens[~feasible], facecolors="none", edgecolors="tab:gray", s=22,
                 label="infeasible")  # fmt: skip
    if tpot_p99_bound_s is not None:
        ax_t.axvline(tpot_p99_bound_s * 1e3, color="0.3", linestyle="--", linewidth=1,
                     label=f"TPOT p99 bound {tpot_p99_bound_s * 1e3:g} ms")  # fmt: skip
    ax_t.set(xlabel="TPOT p99 [ms]", ylabel="decode tokens/s", title="Throughput against tail TPOT, per trial")
    ax_t.grid(True, alpha=0.3)
    ax_t.legend(fontsize=8)
    return fig
