"""Fleet scale (issue 34): behind a load-aware router an arrival cuts only the run of the replica it is routed to
(sim/serving/decode.py ``Decode.cut_run``; with remote prefill at the end of its prefill), and a round-robin fleet's
replicas run in worker processes (sim/serving/fleet_pool.py, ``run.workers``); both give the tables of stepping one
decode step at a time in one environment, bit for bit."""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np
import pandas as pd
import pytest
import simpy

from sim.config import ScenarioError, load_scenario
from sim.serving.arrivals import ArrivalSchedule, delay_to, timeout_at
from sim.serving.cluster import simulate_cluster
from sim.serving.decode import Decode
from sim.serving.fleet_pool import pool_size
from sim.workload import load_workload
from tests.sim.test_skip_ahead import SHORT

PD = ["serving.prefill=disaggregated"]


@pytest.fixture
def cuts(monkeypatch):
    """Counts runs an arrival cut (``cuts["runs"]``), cuts at a remote prefill's end rather than at the first boundary
    after the arrival (``cuts["at_prefill_end"]``), cuts of a run already cut (``cuts["again"]``) and offloaded runs
    cut short (``cuts["offloaded"]``)."""
    counts = {"runs": 0, "at_prefill_end": 0, "again": 0, "offloaded": 0}
    real_cut, real_wait = Decode.cut_run, Decode._wait_run

    def cut_run(self, req):
        times = self._run_times_s
        end = self._run_end if times is not None else 0
        real_cut(self, req)
        if times is not None and self._run_end < end:
            counts["runs"] += 1
            counts["again"] += end < len(times) - 1
            counts["at_prefill_end"] += self._run_end > bisect_right(times, self.env.now)

    def wait(self, times_s):  # a run of steps that recall, taken short of the steps it timed
        steps = yield from real_wait(self, times_s)
        counts["offloaded"] += bool(self.batch.offloaded.any()) and steps < len(times_s) - 1
        return steps

    monkeypatch.setattr(Decode, "cut_run", cut_run)
    monkeypatch.setattr(Decode, "_wait_run", wait)
    return counts


def _equal(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.replicas, b.replicas, check_exact=True)
    assert a.routed == b.routed
    assert a.summary.keys() == b.summary.keys()
    for key, value in a.summary.items():
        other = b.summary[key]
        assert value == other or (value != value and other != other), (key, value, other)


@pytest.mark.parametrize(
    "policy, replicas, router, extra",
    [
        pytest.param("sglang", 3, "least_tokens", [], id="least-tokens-colocated"),
        pytest.param("sglang", 3, "least_tokens", [*PD, "serving.num_prefill_gpus=1"], id="least-tokens-pd"),
        pytest.param("sglang", 3, "least_tokens", ["serving.prefill=none"], id="prefill-none"),
        pytest.param("sglang", 3, "least_tokens", [*PD, "run.horizon_s=20"], id="pd-horizon"),
        pytest.param("sglang", 1, "least_tokens", [*PD, "serving.num_prefill_gpus=2"], id="pd-two-prefill-gpus"),
        pytest.param(
            "pulseinfer", 3, "least_tokens", ["policy.pulseinfer.offload_threshold_tokens=16"], id="offloaded"
        ),
        pytest.param(
            "pulseinfer", 2, "least_tokens", [*PD, "policy.pulseinfer.offload_threshold_tokens=1500"], id="pd-offloaded"
        ),
        pytest.param("sglang", 3, "prefix_aware", ["policy.sglang.prefix_cache=true"], id="prefix-aware"),
        pytest.param("sglang", 3, "prefix_aware", PD, id="prefix-aware-pd"),
    ],
)
def test_load_aware_fleet_cuts_runs_and_equals_stepping(cuts, policy, replicas, router, extra):
    def run(skip: str):
        scenario = load_scenario("default", [*SHORT, f"policies={policy}", *extra, f"run.skip_ahead={skip}"])
        return simulate_cluster(scenario, load_workload(scenario), policy, replicas, router)

    ref = run("false")
    assert cuts["runs"] == 0
    fast = run("true")
    assert cuts["runs"] > 5, cuts  # arrivals did cut runs in progress (else the comparison proves little)
    if policy == "pulseinfer" and "serving.prefill=disaggregated" not in extra:
        assert cuts["offloaded"] > 5, cuts
    if "serving.prefill=disaggregated" in extra:  # a remote prefill's end, not the arrival, cut runs
        assert cuts["at_prefill_end"] > 5, cuts
    if "serving.num_prefill_gpus=2" in extra:  # a shorter prefill started later cut a run cut already
        assert cuts["again"] > 0, cuts
    _equal(ref, fast)


def test_prefix_aware_fleet_with_hash_ids_equals_stepping(cuts):
    # two prompt families: the router reads every replica's radix cache at each arrival, mid-run included
    sets = [*SHORT, "policies=sglang", "policy.sglang.prefix_cache=true", "workload.max_requests=80"]
    workload = load_workload(load_scenario("default", sets)).copy()
    blocks = [math.ceil(p / 512) for p in workload["prompt_tokens"]]
    workload["hash_ids"] = [[(i % 2) * 100_000 + j for j in range(n)] for i, n in enumerate(blocks)]
    workload.attrs["hash_block_tokens"] = 512
    runs = [
        simulate_cluster(
            load_scenario("default", [*sets, f"run.skip_ahead={s}"]), workload, "sglang", 3, "prefix_aware"
        )
        for s in ("false", "true")
    ]
    assert cuts["runs"] > 10, cuts
    _equal(*runs)
    assert runs[1].summary["prefix_hit_frac"] > 0


@pytest.mark.parametrize(
    "policy, extra",
    [
        pytest.param("sglang", ["workload.target_rate_per_s=12"], id="colocated"),
        pytest.param(
            "pulseinfer",
            [*PD, "serving.num_prefill_gpus=1", "policy.pulseinfer.offload_threshold_tokens=1500", "run.horizon_s=25"],
            id="pd-offloaded-horizon",
        ),
    ],
)
def test_round_robin_in_worker_processes_equals_one_environment(policy, extra):
    def run(workers: str, skip: str = "true"):
        scenario = load_scenario(
            "default", [*SHORT, f"policies={policy}", *extra, f"run.workers={workers}", f"run.skip_ahead={skip}"]
        )
        return simulate_cluster(scenario, load_workload(scenario), policy, 4, "round_robin")

    one = run("1")
    _equal(one, run("2"))  # worker processes
    _equal(one, run("1", "false"))  # and stepping


def test_simulate_merges_worker_processes_into_the_same_tables():
    from sim.run import simulate

    sets = [*SHORT, "policies=sglang", "serving.replicas=3", "serving.router=round_robin", "workload.max_requests=60"]
    one, pooled = (simulate(load_scenario("default", [*sets, f"run.workers={w}"])) for w in ("1", "3"))
    pd.testing.assert_frame_equal(one.summary, pooled.summary, check_exact=True)
    pd.testing.assert_frame_equal(one.replicas, pooled.replicas, check_exact=True)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_workers_is_a_one_line_error(value):
    with pytest.raises(ScenarioError) as err:
        load_scenario("default", [f"run.workers={value}"])
    line = str(err.value)
    assert "\n" not in line and "run.workers" in line and "'auto' or a whole number >= 1" in line, line


def test_pool_size():
    assert load_scenario("default", []).run.workers == "auto"
    assert load_scenario("default", ["run.workers=3"]).run.workers == 3
    assert pool_size(8, 3, 10) == 3 and pool_size(1, 64, 10**6) == 1
    assert pool_size("auto", 1, 10**6) == 1 and pool_size("auto", 64, 100) == 1  # one replica; too little work
    assert 1 <= pool_size("auto", 64, 10**6) <= 64


def test_timeout_at_fires_exactly_where_a_plain_difference_does_not():
    rng = np.random.default_rng(3)
    missed = unreachable = 0
    for _ in range(20_000):
        now = float(rng.uniform(0, 1)) * 10 ** float(rng.integers(-3, 3))
        then = now * float(rng.uniform(2, 1e4))  # past twice ``now`` the difference can round
        missed += now + (then - now) != then
        delay = delay_to(now, then)
        unreachable += delay is None
        assert delay is None or now + delay == then
        if missed < 5 or delay is None:
            env = simpy.Environment(initial_time=now)
            event = timeout_at(env, then)
            env.run(until=event)
            assert env.now == then
    assert missed > 0 and unreachable > 0  # both fallbacks were exercised


def test_first_at_finds_the_first_boundary_on_an_arrival():
    schedule = ArrivalSchedule([1.0, 2.5, 2.5, 7.0], 0.0)
    assert schedule.first_at(np.array([0.5, 2.0, 2.5, 7.0])) == 2
    assert schedule.first_at(np.array([0.5, 8.0])) == 2
    assert schedule.first_at(np.array([7.0])) == 0 and schedule.first_at(np.array([])) == 0
    assert ArrivalSchedule([], 0.0).first_at(np.array([1.0])) == 1
