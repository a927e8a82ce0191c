"""Quantities over simulated time, binned, one line per policy (steps.csv).

A step's busy time, batch x time and memory level are spread over the bins its interval overlaps; its
tokens count in the bin where it ends. Bins are a 1-2-5 width giving about 100 bins over the window
unless ``bin_s`` is given; a policy's last bin is divided by its covered part only.
``until_s`` cuts the window (an overloaded policy can drain for 50x longer than the others); a policy
that runs past it says so in the legend.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.style import (
    GIB,
    MissingData,
    legend_below,
    new_figure,
    nice_step,
    policies_in_order,
    policy_styles,
    require_columns,
    runs_to,
)

STEP_TIME = ["policy", "phase", "start_s", "duration_s"]


def throughput_over_time(steps: pd.DataFrame, bin_s: float | None = None, until_s: float | None = None) -> Figure:
    """Two panels sharing time: decode tokens/s, and the time-averaged decode batch size."""
    require_columns(steps, [*STEP_TIME, "batch_size"], "steps.csv")
    frame = _Frame(steps, bin_s, until_s)
    decode = steps[steps["phase"] == "decode"]
    if decode.empty:
        raise MissingData("steps.csv has no decode steps")
    decode = decode.assign(batch_time=decode["batch_size"] * decode["duration_s"])
    fig, (top, bottom) = new_figure(2, 1, height=5.0, sharex=True)
    for policy, group in decode.groupby("policy", sort=False):
        t, tokens = frame.rate(group, "batch_size", at_end=True)
        _, batch = frame.rate(group, "batch_time")
        top.plot(t, tokens, label=frame.label(policy), linewidth=1.4, **frame.styles[policy])
        bottom.plot(t, batch, linewidth=1.4, **frame.styles[policy])
    top.set(ylabel="decode tokens/s", title=f"Decode throughput and batch size ({frame.bin_label})")
    bottom.set(xlabel="simulated time [s]", ylabel="mean batch size\n[requests]")
    frame.finish(top, bottom)
    legend_below(fig, top)
    return fig


def link_utilisation(steps: pd.DataFrame, bin_s: float | None = None, until_s: float | None = None) -> Figure:
    """Host link busy fraction per bin (sum of ``link_busy_s`` / bin width); idle-link policies named in a note."""
    require_columns(steps, [*STEP_TIME, "link_busy_s"], "steps.csv")
    frame = _Frame(steps, bin_s, until_s)
    busy = steps.groupby("policy", sort=False)["link_busy_s"].sum()
    idle = [p for p in frame.policies if busy[p] <= 0]
    if len(idle) == len(frame.policies):
        raise MissingData("no policy uses the host link (link_busy_s is 0 everywhere)")
    fig, ax = new_figure()
    for policy, group in steps.groupby("policy", sort=False):
        if policy not in idle:
            t, util = frame.rate(group, "link_busy_s")
            ax.plot(t, 100 * util, label=frame.label(policy), linewidth=1.4, **frame.styles[policy])
    ax.set(xlabel="simulated time [s]", ylabel="host link busy [%]")
    ax.set_title(f"Host\u2192GPU link utilisation ({frame.bin_label})")
    frame.finish(ax)
    ax.set_ylim(0, 105)
    legend_below(fig, ax, title=f"no link traffic: {', '.join(idle)}" if idle else None)
    return fig


def memory_over_time(
    steps: pd.DataFrame, bin_s: float | None = None, hbm_gib: float | None = None, until_s: float | None = None
) -> Figure:
    """Two panels: HBM in use (weights + KV, GiB; capacity dotted when given) and host DRAM KV in use (GiB)."""
    require_columns(steps, [*STEP_TIME, "hbm_used_bytes", "host_used_bytes"], "steps.csv")
    frame = _Frame(steps, bin_s, until_s)
    fig, (top, bottom) = new_figure(2, 1, height=5.0, sharex=True)
    for policy, group in steps.groupby("policy", sort=False):
        t, hbm = frame.level(group, "hbm_used_bytes")
        _, host = frame.level(group, "host_used_bytes")
        top.plot(t, hbm / GIB, label=frame.label(policy), linewidth=1.4, **frame.styles[policy])
        bottom.plot(t, host / GIB, linewidth=1.4, **frame.styles[policy])
    if hbm_gib:
        top.axhline(hbm_gib, color="0.3", linestyle=":", linewidth=1.2, label=f"HBM {hbm_gib:g} GiB")
    top.set(ylabel="HBM used [GiB]", title=f"Memory in use (mean per {frame.bin_s:g} s bin{frame.cut})")
    bottom.set(xlabel="simulated time [s]", ylabel="host DRAM KV [GiB]")
    frame.finish(top, bottom)
    top.set_ylim(top=1.08 * max(top.get_ylim()[1], hbm_gib or 0))
    legend_below(fig, top)
    return fig


class _Frame:
    """The shared time window and bins of one figure, and the per-policy binning."""

    def __init__(self, steps: pd.DataFrame, bin_s: float | None, until_s: float | None) -> None:
        self.policies = policies_in_order(steps)
        self.styles = policy_styles(self.policies)
        ends = (steps["start_s"] + steps["duration_s"]).groupby(steps["policy"], sort=False).max()
        self.ends = ends.to_dict()
        span = float(ends.max())
        until = min(span, until_s) if until_s and until_s > 0 else span
        self.bin_s = bin_s or nice_step(until)
        self.until = min(span, np.ceil(until / self.bin_s) * self.bin_s)  # whole bins, so the last is not a sliver
        self.cut = f"; first {self.until:,.0f} s shown" if self.until < span else ""
        self.bin_label = f"{self.bin_s:g} s bins{self.cut}"

    def label(self, policy: str) -> str:
        end = self.ends[policy]
        return policy if end <= self.until else f"{policy} {runs_to(end)}"

    def finish(self, *axes) -> None:
        for ax in axes:
            ax.set_xlim(0, self.until * 1.02)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)

    def _edges(self, group: pd.DataFrame) -> np.ndarray:
        """Bin edges from 0 to this policy's end (or the window's); the last bin may be partial."""
        end = min(float((group["start_s"] + group["duration_s"]).max()), self.until)
        edges = np.arange(0.0, end, self.bin_s)
        return np.append(edges, end) if end > 0 else np.array([0.0, self.bin_s])

    def rate(self, group: pd.DataFrame, column: str, at_end: bool = False) -> tuple:
        """(bin mid-points, ``column`` per second of each bin): spread evenly over each step's interval,
        or counted at the step's end when ``at_end`` (tokens appear when a step finishes)."""
        edges = self._edges(group)
        start, duration = group["start_s"].to_numpy(dtype=float), group["duration_s"].to_numpy(dtype=float)
        values = group[column].to_numpy(dtype=float)
        if at_end:
            sums = np.histogram(start + duration, bins=edges, weights=values)[0]
        else:
            sums = _spread(start, duration, values, edges)
        return (edges[:-1] + edges[1:]) / 2, sums / np.diff(edges)

    def level(self, group: pd.DataFrame, column: str) -> tuple:
        """(bin mid-points, time-weighted mean of ``column`` over the steps overlapping each bin; NaN if none)."""
        edges = self._edges(group)
        start, duration = group["start_s"].to_numpy(dtype=float), group["duration_s"].to_numpy(dtype=float)
        total = _spread(start, duration, group[column].to_numpy(dtype=float) * duration, edges)
        time = _spread(start, duration, duration, edges)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (edges[:-1] + edges[1:]) / 2, np.where(time > 0, total / time, np.nan)


def _spread(start: np.ndarray, duration: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Sum per bin of each step's value, spread evenly over [start, start + duration) (a 7 s step
    straddling two bins counts in both); zero-length steps count where they start."""
    instant = duration <= 0
    sums = np.histogram(start[instant], bins=edges, weights=values[instant])[0].astype(float)
    s, d, v = start[~instant], duration[~instant], values[~instant]
    rate = v / d
    # cumulative(t) = sum rate * (max(0, t - s) - max(0, t - e)): two ramp sums, each O(n log n)
    cumulative = _ramp_sum(s, rate, edges) - _ramp_sum(s + d, rate, edges)
    return sums + np.diff(cumulative)


def _ramp_sum(points: np.ndarray, weights: np.ndarray, t: np.ndarray) -> np.ndarray:
    """sum_i weights_i * max(0, t - points_i), for each t."""
    order = np.argsort(points, kind="stable")
    p, w = points[order], weights[order]
    cum_w = np.concatenate([[0.0], np.cumsum(w)])
    cum_wp = np.concatenate([[0.0], np.cumsum(w * p)])
    k = np.searchsorted(p, t, side="right")
    return t * cum_w[k] - cum_wp[k]
