"""Impossible numbers (issue 30): a run checks its own physics before reporting, and inputs that would make the clock
lose precision, or a recall cache that cannot exist, are refused before the run."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from sim.config import ScenarioError, load_scenario
from sim.config.checks import CLOCK_EXACT_STEPS, clock_problem
from sim.metrics.physics import (
    FRACTIONS,
    PER_DURATION,
    TPOTS,
    PhysicsBounds,
    PhysicsError,
    bounds_of,
    check_physics,
    min_step_s,
    physics_violations,
)
from sim.policies import make_policy
from sim.run import simulate
from sim.serving.cluster import simulate_cluster
from sim.step.draws import RecallDraws
from sim.workload import load_workload
from tests.sim.oracles.steps import recall_step

# Four synthetic requests long enough to run offloaded (≥ 8192 tokens), on the shipped default card and model.
LONG = [
    "workload.trace=null",
    "workload.time_scale=1",
    "workload.synthetic.num_requests=4",
    "workload.synthetic.rate_per_s=5",
    "workload.synthetic.prompt_tokens_mean=20000",
    "workload.synthetic.output_tokens_mean=40",
    "workload.synthetic.prompt_tokens_cv=0",
    "workload.synthetic.output_tokens_cv=0",
    "run.progress=false",
    "run.debug_checks=true",
]
SHARED = ["policies=pulseinfer", "policy.pulseinfer.recall_cache=shared", "engine=sglang-0.4"]  # 12.5 GiB reserve


def _scenario(*overrides: str):
    return load_scenario("default", [*LONG, *overrides])


@pytest.fixture(scope="module")
def real_run():
    """Every shipped policy on the four long requests: (scenario, result)."""
    scenario = _scenario("policies=sglang,full_offload,headwise,pulseinfer")
    return scenario, simulate(scenario)


# ---- the check itself --------------------------------------------------------------------------------------------


def test_a_real_small_run_passes_every_physics_check(real_run):
    scenario, result = real_run
    for name, policy_result in result.policies.items():
        summary = policy_result.summary
        bounds = bounds_of(make_policy(scenario, name))
        assert physics_violations(summary, bounds) == [], name
        assert summary["finished"] == 4 and summary["tpot_mean_s"] >= bounds.min_step_s


def test_min_step_is_the_tpot_of_one_short_request_alone():
    # one request of 16 prompt tokens, alone: each decode step is nearly the least step the roofline allows
    one = ["workload.synthetic.num_requests=1", "workload.synthetic.prompt_tokens_mean=16", "policies=sglang"]
    scenario = _scenario(*one)
    tpot = simulate(scenario).policies["sglang"].summary["tpot_mean_s"]
    least = min_step_s(make_policy(scenario, "sglang").compute)
    assert least <= tpot <= 1.01 * least


BOUNDS = PhysicsBounds(hbm_gib=140.4, link_gbps=55.0, min_step_s=0.0076)
# A fabricated summary row inside every bound, and one impossible value per bound.
GOOD = {
    "policy": "pulseinfer", "peak_hbm_gib": 80.0, "link_gbps_achieved": 54.0, **dict.fromkeys(FRACTIONS, 0.5),
    **dict.fromkeys(TPOTS, 0.009), "duration_s": 10.0,
}  # fmt: skip
# (summary column, an impossible value, the check named, the bound named)
VIOLATIONS = [
    ("peak_hbm_gib", 141.0, "peak_hbm_gib <= hardware.hbm_gib", 140.4),
    ("link_gbps_achieved", 305.1, "link_gbps_achieved <= the link's peak", 55.0),
    *[(name, 1.0004, f"0 <= {name} <= 1", 1.0) for name in FRACTIONS],
    ("stall_frac", -0.5, "0 <= stall_frac <= 1", 0.0),
    ("recall_miss_frac", float("nan"), "0 <= recall_miss_frac <= 1", 1.0),
    *[(name, 0.003, f"{name} >= the least decode step time", 0.0076) for name in TPOTS],
    ("tpot_p50_s", 0.0, "tpot_p50_s >= the least decode step time", 0.0076),
]


@pytest.fixture(scope="module")
def default_scenario():
    return load_scenario("default")


def test_the_fabricated_row_passes(default_scenario):
    assert physics_violations(GOOD, BOUNDS) == []
    check_physics(GOOD, BOUNDS, default_scenario)


@pytest.mark.parametrize(("column", "value", "check", "bound"), VIOLATIONS, ids=[f"{v[0]}={v[1]}" for v in VIOLATIONS])
def test_check_physics_raises_naming_check_measured_bound_and_scenario(default_scenario, column, value, check, bound):
    with pytest.raises(PhysicsError) as exc:
        check_physics({**GOOD, column: value}, BOUNDS, default_scenario)
    err = exc.value
    assert err.check.startswith(check) and err.bound == bound
    assert err.measured == value or (np.isnan(value) and np.isnan(err.measured))
    message = str(err)
    assert check in message and f"{bound:.6g}" in message and "'default'" in message and "'pulseinfer'" in message
    assert "bug" in message and "\n" not in message


def test_undefined_tpot_passes_and_every_violation_is_counted(default_scenario):
    assert physics_violations({**GOOD, **dict.fromkeys(TPOTS, np.nan)}, BOUNDS) == []
    bad = {**GOOD, "peak_hbm_gib": 200.0, "link_busy_frac": 2.0}
    assert [v.check for v in physics_violations(bad, BOUNDS)] == [
        "peak_hbm_gib <= hardware.hbm_gib",
        "0 <= link_busy_frac <= 1",
    ]
    with pytest.raises(PhysicsError, match=r"1 more check"):
        check_physics(bad, BOUNDS, default_scenario)


def test_physics_error_survives_pickling_to_leave_a_worker_process():
    err = pickle.loads(pickle.dumps(PhysicsError("peak_hbm_gib <= hardware.hbm_gib", 141.0, 140.4, "scenario 'x'")))
    assert (err.check, err.measured, err.bound) == ("peak_hbm_gib <= hardware.hbm_gib", 141.0, 140.4)
    assert "141" in str(err)


def test_cluster_link_rate_is_one_links_rate_not_the_replicas_sum():
    # two replicas each near the link's peak: the cluster row once reported the sum of their rates (bytes of both
    # over the busy time of one), past the link's peak, which the physics check now refuses
    scenario = _scenario("policies=pulseinfer", "workload.synthetic.num_requests=8", "workload.synthetic.rate_per_s=50")
    result = simulate_cluster(scenario, load_workload(scenario), "pulseinfer", 2)
    summary = result.summary
    assert min(result.routed) > 0 and summary["link_gbps_achieved"] > 0
    assert summary["link_gbps_achieved"] <= scenario.hardware.h2d_bandwidth_gbps


# ---- the shared recall cache: refused when it cannot exist; its miss fraction never above 1 ----------------------


def test_recall_cache_larger_than_the_free_hbm_is_refused_naming_the_gib_available():
    with pytest.raises(ScenarioError) as exc:
        _scenario(*SHARED, "policy.pulseinfer.recall_cache_gib=101")
    message = str(exc.value)
    assert "policy.pulseinfer.recall_cache_gib: 101 GiB" in message
    assert "100.39 GiB of HBM left" in message and "at most 100.3" in message
    with pytest.raises(ScenarioError, match=r"recall_cache_gib: 100000 GiB"):
        _scenario(*SHARED, "policy.pulseinfer.recall_cache_gib=100000")


def test_recall_cache_that_fits_with_one_block_to_spare_is_accepted():
    # 100.39 GiB is left for KV (140.4 − 12.5 reserve − 27.51 weights); 100 GiB leaves room
    _scenario(*SHARED, "policy.pulseinfer.recall_cache_gib=100")


def test_recall_cache_smaller_than_one_block_is_refused():
    with pytest.raises(ScenarioError, match=r"recall_cache_gib: 1e-09 GiB is smaller than one KV block"):
        _scenario(*SHARED, "policy.pulseinfer.recall_cache_gib=1e-9")


def test_recall_cache_is_checked_per_gpu_of_a_tensor_parallel_group():
    # at tp 2 each GPU holds half the weights, so 110 GiB of cache fits per GPU where it cannot at tp 1
    with pytest.raises(ScenarioError, match="recall_cache_gib: 110 GiB"):
        _scenario(*SHARED, "policy.pulseinfer.recall_cache_gib=110")
    _scenario(*SHARED, "policy.pulseinfer.recall_cache_gib=110", "serving.tp_size=2")


def test_thrashing_shared_cache_misses_exactly_every_selected_block():
    # one block of cache: every step thrashes (q = 1); the fresh block was recalled on top (miss fraction 1.0004)
    summary = simulate(_scenario(*SHARED, "policy.pulseinfer.recall_cache_gib=0.003")).policies["pulseinfer"].summary
    assert summary["offloaded_frac"] > 0 and summary["recall_miss_frac"] == 1.0


def test_a_cell_never_recalls_more_than_it_selects():
    scenario = _scenario(*SHARED)
    recall = make_policy(scenario, "pulseinfer").recall
    # contexts where the block leaving the recent window is fresh this step (every one of them)
    ctx = recall.window_tokens + recall.block_size * np.arange(200, 264, dtype=np.int64)
    cold = np.zeros(len(ctx), dtype=bool)
    rec = recall_step(recall, ctx, cold, RecallDraws(np.random.default_rng(0)), cache_fragments=0.0)  # thrashing
    assert rec.fragments.sum() == rec.selected_fragments  # each cell misses its whole selection, once


# ---- the clock -----------------------------------------------------------------------------------------------------


def test_clock_problem_allows_just_below_and_refuses_at_the_bound():
    assert clock_problem("workload.time_scale", 1.0, 0.999 * CLOCK_EXACT_STEPS, 1.0, "up") is None
    line = clock_problem("workload.time_scale", 1.0, 2.0 * CLOCK_EXACT_STEPS, 1.0, "up")
    assert line.startswith("workload.time_scale: 1 ") and "use at most 0.5" in line
    line = clock_problem("workload.synthetic.rate_per_s", 1.0, 4.0 * CLOCK_EXACT_STEPS, 1.0, "down")
    assert "use at least 4" in line


def test_time_scale_that_outruns_float64_is_refused_before_the_run():
    scenario = load_scenario("default", ["workload.max_requests=20", "workload.time_scale=1e12", "policies=sglang"])
    with pytest.raises(ScenarioError) as exc:
        simulate(scenario)
    message = str(exc.value)
    assert message.startswith("workload.time_scale: 1e+12 puts the simulated clock at ") and "use at most" in message


def test_arrival_rate_that_outruns_float64_is_refused_before_the_run():
    scenario = _scenario("policies=sglang", "workload.synthetic.rate_per_s=1e-300")
    with pytest.raises(ScenarioError, match=r"^workload\.synthetic\.rate_per_s: 1e-300 .* use at least "):
        simulate(scenario)


@pytest.mark.parametrize(
    "override",
    ["hardware.hbm_bandwidth_gbps=1e-9", "hardware.h2d_bandwidth_gbps=1e9", "hardware.bf16_tflops=1e-12",
     "hardware.h2d_latency_us=1e300"],
)  # fmt: skip
def test_hardware_rate_outside_physical_range_is_refused_naming_field_value_and_range(override):
    key, value = override.split("=")
    with pytest.raises(ScenarioError) as exc:
        load_scenario("default", [override])
    assert str(exc.value).startswith(f"{key}: {float(value):g}") and "outside the physical range [" in str(exc.value)


# ---- the D2H queue has no back-pressure: work queued past the end of the run is a backlog, not busy time --------


SLOW_D2H = ["workload.max_requests=20", "hardware.d2h_bandwidth_gbps=0.01", "policies=pulseinfer"]


def test_d2h_work_queued_past_the_end_is_a_backlog_not_busy_time():
    """Issue 30: ``hardware.d2h_bandwidth_gbps=0.01`` reported ``d2h_busy_frac`` 1.49 (all queued seconds / the run's
    duration) and a false physics bug."""
    scenario = load_scenario("default", SLOW_D2H)
    summary = simulate(scenario).policies["pulseinfer"].summary  # check_physics runs inside
    assert summary["d2h_backlog_s"] > summary["duration_s"]  # the link could not keep up
    assert 0.5 < summary["d2h_busy_frac"] <= 1.0  # saturated, never more than all the time


def test_a_cluster_subtracts_the_mean_backlog_of_its_replicas():
    scenario = load_scenario("default", [*SLOW_D2H, "workload.max_requests=24"])
    result = simulate_cluster(scenario, load_workload(scenario), "pulseinfer", 2)
    summary = result.summary  # check_physics runs inside
    assert min(result.routed) > 0 and summary["d2h_backlog_s"] > 0
    assert 0.5 < summary["d2h_busy_frac"] <= 1.0


def test_the_console_says_when_d2h_writes_are_still_queued_at_the_end():
    import pandas as pd

    from pulseinfer.report import format_summary

    row = {"policy": "p", "duration_s": 10.0, "d2h_busy_frac": 1.0}
    text = format_summary(pd.DataFrame([{**row, "d2h_backlog_s": 5.0}, {**row, "policy": "q", "d2h_backlog_s": 0.0}]))
    assert "note: D2H offload writes still queued at the end of the run (d2h_backlog_s): p 5.0 s" in text
    assert "q 0.0" not in text


# ---- a run that issued nothing before the horizon: no duration, and no false physics bug ------------------------


def _late_session_scenario(tmp_path, horizon_s: float):
    folder = tmp_path / "sessions"
    folder.mkdir()
    session = {
        "id": "s0",
        "block_size": 64,
        "requests": [{"t": 0, "type": "n", "in": 200, "out": 5, "think_time": 1.5}],
    }
    (folder / "trace_0000.json").write_text(json.dumps(session))
    overrides = ["policies=sglang", "workload.time_scale=1", "workload.format=kvcache_tester", "run.progress=false"]
    return load_scenario("ablation", [*overrides, f"workload.trace={folder}", f"run.horizon_s={horizon_s}"])


def test_a_run_that_issued_nothing_before_the_horizon_has_no_duration_and_passes_physics(tmp_path):
    """Issue 30: a session's first think time at or past ``run.horizon_s`` issued nothing; ``duration_s`` was NaN
    and the physics check reported a false ``bug:`` (``link_busy_frac`` NaN)."""
    summary = simulate(_late_session_scenario(tmp_path, 0.3)).policies["sglang"].summary  # check_physics inside
    assert (summary["finished"], summary["unfinished"]) == (0, 1)
    per_duration = ["duration_s", "decode_tokens_per_s", "goodput_requests_per_s", *PER_DURATION]
    assert all(np.isnan(summary[name]) for name in per_duration)
    assert all(not np.isnan(summary[name]) for name in FRACTIONS if name not in PER_DURATION)


def test_the_same_session_issued_before_the_horizon_has_a_duration(tmp_path):
    summary = simulate(_late_session_scenario(tmp_path, 3.0)).policies["sglang"].summary
    assert summary["finished"] == 1 and summary["duration_s"] > 0
    assert all(0 <= summary[name] <= 1 for name in FRACTIONS)


def test_nan_busy_fractions_pass_only_when_the_duration_is_undefined():
    row = {**GOOD, "duration_s": np.nan, **dict.fromkeys(PER_DURATION, np.nan)}
    assert physics_violations(row, BOUNDS) == []
    checks = [v.check for v in physics_violations({**row, "duration_s": 10.0}, BOUNDS)]
    assert checks == [f"0 <= {name} <= 1" for name in PER_DURATION]
    checks = [v.check for v in physics_violations({**row, "link_busy_frac": 0.5}, BOUNDS)]
    assert checks == ["link_busy_frac is NaN when duration_s is (nothing issued)"]


def test_the_console_says_when_nothing_arrived_before_the_horizon():
    import pandas as pd

    from pulseinfer.report import format_summary

    text = format_summary(pd.DataFrame([{"policy": "p", "duration_s": np.nan}, {"policy": "q", "duration_s": 1.0}]))
    assert "note: nothing arrived before the horizon (p)" in text
