"""The arrival times of an open-loop driver, known in advance: skip-ahead's soft bound with colocated prefill.

A driver that submits requests at their arrival times (``Replica.arrivals``, the router in sim/serving/cluster.py)
waits ``arrival_s − now`` for each, and SimPy fires that timeout at ``now + (arrival_s − now)``.
:class:`ArrivalSchedule` computes those times with the same floating-point operations rather than assuming they
equal ``arrival_s`` (tests/sim/test_arrivals.py checks them against SimPy), so a run of decode steps
(sim/serving/decode.py, sim/serving/decode_run.py) can tell exactly which step an arrival falls in and never
end at an arrival: when a run's last step and an arrival end at the same instant, stepping processes whichever
SimPy scheduled first, and a run's one timeout, scheduled at its start, would be processed before an arrival whose
timeout was scheduled inside the run (docs/design.md §13).

:func:`timeout_at` is an event at an exact time (a cut run's end, sim/serving/decode.py; a worker's copy of the
router's clock, sim/serving/fleet_pool.py), where ``env.timeout(time_s − now)`` could land a rounding away.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import numpy as np
import simpy
from simpy.events import NORMAL


class ArrivalSchedule:
    """When each arrival of an open-loop driver is submitted, and which of them is next.

    Args:
        arrivals_s: each request's arrival time, in submission order (seconds).
        start_s: the clock when the driver starts.
    """

    def __init__(self, arrivals_s: Iterable[float], start_s: float) -> None:
        times, now = [], start_s
        for arrival_s in arrivals_s:
            if arrival_s > now:  # the driver's timeout, as SimPy adds it to the clock
                now = now + (arrival_s - now)
            times.append(now)
        self.times_s = np.array(times, dtype=np.float64)  # float64 [requests], nondecreasing
        self.next_index = 0  # the first arrival not submitted yet (the driver moves it)

    def subset(self, indices: np.ndarray) -> ArrivalSchedule:
        """The schedule of the arrivals at ``indices`` (int64 [m], increasing) alone, with their times as computed
        here (one driver's timeouts), its next arrival the first of them: what one replica behind a static router
        receives."""
        sub = object.__new__(ArrivalSchedule)
        sub.times_s = self.times_s[indices]
        sub.next_index = 0
        return sub

    def next_s(self) -> float:
        """When the next arrival not submitted yet fires (``math.inf`` after the last)."""
        i = self.next_index
        return float(self.times_s[i]) if i < len(self.times_s) else math.inf

    def at(self, time_s: float) -> bool:
        """Whether an arrival fires exactly at ``time_s``."""
        i = int(np.searchsorted(self.times_s, time_s))
        return i < len(self.times_s) and self.times_s[i] == time_s

    def first_at(self, times_s: np.ndarray) -> int:
        """The index of the first of ``times_s`` (float64 [m], seconds) at which an arrival fires, ``m`` if none."""
        times = np.asarray(times_s, dtype=np.float64)
        if not len(times) or not len(self.times_s):
            return len(times)
        i = np.minimum(np.searchsorted(self.times_s, times), len(self.times_s) - 1)
        hits = np.flatnonzero(self.times_s[i] == times)
        return int(hits[0]) if len(hits) else len(times)


def delay_to(now_s: float, time_s: float) -> float | None:
    """A delay (s) whose SimPy timeout from ``now_s`` fires exactly at ``time_s`` (>= ``now_s``): ``time_s − now_s``
    unless rounding makes ``now_s + delay`` miss, then the nearest float delay that lands; None when none does
    (rounding ties to even can skip ``time_s``)."""
    delay = time_s - now_s
    for _ in range(4):
        end_s = now_s + delay
        if end_s == time_s:
            return delay
        delay = math.nextafter(delay, math.inf if end_s < time_s else -math.inf)
    return None


def timeout_at(env: simpy.Environment, time_s: float) -> simpy.Event:
    """An event that fires exactly at ``time_s`` (>= now), scheduled now like a timeout: ``env.timeout`` of
    :func:`delay_to`, or where no delay lands, the same queue entry SimPy's ``schedule`` makes, at ``time_s`` itself
    (SimPy computes an event's time as now + delay; its queue holds (time, priority, id, event))."""
    delay = delay_to(env.now, time_s)
    if delay is not None:
        return env.timeout(delay)
    event = simpy.Event(env)
    event._ok, event._value = True, None
    heapq.heappush(env._queue, (time_s, NORMAL, next(env._eid), event))
    return event
