"""Layer-pipeline Gantt for one decode step: compute and transfer intervals per layer (timeline.csv).

One panel per policy. Each layer row holds its transfer bars (upper half) and its compute bar (lower half);
pre-empted transfer pieces are hatched. Time is in ms from the step's first interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from plots.style import MissingData, format_seconds, new_figure, policies_in_order, require_columns

TIMELINE_COLUMNS = ["policy", "step_id", "layer", "kind", "start_s", "end_s", "preempted"]
KIND_STYLE = {
    "transfer": {"color": "tab:orange", "offset": -0.2},
    "compute": {"color": "tab:blue", "offset": 0.2},
}


def layer_pipeline_gantt(timeline: pd.DataFrame, step_id: int | None = None) -> Figure:
    """Gantt of step ``step_id`` per policy (default: the policy's median-length step that has transfers)."""
    require_columns(timeline, TIMELINE_COLUMNS, "timeline.csv")
    policies = policies_in_order(timeline)
    height = max(4.0, 1.6 + 0.1 * (int(timeline["layer"].max()) + 1))  # about 0.1 in per layer row
    fig, axes = new_figure(1, len(policies), width=max(6.0, 3.6 * len(policies) + 1.0), height=height, squeeze=False)
    for ax, policy in zip(axes[0], policies):
        rows = timeline[timeline["policy"] == policy]
        step = step_id if step_id is not None else _typical_step(rows)
        _draw_step(ax, rows[rows["step_id"] == step], f"{policy}, step {step}")
    axes[0][0].set_ylabel("layer")
    handles = [Patch(color=s["color"], label=k) for k, s in KIND_STYLE.items()]
    handles.append(Patch(facecolor="white", edgecolor="tab:red", hatch="///", label="pre-empted transfer"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=9)
    fig.suptitle("Layer pipeline of one decode step")
    return fig


def _typical_step(rows: pd.DataFrame) -> int:
    """The step whose span is the median among steps with transfers (all steps when none has one)."""
    with_transfer = rows.loc[rows["kind"] == "transfer", "step_id"].unique()
    pool = rows[rows["step_id"].isin(with_transfer)] if len(with_transfer) else rows
    spans = pool.groupby("step_id").agg(start=("start_s", "min"), end=("end_s", "max"))
    spans = (spans["end"] - spans["start"]).sort_values(kind="stable")
    return int(spans.index[(len(spans) - 1) // 2])


def _draw_step(ax, rows: pd.DataFrame, title: str) -> None:
    if rows.empty:
        raise MissingData(f"timeline.csv has no intervals for {title}")
    t0 = rows["start_s"].min()
    preempted = rows["preempted"].astype(str).str.lower().isin(["true", "1"])
    for kind, style in KIND_STYLE.items():
        part = rows[(rows["kind"] == kind) & ~preempted]
        _bars(ax, part, t0, style["offset"], color=style["color"], label=kind)
    cut = rows[preempted]
    if not cut.empty:
        _bars(ax, cut, t0, KIND_STYLE["transfer"]["offset"], facecolor="white", edgecolor="tab:red", hatch="///")
    busy_s = (rows["end_s"] - rows["start_s"]).groupby(rows["kind"]).sum()
    busy = ", ".join(f"{kind} {format_seconds(busy_s.get(kind, 0.0))}" for kind in KIND_STYLE)
    note = f"step {format_seconds(rows['end_s'].max() - t0)}\nbusy: {busy}"
    ax.text(0.98, 0.98, note, transform=ax.transAxes, ha="right", va="top", fontsize=8)
    num_layers = int(rows["layer"].max()) + 1
    ax.set_ylim(num_layers - 0.5, -0.5)
    ax.set_xlim(left=0)
    ax.set(xlabel="time since step start [ms]", title=title)
    ax.grid(True, axis="x", alpha=0.3)


def _bars(ax, part: pd.DataFrame, t0: float, offset: float, **style) -> None:
    left = (part["start_s"].to_numpy(dtype=float) - t0) * 1e3
    width = np.maximum((part["end_s"] - part["start_s"]).to_numpy(dtype=float) * 1e3, 1e-6)
    ax.barh(part["layer"].to_numpy(dtype=float) + offset, width, left=left, height=0.4, **style)
