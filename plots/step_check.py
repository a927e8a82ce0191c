"""Step-time check figure: the simulator's time for each iteration a real engine recorded, against its wall time
(calibrate/step_check.py ``step_check``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.style import new_figure, require_columns

# One colour and marker per iteration kind, in the order step_check lists them.
KIND_STYLES = {
    "decode_only": {"color": "tab:blue", "marker": "o", "label": "decode-only"},
    "mixed": {"color": "tab:orange", "marker": "s", "label": "mixed prefill + decode"},
    "prefill_only": {"color": "tab:green", "marker": "^", "label": "prefill-only"},
}


def step_check_figure(table: pd.DataFrame) -> Figure:
    """Left: simulated against measured time per iteration on log-log axes, one colour per kind (decode-only, mixed,
    prefill-only), the diagonal exact agreement. Right: histogram of the per-iteration error, per kind.

    Args:
        table: the ``step_check`` table: columns kind, measured_s, simulated_s (seconds), error_pct (percent).

    Raises:
        MissingData: if a column is missing or no iteration has a finite positive time.
    """
    require_columns(table, ["kind", "measured_s", "simulated_s", "error_pct"], "step_check table")
    times = table[["measured_s", "simulated_s"]].to_numpy(dtype=float)
    ok = np.isfinite(times).all(axis=1) & (times > 0).all(axis=1) & np.isfinite(table["error_pct"].to_numpy(float))
    rows = table[ok]
    require_columns(rows, ["measured_s"], "step_check table (iterations with finite positive times)")
    fig, (ax_xy, ax_hist) = new_figure(1, 2, width=11.0, height=4.4)
    ms = rows[["measured_s", "simulated_s"]].to_numpy(dtype=float) * 1e3
    lo, hi = float(ms.min()) / 1.5, float(ms.max()) * 1.5
    ax_xy.plot([lo, hi], [lo, hi], color="0.5", linewidth=1, label="simulated = measured")
    kinds = [k for k in KIND_STYLES if (rows["kind"] == k).any()]
    errors = rows["error_pct"].to_numpy(dtype=float)
    edges = np.histogram_bin_edges(errors, bins=min(40, max(5, int(np.sqrt(len(errors))) + 1)))
    for kind in kinds:
        part = rows[rows["kind"] == kind]
        style = KIND_STYLES[kind]
        err = part["error_pct"].to_numpy(dtype=float)
        label = f"{style['label']} (n={len(part)}, MAPE {np.mean(np.abs(err)):.1f} %)"
        ax_xy.scatter(
            part["measured_s"] * 1e3, part["simulated_s"] * 1e3, s=14, alpha=0.75, color=style["color"],
            marker=style["marker"], label=label,
        )  # fmt: skip
        median = f"{style['label']} (median {np.median(err):+.1f} %)"
        ax_hist.hist(err, bins=edges, alpha=0.55, color=style["color"], label=median)
    ax_xy.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
    ax_xy.set(xlabel="measured iteration time [ms]", ylabel="simulated iteration time [ms]")
    ax_xy.set_title("Per-iteration time: simulator vs engine")
    ax_xy.grid(True, which="both", alpha=0.25)
    ax_xy.legend(fontsize=8, loc="upper left")
    ax_hist.axvline(0.0, color="0.4", linewidth=1)
    ax_hist.set(xlabel="error [%] = (simulated − measured) / measured", ylabel="iterations")
    ax_hist.set_title("Error per iteration")
    ax_hist.grid(True, alpha=0.3)
    ax_hist.legend(fontsize=8)
    return fig


__all__ = ["KIND_STYLES", "step_check_figure"]
