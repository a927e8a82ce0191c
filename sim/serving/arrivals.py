"""The arrival times of an open-loop driver, known in advance: skip-ahead's soft bound with colocated prefill.

A driver that submits requests at their arrival times (``Replica.arrivals``, the router in sim/serving/cluster.py)
waits ``arrival_s − now`` for each, and SimPy fires that timeout at ``now + (arrival_s − now)``.
:class:`ArrivalSchedule` computes those times with the same floating-point operations rather than assuming they
equal ``arrival_s`` (tests/sim/test_arrivals.py checks them against SimPy), so a run of decode steps
(sim/serving/decode_run.py, sim/serving/offload_run.py) can tell exactly which step an arrival falls in and never
end at an arrival: when a run's last step and an arrival end at the same instant, stepping processes whichever
SimPy scheduled first, and a run's one timeout, scheduled at its start, would be processed before an arrival whose
timeout was scheduled inside the run (docs/design.md §13).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


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
