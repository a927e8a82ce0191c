"""Validation figures: simulated vs measured decode step times (validation_steps.csv of `pulseinfer validate`),
the serving suite (serving.csv of `pulseinfer cases`), and a real server's benchmark run against its simulated replay
(`pulseinfer validate --measured`: CDFs, the per-request scatter, the sweep).

Each figure that compares one thing with another takes a ``subject``: one or two lines naming what is compared (the
measured file, the model, the card, the engine, the profile), written by the command that draws it; the figure only
wraps it under its title."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter

from plots.style import (
    MissingData,
    cdf_points,
    new_figure,
    plain_log_ticks,
    policies_in_order,
    policy_styles,
    require_columns,
)

SUBJECT_LINES = 3  # the subject under a title is wrapped to at most this many lines (the last cut with "…")
WIDE_RANGE = 100.0  # a panel whose values span more than this factor is drawn on log axes


def titled(fig: Figure, title: str, subject: str = "", width_in: float | None = None) -> None:
    """``title`` over the figure, and ``subject`` (newlines kept) wrapped under it to the figure's width."""
    width_in = width_in or float(fig.get_figwidth())
    chars = max(40, int(width_in * 11.5))  # ~12 characters an inch at 10 pt, with a margin
    subject = subject.encode("utf-8", "replace").decode("utf-8")  # a file name that is not UTF-8: shown with "?"
    lines: list[str] = []
    for part in subject.splitlines():
        lines += textwrap.wrap(part, chars, break_on_hyphens=False) or [""]
    lines = [line for line in lines if line.strip()]
    if len(lines) > SUBJECT_LINES:
        rest = " ".join(lines[SUBJECT_LINES - 1 :])
        lines = [*lines[: SUBJECT_LINES - 1], rest if len(rest) <= chars else rest[: chars - 1].rstrip() + "…"]
    fig.suptitle("\n".join([title, *lines]), fontsize=10 if lines else 11)


def validation_steps(steps: pd.DataFrame, subject: str = "") -> Figure:
    """Left: simulated against measured step time per step (the diagonal is exact agreement). Right: both
    over the step index (measured solid markers, simulated line), per policy.

    Args:
        steps: columns policy, step, batch_size, measured_s, simulated_s (seconds).
        subject: what was validated (model, device, profile), under the figure's title; "" for none.

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
    if subject:
        titled(fig, "Engine vs simulator, decode step by step", subject)
    return fig


SET_COLORS = {"fit": "tab:blue", "check": "tab:orange", "saturation": "tab:red"}
METRIC_MARKERS = {"per_token": "o", "ttft": "s", "throughput": "^"}


def serving_scatter(rows: pd.DataFrame, band_pct: float = 10.0) -> Figure:
    """The serving suite, simulated against measured on log-log axes, one panel per metric group (per-token time,
    TTFT, throughput): fit, check and saturation sets coloured, the diagonal and a ±``band_pct`` % band shaded. Rows
    not compared (not modelled, by construction, cache hits) and the medians and p99s of the ``*_tail`` groups are
    left out.

    Args:
        rows: serving.csv of `pulseinfer cases` (calibrate/serving_cases.py ``SERVING_COLUMNS``): case, set, metric,
            group (per_token, ttft, throughput), measured, simulated, verdict (ms for latencies, tokens or requests
            per second for throughput).

    Raises:
        MissingData: if a column is missing or no row was compared.
    """
    require_columns(rows, ["case", "set", "metric", "group", "measured", "simulated", "verdict"], "serving.csv")
    used = rows[(rows["verdict"] == "compared") & np.isfinite(rows["simulated"].astype(float))]
    require_columns(used, ["measured"], "serving.csv (compared rows)")
    groups = [g for g in ("per_token", "ttft", "throughput") if (used["group"] == g).any()]
    fig, axes = new_figure(1, len(groups), width=4.2 * len(groups), height=4.2)
    axes = np.atleast_1d(axes)
    titles = {"per_token": "per-token time [ms]", "ttft": "TTFT [ms]", "throughput": "throughput [tok/s or req/s]"}
    for ax, group in zip(axes, groups, strict=True):
        part = used[used["group"] == group]
        vals = part[["measured", "simulated"]].to_numpy(dtype=float)
        lo, hi = float(vals.min()) / 1.5, float(vals.max()) * 1.5
        xs = np.geomspace(lo, hi, 50)
        ax.fill_between(
            xs, xs * (1 - band_pct / 100), xs * (1 + band_pct / 100), color="0.85", label=f"±{band_pct:g} %"
        )
        ax.plot(xs, xs, color="0.4", linewidth=1)
        for set_name, color in SET_COLORS.items():
            s = part[part["set"] == set_name]
            if len(s):
                err = np.abs(s["simulated"] / s["measured"] - 1).mean() * 100
                label = f"{set_name} (MAPE {err:.0f} %, n={len(s)})"
                ax.scatter(s["measured"], s["simulated"], s=22, color=color, alpha=0.85, marker=METRIC_MARKERS[group],
                           label=label)  # fmt: skip
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured", ylabel="simulated")
        ax.set_title(titles[group], fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Serving suite: simulated vs measured on real GPUs (scenarios/cases/serving)", fontsize=11)
    return fig


MEASURED_STYLES = {
    "measured": {"color": "black", "linestyle": "-"},
    "simulated": {"color": "tab:orange", "linestyle": "--"},
}
NO_ITL = "no ITL recorded"


def measured_cdfs(per_request: pd.DataFrame, subject: str = "") -> Figure:
    """CDFs of TTFT and TPOT per request and of ITL (every gap between a request's successive tokens, pooled over
    the requests), a real server's benchmark run against its simulated replay (`pulseinfer validate --measured`).
    A side without ITL (the file records none, or its stream sent several tokens a chunk) is said in the panel:
    ``no ITL recorded``.

    Args:
        per_request: columns source ("measured" or "simulated"), ttft_ms, tpot_ms (one row per request and source)
            and, optionally, itl_ms (per request an array of its token gaps in ms, or None).
        subject: what is compared (measured file, model, card, engine, profile), under the figure's title.

    Raises:
        MissingData: if a column is missing or there are no rows.
    """
    require_columns(per_request, ["source", "ttft_ms", "tpot_ms"], "requests.csv")
    fig, axes = new_figure(1, 3, width=14.0, height=4.2)
    panels = (("ttft_ms", "TTFT [ms]", "fraction of requests"), ("tpot_ms", "TPOT [ms]", "fraction of requests"),
              ("itl_ms", "ITL, every token gap [ms]", "fraction of token gaps"))  # fmt: skip
    for ax, (column, label, ylabel) in zip(axes, panels, strict=True):
        found, missing = [], []
        for source, style in MEASURED_STYLES.items():
            values = _values(per_request.loc[per_request["source"] == source], column)
            if not len(values):
                missing.append(source)
                continue
            x, y = cdf_points(values)
            ax.plot(x, y, label=f"{source} (median {np.median(values):,.1f}, p99 {np.percentile(values, 99):,.1f})",
                    **style)  # fmt: skip
            found.append(values)
        log = _wide(found)
        if log:
            ax.set_xscale("log")
            _log_ticks(ax.xaxis)
        ax.set(xlabel=label + (" (log scale)" if log else ""), ylabel=ylabel, ylim=(0, 1.01))
        ax.grid(True, alpha=0.3)
        if found:
            ax.legend(fontsize=8, loc="lower right")
        if missing and column == "itl_ms":
            what = NO_ITL if len(missing) == len(MEASURED_STYLES) else f"{NO_ITL} ({', '.join(missing)})"
            ax.text(0.5, 0.55 if found else 0.5, what, transform=ax.transAxes, ha="center", va="center",
                    fontsize=10, color="0.35")  # fmt: skip
        elif not found:
            ax.text(0.5, 0.5, "no values", transform=ax.transAxes, ha="center", va="center", color="0.35")
    titled(fig, "Real server vs simulated replay, per request", subject)
    return fig


def _values(rows: pd.DataFrame, column: str) -> np.ndarray:
    """The finite values of ``column`` (ms): a number per row, or for ``itl_ms`` every row's gaps pooled."""
    if column not in rows.columns:
        return np.zeros(0)
    if column == "itl_ms":
        parts = [np.asarray(g, dtype=float).ravel() for g in rows[column] if _has_gaps(g)]
        values = np.concatenate(parts) if parts else np.zeros(0)
    else:
        values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)
    return values[np.isfinite(values)]


def _has_gaps(value) -> bool:
    """An ITL cell with gaps in it (None, NaN from a CSV and empty arrays have none)."""
    return isinstance(value, (list, tuple, np.ndarray)) and len(value) > 0


def _log_ticks(axis) -> None:
    """A log axis labelled at 1, 2 and 5 of each decade as plain numbers, the minor ticks unlabelled (a span of a
    decade or two would otherwise get crowded ``2×10¹`` labels)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_minor_formatter(NullFormatter())
    plain_log_ticks(axis)


def _wide(groups: list[np.ndarray]) -> bool:
    """Whether the positive values of ``groups`` span more than :data:`WIDE_RANGE` (then log axes)."""
    values = np.concatenate(groups) if groups else np.zeros(0)
    values = values[values > 0]
    return bool(len(values) and values.max() / values.min() > WIDE_RANGE)


SCATTER_PANELS = (("ttft_ms", "TTFT [ms]"), ("tpot_ms", "TPOT [ms]"), ("e2e_ms", "E2E latency [ms]"))


def measured_scatter(per_request: pd.DataFrame, subject: str = "") -> Figure:
    """Each request's simulated TTFT, TPOT and E2E against its measured one, for a replay that sent every request at
    its recorded time (`pulseinfer validate --measured` on a file with send times): points on the diagonal are
    exact, above it the replay is slower; the legend gives the median relative error (simulated / measured − 1) and
    the median of its size.

    Args:
        per_request: columns source ("measured" or "simulated"), request_id (the measured request's, on both sides),
            ttft_ms, tpot_ms, e2e_ms, and ``run`` when several runs are drawn (requests matched within a run).
        subject: what is compared (measured file, model, card, engine, profile), under the figure's title.

    Raises:
        MissingData: if a column is missing, or no request is on both sides.
    """
    require_columns(per_request, ["source", "request_id", "ttft_ms"], "requests.csv")
    keys = ["run", "request_id"] if "run" in per_request.columns else ["request_id"]
    measured = per_request[per_request["source"] == "measured"]
    simulated = per_request[per_request["source"] == "simulated"]
    pairs = measured.merge(simulated, on=keys, suffixes=("_m", "_s"))
    if pairs.empty:
        raise MissingData("requests.csv has no request on both sides (measured and simulated)")
    panels = [(c, label) for c, label in SCATTER_PANELS if c in per_request.columns]
    fig, axes = new_figure(1, len(panels), width=4.6 * len(panels), height=4.6)
    axes = np.atleast_1d(axes)
    runs = list(dict.fromkeys(pairs["run"])) if "run" in keys else [None]
    colors = {run: f"C{i % 10}" for i, run in enumerate(runs)}
    for ax, (column, label) in zip(axes, panels, strict=True):
        m = pd.to_numeric(pairs[f"{column}_m"], errors="coerce").to_numpy(dtype=float)
        s = pd.to_numeric(pairs[f"{column}_s"], errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(m) & np.isfinite(s) & (m > 0) & (s > 0)
        if not ok.any():
            ax.text(0.5, 0.5, "no request with both values", transform=ax.transAxes, ha="center", va="center",
                    color="0.35")  # fmt: skip
            ax.set(xlabel=f"measured {label}", ylabel=f"simulated {label}")
            continue
        error = s[ok] / m[ok] - 1
        both = np.concatenate([m[ok], s[ok]])
        lo, hi = float(both.min()), float(both.max())
        log = hi / lo > WIDE_RANGE / 10  # a scatter is read at a glance: log axes past a decade
        lo, hi = (lo / 1.3, hi * 1.3) if log else (lo - 0.05 * (hi - lo) - 1e-9, hi + 0.05 * (hi - lo) + 1e-9)
        ax.plot([lo, hi], [lo, hi], color="0.5", linewidth=1, label="simulated = measured")
        for run in runs:
            mine = ok & ((pairs["run"] == run).to_numpy() if run is not None else True)
            ax.scatter(m[mine], s[mine], s=14, alpha=0.7, color=colors[run], label=_run_label(run))
        ax.plot([], [], " ", label=f"n={int(ok.sum())}: median error {np.median(error) * 100:+.1f} %, "
                                   f"median |error| {np.median(np.abs(error)) * 100:.1f} %")  # fmt: skip
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            _log_ticks(ax.xaxis)
            _log_ticks(ax.yaxis)
        ax.set(xlim=(lo, hi), ylim=(lo, hi), aspect="equal",
               xlabel=f"measured {label}" + (" (log)" if log else ""),
               ylabel=f"simulated {label}" + (" (log)" if log else ""))  # fmt: skip
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    titled(fig, "Real server vs simulated replay, request by request (same requests, sent at their recorded times)",
           subject)  # fmt: skip
    return fig


def _run_label(run) -> str | None:
    """A run's legend entry: ``run N`` for the N-th run of a file (``PATH#N``), else the file's base name."""
    if run is None:
        return None
    text = str(run)
    return f"run {text.rsplit('#', 1)[1]}" if "#" in text else text.replace("\\", "/").rsplit("/", 1)[-1]


SWEEP_PANELS = (
    ("output_throughput_tok_s", "output throughput [tok/s]"),
    ("ttft_mean_ms", "mean TTFT [ms]"),
    ("tpot_mean_ms", "mean TPOT [ms]"),
    ("itl_p50_ms", "p50 ITL [ms]"),
)


def measured_sweep(table: pd.DataFrame, x_label: str, subject: str = "") -> Figure:
    """A sweep of real-server runs against their simulated replays, one point per run: measured and simulated
    throughput, mean TTFT, mean TPOT and p50 ITL against the swept load (`pulseinfer validate --measured FILE --run
    all`).

    Args:
        table: validation.csv of several runs: columns load (the swept value: request rate or concurrency), metric,
            measured, simulated.
        x_label: what ``load`` is, with its unit.
        subject: what is compared (measured file and its runs, model, card, engine, profile), under the title.

    Raises:
        MissingData: if a column is missing or there are no rows.
    """
    require_columns(table, ["load", "metric", "measured", "simulated"], "validation.csv")
    fig, axes = new_figure(1, len(SWEEP_PANELS), width=4.0 * len(SWEEP_PANELS), height=3.6)
    for ax, (metric, label) in zip(axes, SWEEP_PANELS, strict=True):
        rows = table[table["metric"] == metric].sort_values("load")
        ax.plot(rows["load"], rows["measured"], "o-", color="black", label="measured")
        ax.plot(rows["load"], rows["simulated"], "s--", color="tab:orange", label="simulated")
        ax.set(xlabel=x_label, ylabel=label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    titled(fig, "Real server vs simulated replay across the sweep", subject)
    return fig
