"""sim/serving/arrivals.py: the times an open-loop driver's arrivals really fire at, as SimPy computes them."""

from __future__ import annotations

import math

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.arrivals import ArrivalSchedule


def _fired(arrivals_s: list[float], start_s: float) -> list[float]:
    """When a driver that waits ``arrival − now`` for each arrival submits it, run in SimPy from ``start_s``."""
    env = simpy.Environment(initial_time=start_s)
    fired = []

    def driver():
        for arrival_s in arrivals_s:
            if arrival_s > env.now:
                yield env.timeout(arrival_s - env.now)
            fired.append(env.now)

    env.process(driver())
    env.run()
    return fired


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 50.0), st.sampled_from([0.1, 0.2, 0.3, 1 / 3])), max_size=40),
    start_s=st.sampled_from([0.0, 0.1, 7.3]),
)
def test_schedule_fires_where_simpy_does(gaps, start_s):
    arrivals_s, t = [], start_s
    for gap in gaps:  # nondecreasing arrival times whose differences are not exact in binary
        t += gap
        arrivals_s.append(t)
    schedule = ArrivalSchedule(arrivals_s, start_s)
    fired = _fired(arrivals_s, start_s)
    assert schedule.times_s.tolist() == fired
    for i, time_s in enumerate(fired):
        schedule.next_index = i
        assert schedule.next_s() == time_s and schedule.at(time_s)
        assert not schedule.at(math.nextafter(time_s, math.inf)) or math.nextafter(time_s, math.inf) in fired
    schedule.next_index = len(fired)
    assert schedule.next_s() == math.inf
