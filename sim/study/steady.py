"""When a simulated sample can answer a capacity question: the steady-state criterion of `pulseinfer plan`.

A replica (or fleet) "sustains" an offered rate only if the sample shows it, not merely because a short burst of
requests happened to meet the SLO. A run counts as steady when

1. **enough requests**: at least :data:`MIN_SAMPLE_REQUESTS` requests finished — fewer cannot give a p99 or a
   rate;
2. **delivered throughput matches the offered rate** over the middle of the sample: the rate at which requests
   *finish* between the 10th and 90th percentile of finish times is at least ``(1 − STEADY_TOL)`` × the rate at
   which they *arrive* between the 10th and 90th percentile of arrival times. The first 10 % are the warm-up,
   the last 10 % the drain. In steady state completions track arrivals shifted by the latency, so the two
   rates agree; when the backlog grows (overload), completions run at the replica's capacity, below the
   arrival rate; a burst too short for its latency (50 requests at 1,000 req/s) arrives in milliseconds and
   finishes over seconds;
3. **the sample turns the system over**: its arrival span is at least ``TURNOVER`` × the mean request latency
   (arrival to finish). By Little's law the span over the latency is the number of requests over the mean
   number in the system, so a sample shorter than that never leaves its start-up transient — every request
   is still in flight when the last arrives (a burst served as one batch finishes all at once and would look
   infinitely fast by criterion 2).

:func:`steady_problem` returns why a run is not steady (None when it is). `plan` (sim/study/plan.py) counts a rate
as feasible only when the SLO holds *and* the run is steady, so it never reports a rate its own simulation did not
deliver; what the plan then says about its answers (sample-limited notes, fleet answers kept consistent with the
single-replica maximum) is the plan's own (sim/study/plan.py). This module reads request tables only.
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
