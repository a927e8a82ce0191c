"""Validation figure: simulated vs measured decode step times (validation_steps.csv of `pulseinfer validate`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.style import cdf_points, new_figure, policies_in_order, policy_styles, require_columns


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


def measured_cdfs(per_request: pd.DataFrame) -> Figure:
    """CDFs of TTFT and TPOT per request, a real server's benchmark run against its simulated replay
    (`pulseinfer validate --measured`).

    Args:
        per_request: columns source ("measured" or "simulated"), ttft_ms, tpot_ms (one row per request and source).

    Raises:
        MissingData: if a column is missing or there are no rows.
    """
    require_columns(per_request, ["source", "ttft_ms", "tpot_ms"], "requests.csv")
    fig, axes = new_figure(1, 2, width=10.0, height=3.8)
    styles = {"measured": {"color": "black", "linestyle": "-"}, "simulated": {"color": "tab:orange", "linestyle": "--"}}
    for ax, column, label in zip(axes, ("ttft_ms", "tpot_ms"), ("TTFT [ms]", "TPOT [ms]"), strict=True):
        for source, style in styles.items():
            values = per_request.loc[per_request["source"] == source, column].dropna().to_numpy(dtype=float)
            if len(values):
                x, y = cdf_points(values)
                ax.plot(x, y, label=f"{source} (median {np.median(values):,.1f})", **style)
        ax.set(xlabel=label, ylabel="fraction of requests", ylim=(0, 1.01))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Real server vs simulated replay, per request", fontsize=11)
    return fig


SWEEP_PANELS = (
    ("output_throughput_tok_s", "output throughput [tok/s]"),
    ("ttft_mean_ms", "mean TTFT [ms]"),
    ("tpot_mean_ms", "mean TPOT [ms]"),
    ("itl_p50_ms", "p50 ITL [ms]"),
)


def measured_sweep(table: pd.DataFrame, x_label: str) -> Figure:
    """A sweep of real-server runs against their simulated replays, one point per run: measured and simulated
    throughput, mean TTFT, mean TPOT and p50 ITL against the swept load (`pulseinfer validate --measured FILE --run
    all`).

    Args:
        table: validation.csv of several runs: columns load (the swept value: request rate or concurrency), metric,
            measured, simulated.
        x_label: what ``load`` is, with its unit.

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
    fig.suptitle("Real server vs simulated replay across the sweep", fontsize=11)
    return fig
