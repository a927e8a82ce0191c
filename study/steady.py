"""When a simulated sample can answer a capacity question: the steady-state criterion of `pulseinfer plan`
(docs/search.md "Capacity planning", which gives the reasoning behind each criterion).

A run counts as steady when (1) at least :data:`MIN_SAMPLE_REQUESTS` requests finished; (2) requests *finish*
between the 10th and 90th percentile of finish times at no less than ``(1 − STEADY_TOL)`` × the rate at which they
*arrive* between the 10th and 90th percentile of arrival times (a growing backlog finishes at capacity, below the
offered rate); (3) the arrival span is at least ``TURNOVER`` × the mean request latency (by Little's law, else the
sample never leaves its start-up transient). :func:`steady_problem` returns why a run is not steady (None when it
is). This module reads request tables only.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

STEADY_TOL = 0.1  # delivered throughput may fall this fraction short of the offered rate
MIN_SAMPLE_REQUESTS = 20  # finished requests a sample needs to say anything
WARMUP_FRAC = 0.1  # the first (and last) fraction of arrivals and finishes is left out
TURNOVER = 2.0  # arrival span / mean latency a sample needs (Little's law: requests / mean in system)


def middle_rate(times_s: np.ndarray) -> float:
    """Events per second between the ``WARMUP_FRAC`` and ``1 − WARMUP_FRAC`` quantiles of ``times_s`` (float
    [N] seconds, any order); inf when they coincide, nan for fewer than two events."""
    times = np.sort(np.asarray(times_s, dtype=float))
    if len(times) < 2:
        return math.nan
    lo, hi = math.floor(WARMUP_FRAC * (len(times) - 1)), math.ceil((1 - WARMUP_FRAC) * (len(times) - 1))
    span = times[hi] - times[lo]
    return (hi - lo) / span if span > 0 else math.inf


def delivered_rate(requests: pd.DataFrame) -> float:
    """Finished requests per second over the middle of the sample (:func:`middle_rate` of ``finish_s``)."""
    return middle_rate(requests.loc[requests["finished"].astype(bool), "finish_s"].to_numpy())


def delivered_frac(requests: pd.DataFrame) -> float:
    """Delivered / offered throughput over the middle of the sample (:func:`delivered_rate` over
    :func:`middle_rate` of ``arrival_s``); >= 1 − STEADY_TOL for a steady run."""
    offered = middle_rate(requests["arrival_s"].to_numpy())
    return delivered_rate(requests) / offered if offered > 0 else math.nan


def steady_problem(requests: pd.DataFrame, tol: float = STEADY_TOL) -> str | None:
    """Why a run is not a steady-state sample (one phrase), or None when it is.

    Args:
        requests: the run's request table (``arrival_s``, ``finish_s``, ``finished``; sim/metrics/tables.py).
        tol: allowed shortfall of delivered throughput (fraction of the offered rate).
    """
    finished = int(requests["finished"].astype(bool).sum())
    if finished < MIN_SAMPLE_REQUESTS:
        return f"only {finished} requests finished (a steady-state sample needs >= {MIN_SAMPLE_REQUESTS})"
    done = requests[requests["finished"].astype(bool)]
    latency_s = float((done["finish_s"] - done["arrival_s"]).mean())
    span_s = float(requests["arrival_s"].max() - requests["arrival_s"].min())
    if span_s < TURNOVER * latency_s:
        return (
            f"arrivals span {span_s:.3g} s, less than {TURNOVER:g} x the mean request latency {latency_s:.3g} s: the "
            "sample is too short to leave its start-up transient"
        )
    offered, delivered = middle_rate(requests["arrival_s"].to_numpy()), delivered_rate(requests)
    if delivered < (1 - tol) * offered:
        return (
            f"delivered {delivered:.3g} req/s against {offered:.3g} req/s offered, more than {tol:.0%} short: the "
            "backlog grew, or the sample is too short for its latency"
        )
    return None
