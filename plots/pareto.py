"""The serving Pareto figure: decode tokens/s per GPU against tokens/s per user, as public serving benchmarks plot it
(InferenceX, NVIDIA AIPerf), with the TPOT SLO and, where prices are given, $ per million output tokens.

Input: one row per simulated (configuration, load), as ``pulseinfer plan`` writes them (``plan_points.csv``) or
``pulseinfer sweep`` averages them over seeds (``sweep.csv``):

* ``decode_tokens_per_s`` (the replica's or fleet's output rate), ``gpus`` (GPUs billed for it), ``tpot_mean_s``;
* ``meets_slo`` (bool): the run met the SLO;
* optional ``usd_per_million_output_tokens`` (the $/Mtok panel), the configuration's columns (``label_columns``)
  and a load column (``order_column``, e.g. ``rate_per_s``) along which one configuration's points are joined.

x = tokens/s per user = 1 / mean TPOT (interactivity as InferenceX defines it: the tokens per second one user
sees); y = ``decode_tokens_per_s / gpus``. The Pareto front is taken over the points that meet the SLO (what a
planner can buy): a point is on it when no SLO-meeting point is at least as good on both axes and better on one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from plots.style import MissingData, new_figure, plain_log_ticks, policy_styles, require_columns

REQUIRED = ["decode_tokens_per_s", "gpus", "tpot_mean_s", "meets_slo"]
PRICE = "usd_per_million_output_tokens"
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<"]
OTHER_COLOURS = ["tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:pink",
                 "tab:olive", "tab:cyan", "tab:gray"]  # fmt: skip
LOG_SPAN = 10.0  # an axis whose values span more than this factor is drawn log-scaled


def pareto_front(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """Indices of the Pareto front of points (x[i], y[i]) where higher is better on both axes, sorted by x (ties by
    index).

    Point j dominates point i when ``x[j] >= x[i]`` and ``y[j] >= y[i]`` with at least one of the two strictly
    greater; the front is the points no other point dominates. Equal points do not dominate each other, so every
    copy of a front point is kept. Points with a NaN or infinite coordinate are never on the front and dominate
    nothing. To minimise a quantity (a cost), pass its negative.

    Raises:
        ValueError: x and y differ in length.
    """
    xs, ys = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if xs.shape != ys.shape:
        raise ValueError(f"x and y differ in length: {xs.size} and {ys.size}")
    ok = np.flatnonzero(np.isfinite(xs) & np.isfinite(ys))
    order = ok[np.lexsort((-ys[ok], -xs[ok]))]  # x descending, then y descending
    front: list[int] = []
    best = -math.inf  # the highest y among the points of strictly greater x
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and xs[order[end]] == xs[order[start]]:
            end += 1
        group = order[start:end]  # equal x; the first has the group's highest y
        top = ys[group[0]]
        if top > best:  # not dominated by a point of greater x, nor by one of its own x
            front.extend(int(i) for i in group if ys[i] == top)
            best = top
        start = end
    return np.array(sorted(front, key=lambda i: (xs[i], i)), dtype=int)


def pareto_figure(
    points: pd.DataFrame,
    slo_tpot_s: float | None = None,
    label_columns: Sequence[str] = ("hardware", "policy", "tp_size", "engine"),
    order_column: str | None = "rate_per_s",
    title: str | None = None,
    met_text: str = "meets the SLO",
) -> Figure:
    """Decode tokens/s per GPU (y) against tokens/s per user (x), one colour/marker per configuration, with the
    TPOT SLO, the Pareto front of the SLO-meeting points and, when any point is priced, a $/Mtok panel below.

    Args:
        points: one row per (configuration, load); see the module docstring for the columns.
        slo_tpot_s: the TPOT p99 bound [s], drawn at x = 1 / bound; None: no line.
        label_columns: the columns that make a configuration (those present); the legend names the ones that vary.
            A policy keeps its colour and line style (plots/style.py); the other columns pick the marker.
        order_column: the load column along which one configuration's points are joined (ascending); None or
            absent: points are not joined.
        title: the figure title (default: the number of configurations).
        met_text: what a filled point did, for the legend (e.g. ``meets the SLO in a steady-state run``).

    Raises:
        MissingData: a required column is missing, or no row has a finite x and y.
    """
    require_columns(points, REQUIRED, "points")
    df = _with_axes(points)
    if df.empty:
        raise MissingData("points has no row with a finite TPOT, decode tokens/s and GPUs")
    labels = [c for c in label_columns if c in df.columns]
    blank = [df[c].astype(object).where(df[c].notna(), "") for c in labels]  # NaN never equals itself
    df["_config"] = list(zip(*blank)) if labels else [()] * len(df)
    configs = list(dict.fromkeys(df["_config"]))
    styles = _config_styles(configs, labels)
    priced = PRICE in df.columns and bool(np.isfinite(df[PRICE].to_numpy(dtype=float)).any())
    fig, axes = new_figure(2 if priced else 1, 1, width=8.5, height=9.5 if priced else 6.0, sharex=True)
    axes = list(np.atleast_1d(axes))
    order = order_column if order_column in df.columns else None
    y_panels = [("_per_gpu", "decode tokens/s per GPU [tok/s/GPU]\n(higher is better)", 1)]
    if priced:
        y_panels.append((PRICE, "$ per million output tokens\n(lower is better)", -1))
    fronts = []
    for ax, (column, ylabel, sign) in zip(axes, y_panels):
        panel = df[np.isfinite(df[column].to_numpy(dtype=float))]
        for config in configs:
            _draw_config(ax, panel[panel["_config"] == config], column, order, styles[config])
        fronts.append(_draw_front(ax, panel, column, sign))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if sign < 0:  # a cost: log (it grows as 1 / load, so a nearly idle probe costs 100x)
            _scale(ax, "y", panel[column], force_log=True)
        else:  # throughput per GPU: linear from 0, as the public benchmarks draw it
            ax.set_ylim(bottom=0)
    _scale(axes[-1], "x", df["_per_user"])
    if slo_tpot_s:
        _draw_slo(axes, 1.0 / slo_tpot_s)
    if order is not None:  # once the limits are final
        _label_loads(axes[0], fronts[0], "_per_gpu", order)
    axes[-1].set_xlabel("tokens/s per user = 1 / mean TPOT [tok/s]  (interactivity; higher is better)")
    fig.suptitle(title or f"{len(configs)} configuration{'s' if len(configs) != 1 else ''}", fontsize=11)
    _legend(fig, configs, styles, labels, df, slo_tpot_s, priced, met_text)
    return fig


def _with_axes(points: pd.DataFrame) -> pd.DataFrame:
    """The rows with a finite x (``_per_user``) and y (``_per_gpu``), those two columns added."""
    df = points.copy()
    tpot = df["tpot_mean_s"].to_numpy(dtype=float)
    gpus = df["gpus"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        df["_per_user"] = 1.0 / tpot
        df["_per_gpu"] = df["decode_tokens_per_s"].to_numpy(dtype=float) / gpus
    if PRICE in df.columns:
        df[PRICE] = pd.to_numeric(df[PRICE], errors="coerce").astype(float)
    df["meets_slo"] = df["meets_slo"].map(_truthy)
    keep = np.isfinite(df["_per_user"]) & np.isfinite(df["_per_gpu"]) & (tpot > 0) & (gpus > 0)
    return df[keep].reset_index(drop=True)


def _truthy(value) -> bool:
    """``meets_slo`` as read back from a CSV (bool, 0/1, 'True'/'False') or a fraction of seeds (>= 0.5)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    try:
        return float(value) >= 0.5  # NaN compares False
    except (TypeError, ValueError):
        return False


def _config_styles(configs: list[tuple], labels: list[str]) -> dict[tuple, dict]:
    """Per configuration: colour and line style (its policy's where ``policy`` is a label column, else one colour
    each), marker (the other label columns' values, in order), and its legend text (the varying columns)."""
    policy_at = labels.index("policy") if "policy" in labels else None
    if policy_at is not None:
        by_policy = policy_styles(c[policy_at] for c in configs)
    rests = list(dict.fromkeys(_rest(c, policy_at) for c in configs))
    varying = [i for i in range(len(labels)) if len({c[i] for c in configs}) > 1] or list(range(len(labels)))
    styles = {}
    for k, config in enumerate(configs):
        if policy_at is not None:
            colour, linestyle = by_policy[config[policy_at]]["color"], by_policy[config[policy_at]]["linestyle"]
        else:
            colour, linestyle = OTHER_COLOURS[k % len(OTHER_COLOURS)], "-"
        parts = [_value_text(labels[i], config[i]) for i in varying]
        styles[config] = {
            "color": colour,
            "linestyle": linestyle,
            "marker": MARKERS[rests.index(_rest(config, policy_at)) % len(MARKERS)],
            "label": " · ".join(p for p in parts if p) or "all points",
        }
    return styles


def _rest(config: tuple, policy_at: int | None) -> tuple:
    return tuple(v for i, v in enumerate(config) if i != policy_at)


def _value_text(column: str, value) -> str:
    """``TP2`` for tp_size, the value for names (hardware, policy, engine), else ``key=value`` (last dotted part)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return ""
    if column == "tp_size":
        return f"TP{int(value)}"
    if column in ("hardware", "policy", "engine"):
        return str(value)
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{column.rsplit('.', 1)[-1]}={text}"


def _draw_config(ax, rows: pd.DataFrame, column: str, order: str | None, style: dict) -> None:
    """One configuration: its points joined in load order, filled where they meet the SLO, hollow where not."""
    if rows.empty:
        return
    if order is not None:
        rows = rows.sort_values(order, kind="stable")
        ax.plot(rows["_per_user"], rows[column], color=style["color"], linestyle=style["linestyle"],
                linewidth=1.1, alpha=0.7, zorder=2)  # fmt: skip
    for met, face in ((True, style["color"]), (False, "white")):
        sel = rows[rows["meets_slo"] == met]
        ax.scatter(sel["_per_user"], sel[column], marker=style["marker"], s=38, facecolors=face,
                   edgecolors=style["color"], linewidths=1.3, zorder=3)  # fmt: skip


def _draw_front(ax, panel: pd.DataFrame, column: str, sign: int) -> pd.DataFrame:
    """The Pareto front of the SLO-meeting points: a step line (the best y at that interactivity or more) and
    rings around its points; ``sign`` -1 for a cost (lower is better). Returns the front's rows."""
    met = panel[panel["meets_slo"]]
    if met.empty:
        return met
    idx = pareto_front(met["_per_user"].to_numpy(), sign * met[column].to_numpy(dtype=float))
    front = met.iloc[idx]
    ax.step(front["_per_user"], front[column], where="pre", color="black", linewidth=1.6, alpha=0.8, zorder=2.5)
    ax.scatter(front["_per_user"], front[column], s=150, facecolors="none", edgecolors="black", linewidths=1.4,
               zorder=4)  # fmt: skip
    return front


def _label_loads(ax, front: pd.DataFrame, column: str, order: str) -> None:
    """Label the front's points with their load, from the highest throughput down, leaving out a label that would
    overlap one already placed (roughly: within 55 x 12 pixels)."""
    placed: list[np.ndarray] = []
    x_mid = np.mean(ax.transAxes.transform([(0, 0), (1, 0)])[:, 0])
    for _, row in front.sort_values(column, ascending=False).iterrows():
        at = ax.transData.transform((row["_per_user"], row[column]))
        if any(abs(at[0] - p[0]) < 55 and abs(at[1] - p[1]) < 12 for p in placed):
            continue
        placed.append(at)
        right = at[0] > x_mid  # the label on the inner side, so it stays inside the axes
        ax.annotate(
            _load_text(order, row[order]),
            (row["_per_user"], row[column]),
            xytext=(-9 if right else 9, 7),
            textcoords="offset points",
            ha="right" if right else "left",
            fontsize=7,
            color="0.15",
            zorder=5,
        )


def _load_text(column: str, value) -> str:
    """A front point's load: ``4.25 req/s`` for a request rate, else ``key=value``."""
    if column.endswith("session_rate_per_s"):
        return f"{float(value):.3g} sessions/s"
    if column.endswith("rate_per_s"):
        return f"{float(value):.3g} req/s"
    return _value_text(column, value)


def slo_text(bounds: dict[str, float]) -> str:
    """A title's SLO from its bounds in seconds (``TailSlo.bounds()``): ``tpot_p99 50 ms, ttft_p99 10 s``, or
    ``none``."""
    parts = []
    for column, bound in bounds.items():
        name = column.removesuffix("_s")
        parts.append(f"{name} {bound * 1e3:g} ms" if name.startswith("tpot") else f"{name} {bound:g} s")
    return ", ".join(parts) or "none"


def _draw_slo(axes: list, line: float) -> None:
    """The TPOT p99 bound at x = ``line`` = 1 / bound, kept in view; the region left of it (mean TPOT above the
    bound) shaded."""
    lo, hi = axes[-1].get_xlim()
    if axes[-1].get_xscale() == "log":
        lo, hi = min(lo, line / 1.1), max(hi, line * 1.1) * 1.05
    else:  # a margin on both sides, so the rightmost points (the front's end) are not cut by the frame
        pad = 0.04 * (max(hi, line) - min(lo, line))
        lo, hi = min(lo, line - pad), max(hi, line + pad) + pad
    for ax in axes:
        ax.axvline(line, color="0.25", linestyle=(0, (4, 2)), linewidth=1.3, zorder=1.5)
        if line > lo:
            ax.axvspan(lo, line, color="0.5", alpha=0.12, zorder=0, linewidth=0)
    axes[-1].set_xlim(lo, hi)


def _scale(ax, axis: str, values: pd.Series, force_log: bool = False) -> None:
    """Log scale where the values span more than :data:`LOG_SPAN` (or ``force_log``), with plain tick labels; else
    linear."""
    v = values.to_numpy(dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and (force_log or v.max() / v.min() > LOG_SPAN):
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        target = ax.xaxis if axis == "x" else ax.yaxis
        plain_log_ticks(target)
        if v.max() / v.min() < LOG_SPAN:  # within a decade the labelled ticks are minor ones: plain numbers too
            target.set_minor_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))


def _legend(fig: Figure, configs, styles, labels, df, slo_tpot_s, priced, met_text: str) -> None:
    """Configurations first, then how to read the marks (filled/hollow, front, SLO line), under the axes."""
    handles = [
        Line2D([], [], color=styles[c]["color"], linestyle=styles[c]["linestyle"], marker=styles[c]["marker"],
               markersize=7, label=styles[c]["label"])
        for c in configs
    ]  # fmt: skip
    handles += [
        Line2D([], [], linestyle="", marker="o", color="0.3", markersize=7, label=f"filled: {met_text}"),
        Line2D([], [], linestyle="", marker="o", color="0.3", markerfacecolor="white", markersize=7,
               label="hollow: does not"),
    ]  # fmt: skip
    if df["meets_slo"].any():
        front = "Pareto front of the SLO-meeting points" + (" (each panel its own)" if priced else "")
        handles.append(Line2D([], [], color="black", marker="o", markerfacecolor="none", markersize=11, label=front))
    else:
        handles.append(Line2D([], [], linestyle="", label="no point meets the SLO: no Pareto front"))
    if slo_tpot_s:
        ms = f"{slo_tpot_s * 1e3:g} ms"
        handles.append(
            Line2D([], [], color="0.25", linestyle=(0, (4, 2)),
                   label=f"TPOT p99 SLO {ms}, at x = 1 / {ms}; x uses the mean TPOT:\npoints left of it (shaded) "
                   "cannot meet it, points right of it may still miss on p99")
        )  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, title=_legend_title(configs, labels),
               title_fontsize=8, frameon=False)  # fmt: skip


def _legend_title(configs: list[tuple], labels: list[str]) -> str | None:
    """The configuration columns that vary, and the values all points share: ``card × policy (all TP1,
    sglang-0.4)``."""
    if not labels:
        return None
    varying = [i for i in range(len(labels)) if len({c[i] for c in configs}) > 1]
    shared = [_value_text(labels[i], configs[0][i]) for i in range(len(labels)) if i not in varying]
    names = " × ".join(_column_title(labels[i]) for i in varying) or "configuration"
    shared = [t for t in shared if t]
    return f"{names} (all {', '.join(shared)})" if shared and varying else names


def _column_title(column: str) -> str:
    return {"tp_size": "TP", "hardware": "card"}.get(column, column.rsplit(".", 1)[-1])
