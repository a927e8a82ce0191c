"""Validation figure: simulated vs measured decode step times (validation_steps.csv of `pulseinfer validate`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.style import new_figure, policies_in_order, policy_styles, require_columns


def validation_steps(steps: pd.DataFrame) -> Figure:
    """Left: simulated against measured step time per step (the diagonal is exact agreement). Right: both
    over the step index (measured solid markers, simulated line), per policy.

    Args:
        steps: columns policy, step, batch_size, measured_s, simulated_s (seconds).

    Raises:
        MissingData: if a column is missing or there are no rows.
    """
    require_columns(steps, ["policy", "step", "measured_s", "simulated_s"], "validation_steps.csv")
    policies = policies_in_order(steps)
    styles = policy_styles(policies)
    fig, (ax_xy, ax_t) = new_figure(1, 2, width=11.0, height=4.2)
    ms = steps[["measured_s", "simulated_s"]].to_numpy(dtype=float) * 1e3
    lo, hi = float(ms.min()) * 0.9, float(ms.max()) * 1.1
    ax_xy.plot([lo, hi], [lo, hi], color="0.5", linewidth=1, label="simulated = measured")
    for policy in policies:
        rows = steps[steps["policy"] == policy]
        color = styles[policy]["color"]
        meas, sim = rows["measured_s"].to_numpy() * 1e3, rows["simulated_s"].to_numpy() * 1e3
        err = (sim.sum() - meas.sum()) / meas.sum() * 100
        ax_xy.scatter(meas, sim, s=14, color=color, alpha=0.8, label=f"{policy} (total {err:+.1f} %)")
        ax_t.plot(rows["step"], meas, "o", markersize=3, color=color, label=f"{policy} measured")
        ax_t.plot(rows["step"], sim, color=color, linestyle=styles[policy]["linestyle"], label=f"{policy} simulated")
    ax_xy.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step time [ms]", ylabel="simulated step time [ms]")
    ax_xy.set_title("Decode step time: simulator vs engine")
    ax_xy.grid(True, alpha=0.3)
    ax_xy.legend(fontsize=8)
    ax_t.set(xlabel="decode step", ylabel="step time [ms]", ylim=(0, float(np.nanmax(ms)) * 1.1))
    ax_t.set_title("Step time over the run (batch shrinks as requests finish)")
    ax_t.grid(True, alpha=0.3)
    ax_t.legend(fontsize=8)
    return fig
