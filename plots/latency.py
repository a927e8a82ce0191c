"""Per-request latency distributions: TPOT and TTFT CDFs, one line per policy (requests.csv)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

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
)


def tpot_cdf(requests: pd.DataFrame, slo_s: float | None = None) -> Figure:
    """CDF of per-request TPOT (s); a dotted line marks the TPOT SLO when given."""
    return _latency_cdf(requests, "tpot_s", "TPOT per request [s]", "Time per output token (TPOT)", slo_s)


def ttft_cdf(requests: pd.DataFrame, slo_s: float | None = None) -> Figure:
    """CDF of per-request TTFT (s); a dotted line marks the TTFT SLO when given."""
    return _latency_cdf(requests, "ttft_s", "TTFT per request [s]", "Time to first token (TTFT)", slo_s)


def _latency_cdf(requests: pd.DataFrame, column: str, xlabel: str, title: str, slo_s: float | None) -> Figure:
    require_columns(requests, ["policy", column], "requests.csv")
    policies = policies_in_order(requests)
    styles = policy_styles(policies)
    fig, ax = new_figure(height=4.6)
    lo, hi, missing, quantiles = np.inf, 0.0, {}, []
    for policy in policies:
        values = requests.loc[requests["policy"] == policy, column].to_numpy(dtype=float)
        missing[policy] = (int(np.isnan(values).sum()), len(values))
        values = values[np.isfinite(values) & (values > 0)]
        if len(values) == 0:
            continue
        x, y = cdf_points(values)
        quantiles.append(np.percentile(values, [50, 99]))
        label = f"{policy} (p50 {format_seconds(quantiles[-1][0])}, p99 {format_seconds(quantiles[-1][1])})"
        ax.plot(x, y, label=label, linewidth=1.8, **styles[policy])
        lo, hi = min(lo, x[0]), max(hi, x[-1])
    if hi == 0.0:
        raise MissingData(f"requests.csv has no finite {column}")
    if len(quantiles) > 1 and np.allclose(quantiles, quantiles[0], rtol=0.01):
        title += "; the same for every policy"
    if slo_s is not None:
        ax.axvline(slo_s, color="0.3", linestyle=":", linewidth=1.2, label=f"SLO {format_seconds(slo_s)}")
    if hi / lo > 100:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
    ax.set(xlabel=xlabel + (" (log scale)" if hi / lo > 100 else ""), ylabel="fraction of requests", ylim=(0, 1.02))
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    legend_below(fig, ax, title=_missing_note(missing, column))
    return fig


def _missing_note(missing: dict[str, tuple[int, int]], column: str) -> str | None:
    """Legend title counting requests without a value (unfinished, or a single output token for TPOT)."""
    counts = {policy: n for policy, n in missing.items() if n[0]}
    if not counts:
        return None
    name = column.removesuffix("_s").upper()
    if len(set(missing.values())) == 1:
        n, total = next(iter(counts.values()))
        return f"{n} of {total} requests per policy have no {name} (left out)"
    return "no " + name + ": " + ", ".join(f"{p} {n} of {total}" for p, (n, total) in counts.items())
