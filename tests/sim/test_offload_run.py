"""Skip-ahead over offloaded decode steps (sim/serving/decode.py: runs of steps that recall) equals stepping.

Whole runs with every request offloaded compare every table and the summary bit for bit with ``run.skip_ahead``
on and off, over the mechanisms that make offloaded steps differ (per-request state, topic shifts, fresh blocks,
a shared recall cache sized by the free pool, a fixed miss fraction, late corrections, D2H slowdown, each
``io``, interruptible and sequential scheduling, a measured selection cost, TP 2, IO-adaptive admission with a
queue). Each run checks that offloaded runs happened. Unit tests check the pieces: k steps of the recall model at
once equal k runs of one step (``RecallModel.step``) on the same streams (and leave the streams where k steps
leave them), and the compiled drift recurrence equals its Python source.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import load_scenario
from sim.config.loader import load_card
from sim.policies import make_policy
from sim.run import simulate
from sim.serving.replica import Replica
from sim.step.draws import RecallDraws
from sim.step.drift import compiled_drift_steps, drift_steps_py
from tests.sim.oracles.steps import commit_recall, recall_step
from tests.sim.test_skip_ahead import SHORT, SMALL_POOL, _assert_equal

ALL_OFFLOADED = ["policies=pulseinfer", "policy.pulseinfer.offload_threshold_tokens=16", "workload.max_requests=80"]


@pytest.fixture
def offloaded_runs(monkeypatch):
    """Counts the offloaded runs skip-ahead applied (``counts["runs"]``) and the steps they covered."""
    counts = {"runs": 0, "steps": 0}
    real = Replica._apply_run

    def apply(self, run):
        if run.recall is not None and run.steps >= 2:  # a skip-ahead run (a single step is a run of one)
            counts["runs"] += 1
            counts["steps"] += run.steps
        return real(self, run)

    monkeypatch.setattr(Replica, "_apply_run", apply)
    return counts


def _both(scenario: str, overrides: list[str]):
    ref = simulate(load_scenario(scenario, [*overrides, "run.skip_ahead=false"]))
    fast = simulate(load_scenario(scenario, [*overrides, "run.skip_ahead=true"]))
    return ref, fast


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="default-stats"),
        pytest.param(["recall_stats.burst_prob=0.05", "policy.pulseinfer.recall_cache=shared"], id="shifts-shared"),
        pytest.param(
            ["policy.pulseinfer.recall_cache=shared", "policy.pulseinfer.recall_cache_gib=0.05"], id="fixed-cache"
        ),
        pytest.param(["policy.pulseinfer.miss_frac=0.1"], id="fixed-miss"),
        pytest.param(
            ["policy.pulseinfer.lookahead_layers=3", "policy.pulseinfer.selection=headwise"], id="corrections"
        ),
        pytest.param(["policy.pulseinfer.io=batched", "hardware.d2h_coupling=0.5"], id="batched-d2h"),
        pytest.param(["policy.pulseinfer.io=per_fragment"], id="per-fragment"),
        # link-bound: steps stall and the link's queue carries into the next step
        pytest.param(
            [
                "hardware=a100-80gb",
                "policy.pulseinfer.budget_tokens=8192",
                "policy.pulseinfer.recall_buffer_blocks=512",
            ],
            id="link-bound",
        ),
        pytest.param(["model=llama-3.1-70b", "serving.tp_size=2", "run.tables=summary"], id="tp2-summary"),
        pytest.param([*SMALL_POOL, "policy.pulseinfer.admission=io_adaptive"], id="io-adaptive-queue"),
        pytest.param(["workload.target_rate_per_s=0.5", "run.timeline_step=40"], id="sparse-arrivals"),
        # the sequential pipeline: gather-scatter with D2H slowdown, per-fragment
        pytest.param(
            ["policy.pulseinfer.scheduling=sequential", "hardware.d2h_coupling=0.5"], id="sequential-gather-d2h"
        ),
        pytest.param(["policy.pulseinfer.scheduling=sequential", "policy.pulseinfer.io=per_fragment"], id="sequential"),
    ],
)
def test_tables_equal_with_and_without_offloaded_runs(extra, offloaded_runs):
    ref, fast = _both("default", [*SHORT, *ALL_OFFLOADED, *extra])
    assert offloaded_runs["runs"] > 10 and offloaded_runs["steps"] > 5 * offloaded_runs["runs"], offloaded_runs
    _assert_equal(ref, fast)


def test_measured_selection_cost_equal(tmp_path, offloaded_runs):
    hardware = {**load_card("hardware", "h100-sxm"), "name": "calibrated-h100", "measured": True}
    profile = {
        "name": "t",
        "hardware": hardware,
        "model": load_card("model", "llama-3.1-8b"),
        "compute": {
            "model": "llama-3.1-8b", "layer_base_us": 60.0, "layer_per_request_us": 2.0, "layer_per_token_ns": 0.4,
            "head_base_us": 300.0, "head_per_request_us": 5.0,
        },
        "selection": {"base_us": 20.0, "per_block_ns": 30.0},
    }  # fmt: skip
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    overrides = [*SHORT, *ALL_OFFLOADED, f"profile={path}", "hardware=null", "model=null"]
    ref, fast = _both("default", overrides)
    assert offloaded_runs["runs"] > 10, offloaded_runs
    _assert_equal(ref, fast)


def _policy(*overrides: str):
    scenario = load_scenario("default", ["policies=pulseinfer", *overrides])
    return make_policy(scenario, "pulseinfer")


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5),
    k=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    burst=st.sampled_from([0.0, 0.3]),
    shared=st.booleans(),
    headwise=st.booleans(),
    cold_first=st.booleans(),
)
def test_recall_run_equals_steps(n, k, seed, burst, shared, headwise, cold_first):
    overrides = [f"recall_stats.burst_prob={burst}", "recall_stats.burst_steps=2"]
    overrides += ["policy.pulseinfer.recall_cache=shared"] if shared else []
    overrides += ["policy.pulseinfer.selection=headwise"] if headwise else []
    model = _policy(*overrides).recall
    rng = np.random.default_rng(seed)
    # contexts that cross the window's block edges (fresh blocks) within the run
    ctx0 = rng.integers(600, 9000, n)
    cold = rng.random(n) < 0.5 if cold_first else np.zeros(n, dtype=bool)
    state0 = rng.normal(size=(n, model.state_width))
    state0[:, -1] = rng.integers(0, 3, n)
    cache = rng.uniform(0.0, 4e4, k) if shared else None
    ctx = ctx0[None, :] + np.arange(1, k + 1)[:, None]

    stepped_draws, run_draws = RecallDraws(np.random.default_rng(seed)), RecallDraws(np.random.default_rng(seed))
    state_ref = state0.copy()
    expected = []
    for t in range(k):
        c = cache[t] if shared else None
        rec = recall_step(
            model, ctx[t], cold if t == 0 else np.zeros(n, dtype=bool), stepped_draws, None, 1, state_ref, c
        )
        expected.append((rec.fragments[0], rec.selected_fragments[0]))
    run = model.run(ctx, cold, run_draws, None, 1, state0.copy(), cache)
    for t, (frags, selected) in enumerate(expected):
        np.testing.assert_array_equal(run.fragments[t], frags)
        assert run.selected_fragments[t] == selected
    j = 1 + seed % k  # commit a prefix: the streams and the state stand where j steps leave them
    state_run = state0.copy()
    commit_recall(run, j, state_run)
    replay_draws, state_replay = RecallDraws(np.random.default_rng(seed)), state0.copy()
    for t in range(j):
        c = cache[t] if shared else None
        recall_step(model, ctx[t], cold if t == 0 else np.zeros(n, dtype=bool), replay_draws, None, 1, state_replay, c)
    np.testing.assert_array_equal(state_run, state_replay)
    for name in ("change", "rounding", "burst", "join", "drift"):
        np.testing.assert_array_equal(getattr(run_draws, name).take(7), getattr(replay_draws, name).take(7))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), k=st.integers(1, 30), seed=st.integers(0, 2**31), burst=st.sampled_from([0.0, 0.2]))
def test_compiled_drift_equals_python(n, k, seed, burst):
    rng = np.random.default_rng(seed)
    x, left = rng.normal(size=n), rng.integers(0, 3, n).astype(float)
    z, starts, lengths = rng.normal(size=(k, n)), rng.random((k, n)), rng.geometric(0.4, (k, n)).astype(float)
    a = compiled_drift_steps()(
        x.copy(), left.copy(), z, starts, lengths, 0.35, float(np.sqrt(1 - 0.35**2)), burst, burst > 0
    )
    b = drift_steps_py(x.copy(), left.copy(), z, starts, lengths, 0.35, float(np.sqrt(1 - 0.35**2)), burst, burst > 0)
    for got, want in zip(a, b, strict=True):
        np.testing.assert_array_equal(got, want)


def test_kernels_preload_only_when_a_request_would_offload(monkeypatch):
    import sim.step.timing as timing
    from sim.serving.fleet import Fleet

    calls = []
    monkeypatch.setattr(timing, "preload_kernels", lambda kernels: calls.append(1))
    scenario = load_scenario("default", ["policies=sglang,pulseinfer", "run.progress=false"])
    threshold = scenario.policy["pulseinfer"].offload_threshold_tokens
    Fleet(scenario, "sglang", 1).preload_kernels(np.array([threshold * 4]))  # dense policy: never
    Fleet(scenario, "pulseinfer", 1).preload_kernels(np.array([threshold - 1, 10]))  # nobody offloads
    assert calls == []
    Fleet(scenario, "pulseinfer", 1).preload_kernels(np.array([10, threshold]))
    assert calls == [1]


def test_preloaded_kernels_run():
    from sim.step.timing import preload_kernels

    preload_kernels()  # each kernel on a tiny input: no error, no state
