"""Interruptible layer-wise scheduling (sim/step/pipeline.py): an exact timeline, and agreement with the sequential
pipeline when nothing can be pre-empted."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.step.timing import StepDevices
from tests.sim.oracles.step_timing import jobs4
from tests.sim.oracles.steps import StepsTiming, time_steps

MB = 1e6
# Three items (layers), look-ahead 2. Prefetches of items 0 and 1 are small; item 2's is large
# (4 MB in 4 s, so 1 s per 1 MB chunk). Item 1 also has an urgent 0.25 s correction, released when
# item 0 finishes computing (t = 1.7) while item 2's prefetch holds the link.
COMPUTE = [1.2, 1.2, 1.2]
PREFETCH = [(0.5 * MB, 0.5), (0.5 * MB, 0.5), (4 * MB, 4.0)]
CORRECTION = [(0, 0.0), (0.25 * MB, 0.25), (0, 0.0)]


def interruptible(t0, compute_s, prefetch, correction, lookahead, chunk_bytes, link_free_s, record=False,
                  sequential=None) -> StepsTiming:  # fmt: skip
    """One step from ``t0`` (no overhead, head or D2H) by the sim/ function; jobs as (bytes, service s) tuples."""
    devices = StepDevices(simpy.Environment(), None, "python")
    devices.link_free_s = link_free_s
    compute = np.array([compute_s])
    if sequential is not None:
        pipes = {"sequential": (np.array([sequential]), np.zeros((1, len(sequential))))}
    else:
        pipes = {"jobs": (jobs4(prefetch)[None], jobs4(correction)[None])}
    return time_steps(devices,
        t0, compute, np.ones(1, bool), 0.0, 0.0, 0, lookahead_items=lookahead, chunk_bytes=chunk_bytes, record=record,
        **pipes,
    )  # fmt: skip


def test_urgent_recall_takes_the_link_at_the_next_chunk_boundary():
    t = interruptible(0.0, COMPUTE, PREFETCH, CORRECTION, 2, 1 * MB, 0.0, record=True)
    # By hand: pf0 0-0.5, pf1 0.5-1.0; item 0 computes 0.5-1.7 and releases pf2 at 0.5, which starts
    # at 1.0. cr1 arrives at 1.7; pf2's next chunk boundary is 2.0, so cr1 runs 2.0-2.25 and pf2
    # resumes 2.25-5.25. Item 1 computes 2.25-3.45, item 2 waits for pf2: 5.25-6.45.
    assert sorted(t.intervals, key=lambda x: (x[2], x[0])) == [
        ("transfer", 0, 0.0, 0.5, False),
        ("compute", 0, 0.5, pytest.approx(1.7), False),
        ("transfer", 1, 0.5, 1.0, False),
        ("transfer", 2, 1.0, 2.0, True),
        ("transfer", 1, 2.0, 2.25, False),
        ("compute", 1, 2.25, pytest.approx(3.45), False),
        ("transfer", 2, 2.25, 5.25, False),
        ("compute", 2, 5.25, pytest.approx(6.45), False),
    ]
    assert t.times_s[1] == pytest.approx(6.45)
    assert t.item_stall_s[0].tolist() == pytest.approx([0.5, 0.55, 5.25 - 3.45])
    assert t.link_busy_s[0] == pytest.approx(0.5 + 0.5 + 4.0 + 0.25)


def test_without_chunks_the_urgent_recall_waits_for_the_prefetch():
    t = interruptible(0.0, COMPUTE, PREFETCH, CORRECTION, 2, 100 * MB, 0.0)
    # cr1 waits until pf2 ends at 5.0: item 1 computes 5.25-6.45, item 2 6.45-7.65.
    assert t.times_s[1] == pytest.approx(7.65)


times = st.floats(min_value=1e-6, max_value=1e-3, allow_nan=False)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(1, 10).flatmap(lambda n: st.tuples(st.lists(times, min_size=n, max_size=n),
                                                      st.lists(times, min_size=n, max_size=n))))  # fmt: skip
def test_one_layer_lookahead_without_corrections_equals_the_sequential_pipeline(layers):
    compute_s, recall_s = layers
    seq = interruptible(1.0, compute_s, None, None, 1, 1.0, 1.0, sequential=recall_s)
    itr = interruptible(1.0, compute_s, [(1.0, r) for r in recall_s], [(0, 0.0)] * len(recall_s), 1, 1.0, 1.0)
    assert itr.times_s[1] == pytest.approx(seq.times_s[1], abs=1e-12)
    assert itr.stall_s[0] == pytest.approx(seq.stall_s[0], abs=1e-12)
    assert itr.link_busy_s[0] == pytest.approx(seq.link_busy_s[0], abs=1e-12)


def test_deeper_lookahead_hides_more_recall():
    compute_s, recall = [1.0] * 8, [(1.0, 1.5)] * 8  # the link is the bottleneck
    one = interruptible(0.0, compute_s, recall, [(0, 0.0)] * 8, 1, 1.0, 0.0)
    two = interruptible(0.0, compute_s, recall, [(0, 0.0)] * 8, 2, 1.0, 0.0)
    assert two.times_s[1] <= one.times_s[1]
