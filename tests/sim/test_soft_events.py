"""Soft bounds of skip-ahead (``Replica.follow``): with remote prefill, an arrival or a remote prefill finishing
reaches the scheduler only at its next decision, so a run takes the step such an event falls in instead of ending
before it and leaving that step to be taken alone. Tables equal stepping bit for bit; the steps taken alone after
those events are gone (counted: the test fails if runs end before soft events again)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sim.config import load_scenario
from sim.run import simulate, simulate_policy
from sim.serving import replica as replica_module
from sim.serving.cluster import simulate_cluster
from sim.serving.fleet import Fleet
from sim.serving.replica import Replica
from sim.serving.request import Request
from sim.workload import load_workload
from tests.sim.test_fleet_scale import _equal
from tests.sim.test_skip_ahead import SHORT, _assert_equal

PD_OFFLOADED = [
    "serving.prefill=disaggregated",
    "policies=pulseinfer",
    "policy.pulseinfer.offload_threshold_tokens=1500",
]


@pytest.fixture
def alone(monkeypatch):
    """Counts the decode steps taken one at a time (``Replica._decode_step``) and the requests submitted."""
    counts = {"steps": 0, "requests": 0}
    real_step, real_submit = Replica._decode_step, Replica.submit

    def step(self, extra_s=0.0):
        counts["steps"] += 1
        return (yield from real_step(self, extra_s))

    def submit(self, req):
        counts["requests"] += 1
        real_submit(self, req)

    monkeypatch.setattr(Replica, "_decode_step", step)
    monkeypatch.setattr(Replica, "submit", submit)
    return counts


@pytest.mark.parametrize("extra", [[], ["run.horizon_s=20"]], ids=["whole", "horizon"])
def test_single_replica_with_remote_prefill_folds_soft_events(alone, extra):
    sets = [*SHORT, *PD_OFFLOADED, "serving.num_prefill_gpus=1", *extra]
    ref = simulate(load_scenario("default", [*sets, "run.skip_ahead=false"]))
    stepped, requests = alone["steps"], alone["requests"]
    fast = simulate(load_scenario("default", [*sets, "run.skip_ahead=true"]))
    _assert_equal(ref, fast)
    # stepping takes every step alone; skip-ahead takes a step alone only where no run of two steps fits (before a
    # finish, the timeline's step, the horizon, a prefill about to start): 0.55 a request on this workload, where
    # runs that ended before every arrival and remote prefill took 2.1
    assert stepped > 10 * requests
    assert alone["steps"] - stepped < requests, (alone["steps"] - stepped, requests)


@pytest.mark.parametrize("router", ["round_robin", "least_tokens"])
def test_fleet_with_remote_prefill_folds_soft_events(alone, router):
    def run(skip: str):
        scenario = load_scenario("default", [*SHORT, *PD_OFFLOADED, "run.workers=1", f"run.skip_ahead={skip}"])
        return simulate_cluster(scenario, load_workload(scenario), "pulseinfer", 3, router)

    ref = run("false")
    stepped = alone["steps"]
    fast = run("true")
    _equal(ref, fast)
    requests = alone["requests"] // 2
    assert stepped > 10 * requests
    # 0.34 (round robin) and 0.30 (least tokens) a request; 1.65 and 0.83 when runs ended before soft events
    assert alone["steps"] - stepped < 0.5 * requests, (alone["steps"] - stepped, requests)


@pytest.fixture
def passed(monkeypatch):
    """Counts the soft bounds ``_next_feed_s`` put past the replica's next arrival (its prefill starts at once)."""
    counts = {"passed": 0, "calls": 0}
    real = replica_module._next_feed_s

    def feed(replica, schedule, requests=None):
        value = real(replica, schedule, requests)
        counts["calls"] += 1
        if schedule is not None and schedule.next_index < len(schedule.times_s):
            counts["passed"] += value > schedule.times_s[schedule.next_index]
        return value

    monkeypatch.setattr(replica_module, "_next_feed_s", feed)
    return counts


@pytest.mark.parametrize("replicas", [1, 3])
def test_an_arrival_whose_prefill_starts_at_once_bounds_runs_at_its_prefill_end(passed, replicas):
    """With a prefill GPU free, an arrival only starts a remote prefill whose end is known: runs pass the arrival and
    end with the step that prefill's end falls in (``_next_feed_s``); the tables equal stepping."""
    sets = [*SHORT, *PD_OFFLOADED, "serving.num_prefill_gpus=2", "run.workers=1"]

    def run(skip: str):
        scenario = load_scenario("default", [*sets, f"run.skip_ahead={skip}"])
        if replicas == 1:
            return simulate(scenario)
        return simulate_cluster(scenario, load_workload(scenario), "pulseinfer", replicas, "round_robin")

    ref = run("false")
    fast = run("true")
    if replicas == 1:
        _assert_equal(ref, fast)
    else:
        _equal(ref, fast)
    assert passed["passed"] > 10, passed


TIE = ["serving.prefill=disaggregated", "run.progress=false", "run.debug_checks=true", "policies=sglang"]


def _tie_run(rows: list[tuple], gpus: int, skip: str):
    scenario = load_scenario("default", [*TIE, f"serving.num_prefill_gpus={gpus}", f"run.skip_ahead={skip}"])
    workload = pd.DataFrame(rows, columns=["request_id", "arrival_s", "prompt_tokens", "output_tokens"])
    return simulate_policy(scenario, workload, "sglang")


def _arrival_ending_at(boundary_s: float, prefill_s, lo_s: float, hi_s: float) -> tuple[int, float]:
    """A prompt and an arrival time in (lo_s, hi_s) whose remote prefill ends exactly at ``boundary_s``."""
    for prompt in range(50, 8000, 3):
        guess = boundary_s - prefill_s(prompt)
        for ulps in range(-3, 4):
            t = guess + ulps * math.ulp(guess)
            if lo_s < t < hi_s and t + prefill_s(prompt) == boundary_s:
                return prompt, t
    raise AssertionError("no arrival lands its prefill's end on the boundary")


@pytest.mark.parametrize("earlier", ["next_arrival", "running_prefill"])
def test_a_prefill_end_on_a_step_boundary_with_an_earlier_bound_equals_stepping(earlier):
    """An arrival's prefill starts inside a run and ends exactly at a step boundary while an earlier event bounds the
    run (the arrival after it, or another prefill in flight): stepping admits the request at that boundary (its
    prefill's timeout was scheduled before the last step's), so the run keeps the arrival as its bound rather than
    end at the boundary with its own timeout first (found by review: ``_next_feed_s`` returned the earlier event)."""
    gpus = 1 if earlier == "next_arrival" else 2
    scenario = load_scenario("default", [*TIE, f"serving.num_prefill_gpus={gpus}"])
    replica = Fleet(scenario, "sglang", 1, 0).replicas[0]

    def prefill_s(prompt: int) -> float:
        return replica._remote_prefill_s(Request(1, 0.0, prompt, 10))

    base = [(0, 0.0, 1000, 3000)]
    if earlier == "running_prefill":  # a short prefill that joins, then a long one in flight when the next run starts
        base += [(1, 1.0, 100, 2000), (2, 1.001, 6000, 2000)]
    steps = _tie_run(base, gpus, "false").steps
    starts = steps.loc[steps["phase"] == "decode", "start_s"].to_numpy()
    if earlier == "next_arrival":
        k, lo_s = 200, starts[150]
    else:
        k = int(np.searchsorted(starts, 1.001 + prefill_s(6000), side="right"))
        lo_s = starts[int(np.searchsorted(starts, 1.0 + prefill_s(100), side="right"))]
    prompt, t = _arrival_ending_at(float(starts[k]), prefill_s, float(lo_s), float(starts[k - 1]))
    rows = [*base, (len(base), t, prompt, 50)]
    if earlier == "next_arrival":  # the arrival after it falls in the step before the boundary
        rows.append((len(rows), float((starts[k - 1] + starts[k]) / 2), 200, 50))
    ref, fast = (SimpleNamespace(policies={"sglang": _tie_run(rows, gpus, skip)}) for skip in ("false", "true"))
    _assert_equal(ref, fast)
