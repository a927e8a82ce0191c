"""Sweep comparison: a heatmap of policy A / policy B over two grid keys, with the SLO boundaries drawn.

Input: the comparison table ``pulseinfer sweep --compare A/B`` writes (``compare.csv``): one row per grid cell
with the two grid keys (and optionally a panel key), ``ratio`` (A's metric / B's, means over seeds) and
``a_slo_met_frac`` / ``b_slo_met_frac`` (fraction of seeds meeting the SLO).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from plots.style import require_columns

MAX_LOG2 = 3.0  # colours saturate at 8x either way
LOSS_FRAC = 0.01  # a cell is hatched ("A loses") when A is more than 1 % below B


def sweep_ratio_heatmap(
    compare: pd.DataFrame,
    x_key: str,
    y_key: str,
    a: str,
    b: str,
    metric: str,
    panel_key: str | None = None,
) -> Figure:
    """Cells coloured by log2(A / B) (green: A higher, red: A lower; hatched where A is more than :data:`LOSS_FRAC`
    below B), the ratio written in each cell; a
    solid black edge where A starts or stops meeting the SLO (at least half of the seeds), a dashed blue one for B.

    Args:
        compare: rows with ``x_key``, ``y_key`` (, ``panel_key``), ``ratio``, ``a_slo_met_frac``,
            ``b_slo_met_frac``; grid values in sweep order (the order rows first list them).
        metric: label of the compared metric (e.g. ``goodput_requests_per_s``).

    Raises:
        MissingData: a column is missing or the table is empty.
    """
    keys = [x_key, y_key] + ([panel_key] if panel_key else [])
    require_columns(compare, [*keys, "ratio", "a_slo_met_frac", "b_slo_met_frac"], "compare.csv")
    panels = list(dict.fromkeys(compare[panel_key])) if panel_key else [None]
    xs, ys = list(dict.fromkeys(compare[x_key])), list(dict.fromkeys(compare[y_key]))
    width = max(7.0, 2.4 + 0.9 * len(xs) * len(panels))
    fig = Figure(figsize=(width, 2.0 + 0.55 * len(ys)), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    norm = TwoSlopeNorm(vmin=-MAX_LOG2, vcenter=0.0, vmax=MAX_LOG2)
    mesh = None
    for ax, panel in zip(axes, panels):
        rows = compare if panel is None else compare[compare[panel_key] == panel]
        grid = rows.set_index([y_key, x_key])
        ratio = _cells(grid, "ratio", ys, xs)
        mesh = _draw_cells(ax, ratio, norm)
        for col, style in (("a_slo_met_frac", "-"), ("b_slo_met_frac", "--")):
            _draw_boundary(ax, _cells(grid, col, ys, xs) >= 0.5, style)
        ax.set_xticks(range(len(xs)), [_label(v) for v in xs])
        ax.set_yticks(range(len(ys)), [_label(v) for v in ys])
        ax.set_xlabel(x_key)
        ax.set_title(f"{panel_key}={panel}" if panel_key else f"{a} / {b}: {metric}", fontsize=10)
    axes[0].set_ylabel(y_key)
    if panel_key:
        fig.suptitle(f"{a} / {b}: {metric}", fontsize=11)
    fig.colorbar(mesh, ax=list(axes), label=f"log2({a} / {b})", shrink=0.9)
    handles = [
        Line2D([], [], color="black", linewidth=2.4, label=f"edge of {a}'s SLO region"),
        Line2D([], [], color="tab:blue", linewidth=1.6, linestyle="--", label=f"edge of {b}'s SLO region"),
        Patch(facecolor="white", edgecolor="0.4", hatch="///", label=f"{a} more than {LOSS_FRAC:.0%} below {b}"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    return fig


def _cells(grid: pd.DataFrame, column: str, ys: list, xs: list) -> np.ndarray:
    """[len(ys), len(xs)] float array of ``column``; NaN for a missing cell."""
    out = np.full((len(ys), len(xs)), np.nan)
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            if (y, x) in grid.index:
                out[i, j] = float(grid.loc[(y, x), column])
    return out


def _draw_cells(ax, ratio: np.ndarray, norm: TwoSlopeNorm):
    """Colour, hatch (ratio below 1 - LOSS_FRAC) and label each cell; NaN cells stay grey."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log2 = np.clip(np.log2(ratio), -MAX_LOG2, MAX_LOG2)
    mesh = ax.pcolormesh(
        np.arange(ratio.shape[1] + 1) - 0.5,
        np.arange(ratio.shape[0] + 1) - 0.5,
        np.ma.masked_invalid(log2),
        cmap="RdYlGn",
        norm=norm,
    )
    ax.set_facecolor("0.85")
    for (i, j), r in np.ndenumerate(ratio):
        if r < 1 - LOSS_FRAC:
            ax.add_patch(_hatch(j, i))
        ax.text(j, i, _ratio_text(r), ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.5, ratio.shape[1] - 0.5)
    ax.set_ylim(-0.5, ratio.shape[0] - 0.5)
    return mesh


def _hatch(j: int, i: int):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.35", linewidth=0)


def _draw_boundary(ax, met: np.ndarray, linestyle: str) -> None:
    """Lines on the cell edges between a cell that meets the SLO and a neighbour that does not."""
    rows, cols = met.shape
    width, color = (2.4, "black") if linestyle == "-" else (1.6, "tab:blue")
    for i in range(rows):
        for j in range(cols):
            if j + 1 < cols and met[i, j] != met[i, j + 1]:
                ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], color=color, linestyle=linestyle, linewidth=width)
            if i + 1 < rows and met[i, j] != met[i + 1, j]:
                ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], color=color, linestyle=linestyle, linewidth=width)


def _ratio_text(r: float) -> str:
    if math.isnan(r):
        return "n/a"
    if math.isinf(r):
        return "∞"
    return f"{r:.2f}" if r < 10 else f"{r:.0f}"


def _label(value) -> str:
    """Compact tick labels: 131072 → 128K, 0.5 → 0.5."""
    if isinstance(value, int | np.integer) and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}K"
    return f"{value:g}" if isinstance(value, float) else str(value)
