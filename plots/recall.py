"""Recall volume: GB per decode step (steps.csv) and per layer over time (layer_recall.csv).

Policies that never recall (sglang keeps all KV in HBM) are left out and named in the legend or title.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.style import (
    GB,
    MissingData,
    cdf_points,
    format_gb,
    legend_below,
    new_figure,
    plain_log_ticks,
    policies_in_order,
    policy_styles,
    require_columns,
    runs_to,
)


def recall_per_step(steps: pd.DataFrame) -> Figure:
    """CDF over decode steps of the recalled volume (GB per step), one line per policy that recalls.

    The x axis turns logarithmic when the policies' volumes span more than two decades (steps recalling
    nothing then sit left of the axis; the curve starts at their fraction).
    """
    require_columns(steps, ["policy", "phase", "recall_bytes"], "steps.csv")
    decode = steps[steps["phase"] == "decode"]
    policies = policies_in_order(steps)
    styles = policy_styles(policies)
    totals = decode.groupby("policy", sort=False)["recall_bytes"].sum()
    recalling = [p for p in policies if totals.get(p, 0) > 0]
    if not recalling:
        raise MissingData("no policy recalls KV (recall_bytes is 0 in every decode step)")
    fig, ax = new_figure(height=4.6)
    positive = decode.loc[decode["recall_bytes"] > 0, "recall_bytes"] / GB
    log = positive.max() / positive.quantile(0.01) > 100
    for policy in recalling:
        gb = decode.loc[decode["policy"] == policy, "recall_bytes"].to_numpy(dtype=float) / GB
        x, y = cdf_points(gb)
        label = f"{policy} (mean {format_gb(gb.mean())}, p99 {format_gb(np.percentile(gb, 99))})"
        ax.plot(x, y, label=label, linewidth=1.8, **styles[policy])
    if log:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
    else:
        ax.set_xlim(left=0)
    scale = " (log scale)" if log else ""
    ax.set(xlabel=f"recalled per decode step [GB]{scale}", ylabel="fraction of decode steps", ylim=(0, 1.02))
    ax.set_title("Host\u2192GPU recall volume per decode step")
    ax.grid(True, alpha=0.3)
    idle = [p for p in policies if p not in recalling]
    legend_below(fig, ax, title=f"no recall: {', '.join(idle)}" if idle else None)
    return fig


def layer_recall_heatmap(
    layer_recall: pd.DataFrame, until_s: float | None = None, max_columns: int = 120, bin_s: float | None = None
) -> Figure:
    """Layer x time heatmap of recalled GB per time bin, one panel per recalling policy.

    Every panel shares one colour scale (0 to the largest bin of any policy), so equal colours mean equal
    volumes across policies; each colour bar repeats it beside its panel. A panel is blank after the policy's
    last bin. The recorder spreads each step's bytes over the bins the step spans (sim/metrics/recorder.py).
    The table's bins are merged to at most ``max_columns``; ``until_s`` cuts the time axis, as in the
    time-series figures. ``bin_s``: the table's bin (the scenario's ``run.layer_bin_s``, s); without it, the
    smallest gap between the table's bin starts (1 s when it has one bin).
    """
    require_columns(layer_recall, ["policy", "time_s", "layer", "recall_bytes"], "layer_recall.csv")
    totals = layer_recall.groupby("policy", sort=False)["recall_bytes"].sum()
    recalling = [p for p in policies_in_order(layer_recall) if totals[p] > 0]
    if not recalling:
        raise MissingData("layer_recall.csv has no recalled bytes")
    seen = np.sort(layer_recall["time_s"].unique())
    table_bin_s = bin_s or (float(np.diff(seen).min()) if len(seen) > 1 else 1.0)
    last = seen[-1] + table_bin_s if not until_s else min(seen[-1] + table_bin_s, until_s)
    bin_s = table_bin_s * max(1, int(np.ceil(last / table_bin_s / max_columns)))
    edges = bin_s * np.arange(int(np.ceil(last / bin_s)) + 1)
    num_layers = int(layer_recall["layer"].max()) + 1
    ends = layer_recall.groupby("policy", sort=False)["time_s"].max() + table_bin_s
    fig, axes = new_figure(len(recalling), 1, height=1.0 + 2.0 * len(recalling), sharex=True, squeeze=False)
    grids = {p: _grid(layer_recall[layer_recall["policy"] == p], edges, num_layers) / GB for p in recalling}
    for policy, grid in grids.items():
        grid[:, edges[:-1] >= ends[policy]] = np.nan  # the policy had finished: blank, not zero
    vmax = max(float(np.nanmax(g)) if np.isfinite(g).any() else 0.0 for g in grids.values()) or 1.0
    for ax, policy in zip(axes[:, 0], recalling):
        mesh = ax.pcolormesh(edges, np.arange(num_layers + 1) - 0.5, grids[policy], cmap="viridis", vmin=0, vmax=vmax)
        fig.colorbar(mesh, ax=ax, label=f"GB per {bin_s:g} s", pad=0.01)
        runs_on = " " + runs_to(ends[policy]) if ends[policy] > edges[-1] else ""
        ax.set(ylabel="layer", title=policy + runs_on)
        ax.set_ylim(num_layers - 0.5, -0.5)
    axes[-1, 0].set_xlabel("simulated time [s]")
    idle = [p for p in policies_in_order(layer_recall) if p not in recalling]
    note = f" (no recall: {', '.join(idle)})" if idle else ""
    fig.suptitle(f"Recall volume per layer over time{note}")
    return fig


def _grid(rows: pd.DataFrame, edges: np.ndarray, num_layers: int) -> np.ndarray:
    """(layer, time bin) matrix of summed bytes over regular ``edges`` from 0; rows outside are dropped."""
    grid = np.zeros((num_layers, len(edges) - 1))
    bin_s = edges[1] - edges[0]  # edges start at 0; the nudge keeps 0.3 / 0.1 in bin 3
    col = np.floor(rows["time_s"].to_numpy(dtype=float) / bin_s + 1e-6).astype(int)
    keep = (col >= 0) & (col < grid.shape[1])
    layer, nbytes = rows["layer"].to_numpy(dtype=int), rows["recall_bytes"].to_numpy(dtype=float)
    np.add.at(grid, (layer[keep], col[keep]), nbytes[keep])
    return grid
