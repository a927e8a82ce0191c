"""Ablation bars: decode throughput per policy (summary.csv of an ablation run), ratio to the first bar."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.style import new_figure, policy_styles, require_columns


def ablation_bars(summary: pd.DataFrame) -> Figure:
    """One bar per policy in scenario (row) order, annotated with its ratio to the first bar."""
    require_columns(summary, ["policy", "decode_tokens_per_s"], "summary.csv")
    policies = list(summary["policy"])
    values = summary["decode_tokens_per_s"].to_numpy(dtype=float)
    styles = policy_styles(policies)
    fig, ax = new_figure(width=max(5.0, 1.1 * len(policies) + 2.5))
    for i, (policy, value) in enumerate(zip(policies, values)):
        bars = ax.bar(i, value, color=styles[policy]["color"], label=policy, width=0.7)
        ratio = value / values[0] if values[0] > 0 else float("nan")
        ax.bar_label(bars, labels=[f"{ratio:.2f}\u00d7"], padding=2, fontsize=9)
    ax.set_xticks(
        range(len(policies)),
        policies,
        rotation=20 if len(policies) > 4 else 0,
        ha="right" if len(policies) > 4 else "center",
    )
    ax.set(ylabel="decode throughput [tokens/s]", xlabel="policy")
    top = float(np.nanmax(values)) if np.isfinite(values).any() else 0.0  # NaN: a run that issued nothing
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.set_title(f"Decode throughput by policy (ratio to {policies[0]})")
    ax.grid(True, axis="y", alpha=0.3)
    return fig
