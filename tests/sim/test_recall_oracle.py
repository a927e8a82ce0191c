"""The recall model and the offloaded step cost, defined once over a step axis in sim/ (``RecallModel.run``,
``OffloadServing.step_costs``; a single step is a run of one), equal their per-step references
(tests/sim/oracles/recall.py, tests/sim/oracles/offload_cost.py) bit for bit on seeded random inputs: every number,
the streams' positions and the per-request recall state after several consecutive steps."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import load_scenario
from sim.policies import make_policy
from sim.step.draws import RecallDraws
from tests.sim.oracles import offload_cost, recall, recall_step

STREAMS = ("change", "rounding", "burst", "join", "drift")


def _policy(name: str, overrides: list[str]):
    scenario = load_scenario("default", [f"policies={name}", *overrides])
    return make_policy(scenario, name)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 6),
    groups=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    selection=st.sampled_from(["solohead", "headwise", "all"]),
    cache=st.sampled_from(["buffer", "shared", "thrash"]),
    burst=st.sampled_from([0.0, 0.4]),
    fixed=st.booleans(),
)
def test_recall_model_equals_its_per_step_oracle(n, groups, seed, selection, cache, burst, fixed):
    overrides = [f"recall_stats.burst_prob={burst}", "recall_stats.burst_steps=2", "recall_stats.fresh_block_frac=0.5"]
    overrides += [f"policy.pulseinfer.selection={selection}", "policy.pulseinfer.block_size=16"]
    overrides += ["policy.pulseinfer.miss_frac=0.2"] if fixed else []
    overrides += ["policy.pulseinfer.recall_cache=shared"] if cache != "buffer" else []
    model = _policy("pulseinfer", overrides).recall
    rng = np.random.default_rng(seed)
    ctx = rng.integers(16, 9000, n)
    ctx[: n // 2] = model.window_tokens + model.block_size * rng.integers(1, 50, n // 2) - 1  # fresh next step
    cold = rng.random(n) < 0.4
    gid = rng.integers(0, groups, n)
    state = rng.normal(size=(n, model.state_width))
    state[:, -1] = rng.integers(0, 3, n)
    state_ref = state.copy()
    draws, draws_ref = RecallDraws(np.random.default_rng(seed)), RecallDraws(np.random.default_rng(seed))
    for t in range(4):
        capacity = None if cache == "buffer" else (1.0 if cache == "thrash" else float(rng.uniform(0.0, 4e4)))
        got = recall_step.step(
            model, ctx + t, cold if t == 0 else np.zeros(n, dtype=bool), draws, gid, groups, state, capacity
        )
        nbytes, frags, contiguous, selected = recall.step(
            model, ctx + t, cold if t == 0 else np.zeros(n, dtype=bool), draws_ref, gid, groups, state_ref, capacity
        )
        np.testing.assert_array_equal(got.nbytes[0], nbytes)
        np.testing.assert_array_equal(got.fragments[0], frags)
        assert got.selected_fragments[0] == selected
        if contiguous is None:
            assert got.contiguous_s is None
        else:
            np.testing.assert_array_equal(got.contiguous_s[0], contiguous)
        np.testing.assert_array_equal(state, state_ref)
    for name in STREAMS:
        np.testing.assert_array_equal(getattr(draws, name).take(5), getattr(draws_ref, name).take(5))


POLICY_CASES = [
    ("pulseinfer", []),
    ("pulseinfer", ["policy.pulseinfer.scheduling=interruptible", "policy.pulseinfer.io=gather_scatter"]),
    ("pulseinfer", ["policy.pulseinfer.scheduling=interruptible", "policy.pulseinfer.micro_batches=2"]),
    ("pulseinfer", ["policy.pulseinfer.scheduling=interruptible", "policy.pulseinfer.io=gpu_gather",
                    "policy.pulseinfer.lookahead_layers=2", "policy.pulseinfer.micro_batches=3"]),
    ("pulseinfer", ["policy.pulseinfer.scheduling=sequential", "policy.pulseinfer.io=gpu_gather"]),
    ("pulseinfer", ["policy.pulseinfer.scheduling=sequential", "policy.pulseinfer.io=per_fragment"]),
    ("pulseinfer", ["policy.pulseinfer.io=batched", "policy.pulseinfer.recall_cache=shared"]),
    ("pulseinfer", ["policy.pulseinfer.recall_cache=shared", "policy.pulseinfer.recall_cache_gib=0.05"]),
    ("pulseinfer", ["hardware.io_overlaps_compute=false", "policy.pulseinfer.micro_batches=2",
                    "policy.pulseinfer.scheduling=interruptible"]),
    ("headwise", ["policy.headwise.lookahead_layers=3"]),
    ("full_offload", []),
    ("full_offload", ["policy.full_offload.io=batched", "hardware.io_overlaps_compute=false"]),
]  # fmt: skip


@settings(max_examples=40, deadline=None, derandomize=True)
@given(case=st.sampled_from(POLICY_CASES), n=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_step_cost_equals_its_per_step_oracle(case, n, seed):
    name, overrides = case
    pol = _policy(name, ["recall_stats.burst_prob=0.3", "recall_stats.fresh_block_frac=0.5", *overrides])
    rng = np.random.default_rng(seed)
    ctx = rng.integers(16, 20_000, n)
    offloaded, cold = rng.random(n) < 0.7, rng.random(n) < 0.3
    width = pol.recall_state_width
    state = rng.normal(size=(n, width))
    state_ref = state.copy()
    draws, draws_ref = RecallDraws(np.random.default_rng(seed)), RecallDraws(np.random.default_rng(seed))
    for t in range(3):
        free = int(rng.integers(0, 2**34))
        c = cold if t == 0 else np.zeros(n, dtype=bool)
        got = pol.step_cost(ctx + t, offloaded, c, draws, state, free)
        want = offload_cost.step_cost(pol, ctx + t, offloaded, c, draws_ref, state_ref, free)
        for field in want.__slots__:
            a, b = getattr(got, field), getattr(want, field)
            if field == "interrupt" and b is not None:
                assert (a.lookahead_items, a.chunk_bytes) == (b.lookahead_items, b.chunk_bytes)
                np.testing.assert_array_equal(a.prefetch, b.prefetch)
                np.testing.assert_array_equal(a.correction, b.correction)
            elif isinstance(b, np.ndarray):
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b and type(a) is type(b), (field, a, b)
        np.testing.assert_array_equal(state, state_ref)
    for name in STREAMS:
        np.testing.assert_array_equal(getattr(draws, name).take(5), getattr(draws_ref, name).take(5))
