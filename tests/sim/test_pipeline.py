"""The sequential layer pipeline (sim/step/pipeline.py) equals the SimPy layer-by-layer oracle (tests/sim/oracles/
step_timing.py ``run_events``: the link and the GPU stream as real resources), times by hand, and the retired
``run.layer_model`` knob."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import ScenarioError, load_scenario
from sim.step.timing import StepDevices
from tests.sim.oracles.step_timing import run_events
from tests.sim.oracles.steps import StepsTiming, time_steps

times = st.floats(min_value=0.0, max_value=1e-3, allow_nan=False)


def sequential(t0: float, compute_s: list[float], recall_s: list[float], link_free_s: float,
               gather_s: list[float] | None = None, kernels: str = "python") -> StepsTiming:  # fmt: skip
    """One step of the sequential pipeline from ``t0`` (no overhead, no head, no D2H), by the sim/ function."""
    devices = StepDevices(simpy.Environment(), None, kernels)
    devices.link_free_s = link_free_s
    gather = gather_s if gather_s is not None else [0.0] * len(recall_s)
    return time_steps(
        devices,
        t0,
        np.array([compute_s]),
        np.ones(1, bool),
        0.0,
        0.0,
        0,
        sequential=(np.array([recall_s]), np.array([gather])),
    )


def _events(compute_s, recall_s, t0):
    env = simpy.Environment(initial_time=t0)
    link, gpu = simpy.Resource(env, 1), simpy.Resource(env, 1)
    proc = env.process(run_events(env, link, gpu, compute_s, recall_s))
    env.run(until=proc)
    return proc.value


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.lists(times, min_size=n, max_size=n),
                                                      st.lists(times, min_size=n, max_size=n))))  # fmt: skip
def test_sequential_pipeline_equals_the_events_oracle(layers):
    compute_s, recall_s = layers
    t0 = 3.0
    got = sequential(t0, compute_s, recall_s, link_free_s=t0)
    events = _events(compute_s, recall_s, t0)
    assert got.times_s[1] == pytest.approx(events.end_s, rel=0, abs=1e-12)
    assert got.stall_s[0] == pytest.approx(events.stall_s, rel=0, abs=1e-12)
    assert got.link_busy_s[0] == pytest.approx(events.link_busy_s, rel=0, abs=1e-12)


def test_recall_of_next_layer_overlaps_compute():
    # r <= c: only layer 0's recall is exposed.
    t = sequential(0.0, [2.0] * 4, [1.0] * 4, 0.0)
    assert (t.times_s[1], t.stall_s[0]) == (9.0, 1.0)
    # r > c: the link paces the layers; the last compute follows the last recall.
    t = sequential(0.0, [1.0] * 4, [2.0] * 4, 0.0)
    assert (t.times_s[1], t.stall_s[0]) == (9.0, 5.0)
    assert t.item_stall_s[0].tolist() == [2.0, 1.0, 1.0, 1.0]


def test_busy_link_delays_first_recall():
    t = sequential(0.0, [1.0], [1.0], link_free_s=5.0)
    assert t.times_s[1] == 7.0 and t.stall_s[0] == 6.0 and t.link_free_s == 6.0


def test_layer_model_closed_form_still_loads_and_events_is_refused():
    assert "layer_model" not in load_scenario("default", ["run.layer_model=closed_form"]).run.model_dump()
    with pytest.raises(ScenarioError, match="retired.*test oracle") as err:
        load_scenario("default", ["run.layer_model=events"])
    assert "\n" not in str(err.value)
