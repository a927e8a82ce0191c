"""A fleet's figures (``serving.replicas`` > 1): per-replica load, decode batch, device KV and remote prefill over
time, one panel per policy, and the fleet's latency CDFs, one line per policy.

Tables: the requests table with its ``replica`` column (a fleet's; ``arrival_s``, ``first_token_s``, ``finish_s``),
``replica_series`` (each replica's coarse samples: a decode and a prefill step row at most every ``sample_s``
seconds, the step's start ``time_s``, ``phase``, ``batch_size``, ``kv_used_gib``, ``kv_pool_gib``;
sim/metrics/fleet_summary.py ``SERIES_COLUMNS``) and summary.csv (``router``, ``num_replicas``). A single-replica
folder has neither the column nor the table: every figure here raises :class:`~plots.style.MissingData` (skipped
with a note); ``prefill_pool`` also needs ``serving.prefill: disaggregated`` (scenario.yaml).

Up to :data:`MAX_REPLICA_LINES` replicas a panel draws one line per replica (a colour each, the same in every
panel); more, and it draws the band from the least to the most loaded replica with the median replica's line, on
a grid of :data:`GRID_POINTS` times. Counts of requests are exact at each grid time; a sampled quantity holds its
last sample until the next, and is left blank where a replica sampled no step for :data:`GAP_SAMPLES` sampling
intervals (idle, or inside one long forward).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from plots.style import (
    MissingData,
    cdf_points,
    format_seconds,
    legend_below,
    new_figure,
    plain_log_ticks,
    policies_in_order,
    policy_styles,
    require_columns,
    runs_to,
)

MAX_REPLICA_LINES = 8  # more replicas than this: a min / median / max band instead of a line each
GRID_POINTS = 800  # times a band (and a count of requests) is evaluated at, over the window
GAP_SAMPLES = 3.0  # no sample for this many typical sampling intervals: the replica ran no step (a blank)
POOL_SCALE = 4.0  # the KV pool line is drawn when it is at most this many times the peak use (else noted)
INCOMPLETE_REASONS = ("horizon", "stuck")  # unfinished, not rejected (sim/metrics/outcomes.py INCOMPLETE_REASONS)
SERIES = "replica_series"


def replica_load(requests: pd.DataFrame, until_s: float | None = None) -> Figure:
    """Outstanding requests (arrived, neither finished nor rejected) on each replica over time, one panel per
    policy; a request the run left unfinished (horizon or stuck) stays outstanding to the end."""
    _require_fleet(requests)
    require_columns(requests, ["policy", "replica", "arrival_s", "finish_s"], "requests.csv")
    arrival = requests["arrival_s"].to_numpy(dtype=float)
    end = requests["finish_s"].to_numpy(dtype=float)
    end = np.where(_rejected(requests), arrival, np.where(np.isnan(end), np.inf, end))
    frame = requests.assign(start_=arrival, end_=end)
    return _interval_panels(
        frame, until_s, "outstanding requests", "Outstanding requests per replica (arrived, not finished)"
    )


def prefill_pool(requests: pd.DataFrame, prefill: str | None = None, num_prefill_gpus: int | None = None) -> Figure:
    """Requests in remote prefill on each replica over time (disaggregated prefill: from arrival to the first token,
    queued for or computing on the replica's own pool of ``num_prefill_gpus`` GPUs, drawn as a dotted line: below it
    that many GPUs are busy, above it the rest wait). Only first prefills: a preempted request that is prefilled
    again is not in the requests table's times (the legend counts preemptions when there were any).

    Raises:
        MissingData: prefill is not disaggregated (colocated or none: no prefill pool), or not a fleet's table.
    """
    if prefill != "disaggregated":
        raise MissingData(f"prefill is {prefill or 'unknown (no scenario.yaml)'}: no remote prefill pool to draw")
    _require_fleet(requests)
    require_columns(requests, ["policy", "replica", "arrival_s", "first_token_s"], "requests.csv")
    first = requests["first_token_s"].to_numpy(dtype=float)
    finished = requests["finished"].to_numpy(dtype=bool) if "finished" in requests else np.zeros(len(first), bool)
    frame = requests.assign(start_=requests["arrival_s"].to_numpy(dtype=float))
    frame = frame.assign(end_=np.where(np.isnan(first) & ~finished, np.inf, first))[~_rejected(requests)]
    if frame.empty:
        raise MissingData("requests.csv has no request that reached prefill")
    pool = f" of {num_prefill_gpus} GPU(s)" if num_prefill_gpus else ""
    preempted = int(requests["num_preemptions"].sum()) if "num_preemptions" in requests else 0
    note = f"{preempted} preemption(s): their second prefills are not shown" if preempted else None
    return _interval_panels(
        frame, None, "requests in prefill\n(queued or computing)", f"Remote prefill per replica (each a pool{pool})",
        level=num_prefill_gpus, level_label=f"prefill GPUs per replica ({num_prefill_gpus})", note=note,
    )  # fmt: skip


def replica_batch(series: pd.DataFrame, until_s: float | None = None) -> Figure:
    """Decode batch (requests in the decode step) on each replica over time, from its samples (decode steps only),
    one panel per policy."""
    require_columns(series, ["policy", "replica", "time_s", "phase", "batch_size"], f"{SERIES}.csv")
    decode = series[series["phase"] == "decode"]
    if decode.empty:
        raise MissingData(f"{SERIES} has no decode step")
    return _sample_panels(decode, "batch_size", until_s, "decode batch\n[requests]", "Decode batch per replica")


def replica_kv(series: pd.DataFrame, until_s: float | None = None) -> Figure:
    """Device KV cache in use (GiB) on each replica over time, from its samples, one panel per policy; the device
    KV pool (``kv_pool_gib``) dotted when within :data:`POOL_SCALE` times the peak use (else named in the legend)."""
    require_columns(series, ["policy", "replica", "time_s", "kv_used_gib"], f"{SERIES}.csv")
    pools = series.groupby("policy", sort=False)["kv_pool_gib"].max() if "kv_pool_gib" in series else None
    return _sample_panels(
        series, "kv_used_gib", until_s, "device KV in use\n[GiB]", "Device KV cache per replica", pools=pools
    )


def fleet_latency_cdf(
    requests: pd.DataFrame, summary: pd.DataFrame, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None
) -> Figure:
    """CDFs of the fleet's per-request TTFT and TPOT (s), two panels, one line per policy labelled with its router
    (summary.csv), dotted SLO lines when given."""
    _require_fleet(requests)
    require_columns(requests, ["policy", "ttft_s", "tpot_s"], "requests.csv")
    require_columns(summary, ["policy", "router"], "summary.csv")
    routers = dict(zip(summary["policy"], summary["router"]))
    replicas = dict(zip(summary["policy"], summary["num_replicas"])) if "num_replicas" in summary else {}
    policies = policies_in_order(requests)
    styles = policy_styles(policies)
    fig, axes = new_figure(1, 2, width=11.0, height=4.6)
    panels = [("ttft_s", "TTFT per request [s]", slo_ttft_s), ("tpot_s", "TPOT per request [s]", slo_tpot_s)]
    drawn = False
    for ax, (column, xlabel, slo_s) in zip(axes, panels):
        lo, hi = math.inf, 0.0
        for policy in policies:
            values = requests.loc[requests["policy"] == policy, column].to_numpy(dtype=float)
            values = values[np.isfinite(values) & (values > 0)]
            if not len(values):
                continue
            x, y = cdf_points(values)
            p50, p99 = np.percentile(values, [50, 99])
            n = replicas.get(policy)
            where = f"{n} x {routers.get(policy, '?')}" if n is not None else routers.get(policy, "?")
            label = f"{policy}, {where} (p50 {format_seconds(p50)}, p99 {format_seconds(p99)})"
            ax.plot(x, y, label=label, linewidth=1.8, **styles[policy])
            lo, hi, drawn = min(lo, x[0]), max(hi, x[-1]), True
        if slo_s is not None:
            ax.axvline(slo_s, color="0.3", linestyle=":", linewidth=1.2, label=f"SLO {format_seconds(slo_s)}")
        log = hi > 0 and hi / lo > 100
        if log:
            ax.set_xscale("log")
            plain_log_ticks(ax.xaxis)
        ax.set(xlabel=xlabel + (" (log scale)" if log else ""), ylabel="fraction of requests", ylim=(0, 1.02))
        ax.grid(True, which="major", alpha=0.3)
    if not drawn:
        raise MissingData("requests.csv has no finite TTFT or TPOT")
    axes[0].set_title("Time to first token (TTFT)")
    axes[1].set_title("Time per output token (TPOT)")
    fig.suptitle("Fleet latency (policy, replicas x router)")
    legend_below(fig, axes[1])
    return fig


# ---- panels ---------------------------------------------------------------------------------------------------
def _require_fleet(requests: pd.DataFrame) -> None:
    if "replica" not in requests.columns:
        raise MissingData("requests.csv has no replica column: one replica, not a fleet (serving.replicas 1)")


def _rejected(requests: pd.DataFrame) -> np.ndarray:
    """Requests rejected on arrival (bool [rows]): an ``unfinished_reason`` other than the run's cut (horizon,
    stuck); finished requests have none (NaN in CSV, an empty string in Parquet)."""
    if "unfinished_reason" not in requests:
        return np.zeros(len(requests), dtype=bool)
    reason = requests["unfinished_reason"].astype(object).fillna("").astype(str)  # all-NaN reads as float64
    return ((reason != "") & ~reason.isin(INCOMPLETE_REASONS)).to_numpy()


def _panels(policies: list[str], title: str) -> tuple[Figure, list]:
    """One panel per policy, two columns when more than one, sharing both axes; spare panels hidden."""
    ncols = 1 if len(policies) == 1 else 2
    nrows = math.ceil(len(policies) / ncols)
    width, height = 7.0 if ncols == 1 else 11.0, 1.2 + 2.4 * nrows
    fig, axes = new_figure(nrows, ncols, width=width, height=height, squeeze=False, sharex=True, sharey=True)
    axes = list(axes.ravel())
    for ax in axes[len(policies) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes[: len(policies)]


def _replica_colours(replicas: list[int]) -> dict[int, str]:
    """A fixed colour per replica index (tab10 order), the same in every panel."""
    return {r: f"C{i % 10}" for i, r in enumerate(sorted(replicas))}


def _window(ends: np.ndarray, until_s: float | None) -> tuple[float, float]:
    """(end of the drawn window, end of the data): the data's last finite time, cut at ``until_s``."""
    finite = ends[np.isfinite(ends)]
    last = float(finite.max()) if len(finite) else 0.0
    end = min(last, until_s) if until_s else last
    return (end if end > 0 else 1.0), last


def _draw(ax, grid: np.ndarray, values: dict[int, np.ndarray], colours: dict[int, str], colour: str) -> None:
    """One line per replica (values [grid] each), or past :data:`MAX_REPLICA_LINES` the min-max band and median."""
    if len(values) <= MAX_REPLICA_LINES:
        for r, v in values.items():
            ax.plot(grid, v, drawstyle="steps-post", linewidth=1.3, color=colours[r], label=f"replica {r}")
        return
    stack = np.vstack(list(values.values()))
    shown = ~np.all(np.isnan(stack), axis=0)
    lo, mid, hi = (np.full(len(grid), np.nan) for _ in range(3))
    lo[shown], mid[shown], hi[shown] = (f(stack[:, shown], axis=0) for f in (np.nanmin, np.nanmedian, np.nanmax))
    n = len(values)
    ax.fill_between(grid, lo, hi, step="post", color=colour, alpha=0.25, linewidth=0, label=f"{n} replicas: min-max")
    ax.plot(grid, mid, drawstyle="steps-post", color=colour, linewidth=1.4, label="median replica")


def _finish_panels(
    fig: Figure, axes: list, ylabel: str, end_s: float, note: str | None = None, integer: bool = True
) -> None:
    """Shared window and labels (``integer``: whole-number ticks, for counts), one legend below every panel."""
    for i, ax in enumerate(axes):
        ax.set_xlim(0, end_s)
        ax.set_ylim(bottom=0)
        if integer:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.set_ylabel(ylabel if i % 2 == 0 else "")
    for ax in axes[-2:] if len(axes) > 1 else axes:  # the bottom panel of each column
        ax.set_xlabel("simulated time [s]")
        ax.tick_params(labelbottom=True)
    handles = {}
    for ax in axes:  # replicas absent from the first panel (no request there) still get an entry
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if len(axes) > 1:  # bands and medians take each panel's policy colour: a neutral key for them
        for label in handles:
            if label.endswith("min-max"):
                handles[label] = Patch(facecolor="0.5", alpha=0.35)
            elif label == "median replica":
                handles[label] = Line2D([], [], color="0.3", linewidth=1.4)
    ncols = min(len(handles), 5)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=ncols, fontsize=9, title=note,
               title_fontsize=8)  # fmt: skip


def _interval_panels(
    frame: pd.DataFrame, until_s: float | None, ylabel: str, title: str, *, level: float | None = None,
    level_label: str = "", note: str | None = None,
) -> Figure:  # fmt: skip
    """Per policy and replica, how many of ``frame``'s intervals [``start_``, ``end_``) hold each time (exact at
    each of :data:`GRID_POINTS` times); ``level`` a dotted line."""
    if frame.empty:
        raise MissingData("requests.csv has no rows")
    policies = policies_in_order(frame)
    end_s, last_s = _window(np.concatenate([frame["start_"], frame["end_"]]), until_s)
    grid = np.linspace(0.0, end_s, GRID_POINTS)
    fig, axes = _panels(policies, title)
    colours, styles = _replica_colours(list(frame["replica"].unique())), policy_styles(policies)
    for ax, policy in zip(axes, policies):
        mine = frame[frame["policy"] == policy]
        values = {}
        for r, group in mine.groupby("replica"):
            starts, ends = np.sort(group["start_"].to_numpy(float)), np.sort(group["end_"].to_numpy(float))
            values[int(r)] = np.searchsorted(starts, grid, "right") - np.searchsorted(ends, grid, "right")
        _draw(ax, grid, values, colours, styles[policy]["color"])
        if level:
            ax.axhline(level, color="0.3", linestyle=":", linewidth=1.2, label=level_label)
        ax.set_title(_panel_title(policy, float(mine["end_"].replace(np.inf, np.nan).max()), end_s), fontsize=10)
    _finish_panels(fig, axes, ylabel, end_s, note)
    return fig


def _sample_panels(
    series: pd.DataFrame, column: str, until_s: float | None, ylabel: str, title: str, pools: pd.Series | None = None
) -> Figure:
    """Per policy and replica, ``column`` of the samples over time: held from each sample to the next, blank where
    the replica sampled nothing for :data:`GAP_SAMPLES` typical intervals (in the min–max band of many replicas an
    idle replica counts as 0); ``pools`` (per policy) dotted."""
    policies = policies_in_order(series)
    end_s, _ = _window(series["time_s"].to_numpy(float), until_s)
    grid = np.linspace(0.0, end_s, GRID_POINTS)
    fig, axes = _panels(policies, title)
    colours, styles = _replica_colours(list(series["replica"].unique())), policy_styles(policies)
    lines, off_scale = series["replica"].nunique() <= MAX_REPLICA_LINES, []
    peak = float(series[column].max())  # the panels share their y axis
    for ax, policy in zip(axes, policies):
        mine = series[series["policy"] == policy].sort_values(["replica", "time_s"], kind="stable")
        spacing = mine.groupby("replica")["time_s"].diff()
        spacing = spacing[spacing > 0]
        gap_s = GAP_SAMPLES * float(spacing.median()) if len(spacing) else math.inf
        values = {}
        for r, group in mine.groupby("replica"):
            t, v = group["time_s"].to_numpy(float), group[column].to_numpy(float)
            if lines:  # the samples themselves, at their own times
                t_line, v_line = _with_gaps(t, v, gap_s)
                ax.plot(t_line, v_line, drawstyle="steps-post", linewidth=1.3, color=colours[r], label=f"replica {r}")
                continue
            i = np.searchsorted(t, grid, "right") - 1  # the last sample at or before each grid time
            j = np.maximum(i, 0)
            # an idle replica (no step for gap_s, or none yet) counts as 0 in the band and the median: it runs nothing
            values[int(r)] = np.where((i >= 0) & (grid - t[j] <= gap_s), v[j], 0.0)
        if values:
            _draw(ax, grid, values, colours, styles[policy]["color"])
        if pools is not None and policy in pools and np.isfinite(pools[policy]):
            pool = float(pools[policy])
            if pool <= POOL_SCALE * peak:  # else the line would flatten every replica's
                ax.axhline(pool, color="0.3", linestyle=":", linewidth=1.2, label="device KV pool")
            else:
                off_scale.append((policy, f"{pool:.3g} GiB"))
        ax.set_title(_panel_title(policy, float(mine["time_s"].max()), end_s), fontsize=10)
    sizes = {size for _, size in off_scale}
    named = next(iter(sizes)) if len(sizes) == 1 else ", ".join(f"{policy} {size}" for policy, size in off_scale)
    note = f"device KV pool per replica {named}: far above the lines" if off_scale else None
    _finish_panels(fig, axes, ylabel, end_s, note, integer=column == "batch_size")
    return fig


def _with_gaps(t: np.ndarray, v: np.ndarray, gap_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``(t, v)`` with a NaN point after each sample the next one follows by more than ``gap_s`` (a blank)."""
    after = np.flatnonzero(np.diff(t) > gap_s)
    t_out = np.insert(t, after + 1, t[after] + gap_s)
    return t_out, np.insert(v, after + 1, np.nan)


def _panel_title(policy: str, last_s: float, end_s: float) -> str:
    """The policy, and ``(runs to N s)`` when its data runs past the window."""
    return f"{policy} {runs_to(last_s)}" if np.isfinite(last_s) and last_s > end_s * 1.001 else policy
