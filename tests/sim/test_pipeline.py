"""The closed-form layer pipeline equals the SimPy layer-by-layer model, step by step and end to end."""

from __future__ import annotations

import pandas as pd
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.run import simulate
from sim.step.pipeline import run_closed_form, run_events

times = st.floats(min_value=0.0, max_value=1e-3, allow_nan=False)


def _events(compute_s, recall_s, t0):
    env = simpy.Environment(initial_time=t0)
    link, gpu = simpy.Resource(env, 1), simpy.Resource(env, 1)
    proc = env.process(run_events(env, link, gpu, compute_s, recall_s))
    env.run(until=proc)
    return proc.value


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.lists(times, min_size=n, max_size=n),
                                                      st.lists(times, min_size=n, max_size=n))))  # fmt: skip
def test_closed_form_equals_events(layers):
    compute_s, recall_s = layers
    t0 = 3.0
    closed = run_closed_form(t0, compute_s, recall_s, link_free_s=t0)
    events = _events(compute_s, recall_s, t0)
    assert closed.end_s == pytest.approx(events.end_s, rel=0, abs=1e-12)
    assert closed.stall_s == pytest.approx(events.stall_s, rel=0, abs=1e-12)
    assert closed.link_busy_s == pytest.approx(events.link_busy_s, rel=0, abs=1e-12)


def test_recall_of_next_layer_overlaps_compute():
    # r <= c: only layer 0's recall is exposed.
    t = run_closed_form(0.0, [2.0] * 4, [1.0] * 4, 0.0)
    assert (t.end_s, t.stall_s) == (9.0, 1.0)
    # r > c: the link paces the layers; the last compute follows the last recall.
    t = run_closed_form(0.0, [1.0] * 4, [2.0] * 4, 0.0)
    assert (t.end_s, t.stall_s) == (9.0, 5.0)


def test_busy_link_delays_first_recall():
    t = run_closed_form(0.0, [1.0], [1.0], link_free_s=5.0)
    assert t.end_s == 7.0 and t.stall_s == 6.0


def test_whole_simulation_same_with_events_layer_model(one_request_scenario):
    """Several overlapping requests, offloaded and dense: both layer models give identical tables."""
    overrides = (
        "workload.synthetic.num_requests=12",
        "workload.synthetic.rate_per_s=4",
        "workload.synthetic.prompt_tokens_cv=1.0",
        "workload.synthetic.output_tokens_cv=0.5",
        "policy.pulseinfer.scheduling=sequential",  # interruptible steps always use sim/step/interrupt.py
        "policy.pulseinfer.admission=static",
    )
    closed = simulate(one_request_scenario(12000, 40, *overrides))
    events = simulate(one_request_scenario(12000, 40, *overrides, "run.layer_model=events"))
    assert closed.policies["pulseinfer"].requests["offloaded"].any()
    assert not closed.policies["pulseinfer"].requests["offloaded"].all()
    for name in ("sglang", "pulseinfer"):
        a, b = closed.policies[name], events.policies[name]
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=False, rtol=0, atol=1e-9)
        pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=False, rtol=0, atol=1e-9)
