"""Shared look and helpers: one colour and line style per policy, time bins, CDF points, unit formatting.

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot), so building one never opens a
window or touches global state; saving picks the Agg canvas.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

GB = 1e9  # transfer volumes (matches link bandwidths in GB/s)
GIB = 2**30  # memory capacities (matches hbm_gib)

# Fixed mapping so a policy keeps its colour in every figure; baselines dashed so identical curves stay visible.
KNOWN_POLICIES = {
    "sglang": ("tab:blue", "--"),
    "headwise": ("tab:orange", "-."),
    "full_offload": ("tab:purple", ":"),
    "pulseinfer": ("tab:red", "-"),
}
# Sparser line styles draw on top, so two policies on the same values (both at 100 % link use) both show.
LINE_ZORDER = {":": 2.4, "-.": 2.3, "--": 2.2, "-": 2.1}
OTHER_COLOURS = ["tab:green", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"]


class MissingData(ValueError):
    """A figure cannot be drawn from these tables (missing column, no rows to draw); the message says why."""


def policy_styles(policies: Iterable[str]) -> dict[str, dict]:
    """``{policy: {"color", "linestyle", "zorder"}}`` (plot kwargs): known policies fixed, others take the next
    free colour in order."""
    styles: dict[str, dict] = {}
    others = iter(OTHER_COLOURS * 4)
    for name in dict.fromkeys(policies):
        color, linestyle = KNOWN_POLICIES.get(name) or (next(others), "-")
        styles[name] = {"color": color, "linestyle": linestyle, "zorder": LINE_ZORDER[linestyle]}
    return styles


def policies_in_order(df: pd.DataFrame) -> list[str]:
    """Policy names in the order the table lists them (scenario order)."""
    return list(dict.fromkeys(df["policy"]))


def require_columns(df: pd.DataFrame, columns: Sequence[str], table: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MissingData(f"{table} lacks column(s) {', '.join(missing)}")
    if df.empty:
        raise MissingData(f"{table} has no rows")


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 7.0, height: float = 4.0, **kw) -> tuple:
    """A constrained-layout Figure and its axes (squeezed like ``plt.subplots``)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, **{"squeeze": True, **kw})
    return fig, axes


def nice_step(span: float, target_bins: int = 100) -> float:
    """Smallest 1-2-5 x 10^k width giving at most ``target_bins`` bins over ``span``."""
    raw = max(span, 1e-9) / target_bins
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def cdf_points(values: np.ndarray, max_points: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """(sorted values, cumulative fraction), thinned to ``max_points`` quantiles so SVGs stay small."""
    x = np.sort(np.asarray(values, dtype=float))
    y = np.arange(1, len(x) + 1) / len(x)
    if len(x) > max_points:
        idx = np.unique(np.linspace(0, len(x) - 1, max_points).round().astype(int))
        x, y = x[idx], y[idx]
    return x, y


def format_seconds(s: float) -> str:
    """Short human duration: ``14.5 ms``, ``2.31 s``, ``3.5 min``."""
    if not np.isfinite(s):
        return "n/a"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    return f"{s / 60:.3g} min"


def plain_log_ticks(axis) -> None:
    """Log-axis tick labels as plain numbers (0.01, 1, 100) instead of powers of ten."""
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))


def legend_below(fig: Figure, ax, title: str | None = None) -> None:
    """One legend under the axes (never over a line): short labels in one row, long ones in two columns."""
    handles, labels = ax.get_legend_handles_labels()
    ncols = len(labels) if max(map(len, labels)) <= 24 else 2
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, title=title, title_fontsize=8)


def format_gb(gb: float) -> str:
    return f"{gb:.3g} GB"


def runs_to(end_s: float) -> str:
    """``(runs to 70,000 s)``: three significant figures, so every figure rounds a policy's end alike."""
    return f"(runs to {float(f'{end_s:.3g}'):,.0f} s)"
