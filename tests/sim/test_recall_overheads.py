"""What an offloaded step pays beyond compute and copies, and HiCache's own costs.

Offloaded steps (``OffloadServing.step_costs``, one definition over a step axis): a step that recalls with
host-issued copies runs its layers eagerly (``eager_launch_us_per_layer``) and waits on each recalling layer's copy
event (``event_wait_us``); a step that recalls nothing keeps the CUDA graph and pays neither. Selection costs
``selection_launch_us + selection_per_block_ns · C`` per layer on every step with offloaded requests, the same
``SelectionProfile`` a calibrated profile's measured section replaces. Checked against the per-step oracle bit for
bit, for k = 1 and k > 1, and by the mutation pattern of tests/sim/test_one_definition.py.

HiCache (sim/serving/prefix.py): new nodes are written through to host over the D2H queue; host-tier node
operations cost ``hicache_node_op_us`` each in the next prefill forward; a run without HiCache queues nothing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim import load_scenario
from sim.policies import make_policy
from sim.policies.offload import OffloadServing
from sim.run import simulate, simulate_policy
from sim.serving.prefix import PrefixCache, host_tier_forward
from sim.step.draws import RecallDraws
from sim.step.timing import StepDevices
from tests.sim.oracles import offload_cost
from tests.sim.oracles.steps import at, step_cost
from tests.sim.test_one_definition import SMALL
from tests.sim.test_profile import COMPUTE, _profile, _scenario
from tests.sim.test_skip_ahead import _assert_equal

OVERHEADS = [
    "policy.pulseinfer.eager_launch_us_per_layer=40", "policy.pulseinfer.event_wait_us=7",
    "policy.pulseinfer.selection_launch_us=9", "policy.pulseinfer.selection_per_block_ns=3",
]  # fmt: skip
NONE = [
    "policy.pulseinfer.eager_launch_us_per_layer=0", "policy.pulseinfer.event_wait_us=0",
    "policy.pulseinfer.selection_launch_us=0", "policy.pulseinfer.selection_per_block_ns=0",
]  # fmt: skip


def _policy(*overrides: str) -> OffloadServing:
    return make_policy(load_scenario("default", ["policies=pulseinfer", *overrides]), "pulseinfer")


def _run(pol: OffloadServing, k: int, seed: int = 0):
    """k steps of a 3-request batch (two offloaded, one cold) from one k-step call, and the same k steps one at a
    time (k calls of ``step_cost``)."""
    ctx = np.array([20_000, 30_000, 5_000])
    offloaded, cold = np.array([True, True, False]), np.array([True, False, False])
    steps = ctx[None, :] + np.arange(k)[:, None]
    free = np.full(k, 10**10)
    many = pol.step_costs(steps, offloaded, cold, RecallDraws(np.random.default_rng(seed)), None, free)
    draws = RecallDraws(np.random.default_rng(seed))
    ones = [
        step_cost(pol, steps[t], offloaded, cold if t == 0 else np.zeros(3, bool), draws, None, 10**10)
        for t in range(k)
    ]
    return many, ones


def test_a_recalling_step_pays_eager_launches_and_event_waits_and_a_recall_free_one_keeps_the_graph():
    # miss_frac 0: only the cold request's first step recalls; the others hit their buffers and recall nothing
    paid, free = (_policy("policy.pulseinfer.miss_frac=0.0", *o) for o in (OVERHEADS[:2], NONE))
    (paid_k, paid_1), (free_k, free_1) = _run(paid, 4), _run(free, 4)
    assert (paid_k.recall_bytes > 0).tolist() == [True, False, False, False]
    for t in range(4):
        a_k, b_k = at(paid_k, t), at(free_k, t)
        assert a_k.compute_s == paid_1[t].compute_s and b_k.compute_s == free_1[t].compute_s  # k = 1 as k > 1
        extra = np.array(a_k.compute_s) - np.array(b_k.compute_s)
        if t == 0:  # every layer eager; a wait where the layer recalls
            want = 40e-6 + 7e-6 * (np.asarray(a_k.layer_bytes) > 0)
            np.testing.assert_allclose(extra, want, rtol=1e-9, atol=1e-15)
        else:
            assert not extra.any()


def test_gpu_gather_and_inline_io_keep_their_graph():
    # a GPU gather kernel is captured in the graph; the CPU engine (I/O inline) never had one
    for io in (["policy.pulseinfer.io=gpu_gather"], ["hardware.io_overlaps_compute=false"]):
        pol = _policy(*io, *OVERHEADS)
        assert pol.eager_launch_s == pol.event_wait_s == 0.0
    assert _policy(*OVERHEADS).eager_launch_s == pytest.approx(40e-6)


def test_selection_costs_every_offloaded_step_by_its_candidate_blocks():
    sel, bare = (_policy("policy.pulseinfer.miss_frac=0.0", *o) for o in ([*NONE[:2], *OVERHEADS[2:]], NONE))
    (sel_k, sel_1), (bare_k, _) = _run(sel, 3), _run(bare, 3)
    for t in range(3):
        ctx = np.array([20_000, 30_000]) + t
        candidates = int(sel.candidate_blocks(ctx, np.array([True, True])).sum())
        extra = np.array(at(sel_k, t).compute_s) - np.array(at(bare_k, t).compute_s)
        np.testing.assert_allclose(extra, 9e-6 + 3e-9 * candidates, rtol=1e-12)  # recalling or not
        assert at(sel_k, t).compute_s == sel_1[t].compute_s
        assert sel_k.attended_tokens[t] == bare_k.attended_tokens[t]  # summaries still read as tokens
    assert bare.selection_cost is None and not _policy(*NONE, "policies=sglang,pulseinfer").selection_cost


def test_a_measured_selection_cost_replaces_the_default_parameters(tmp_path):
    selection = {"base_us": 100.0, "per_block_ns": 50.0}
    overrides = ["policy.pulseinfer.selection_launch_us=9", "policy.pulseinfer.selection_per_block_ns=3"]
    measured = make_policy(
        _scenario(tmp_path, _profile(tmp_path, compute=COMPUTE, selection=selection), None, overrides), "pulseinfer"
    )
    default = make_policy(_scenario(tmp_path, _profile(tmp_path, compute=COMPUTE), None, overrides), "pulseinfer")
    assert (measured.selection_cost.base_us, measured.selection_cost.per_block_ns) == (100.0, 50.0)
    assert (default.selection_cost.base_us, default.selection_cost.per_block_ns) == (9.0, 3.0)
    assert not measured.summaries_attended and default.summaries_attended


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="sequential"),
        pytest.param(["policy.pulseinfer.scheduling=interruptible", "policy.pulseinfer.micro_batches=2"], id="groups"),
        pytest.param(["policy.pulseinfer.scheduling=interruptible", "policy.pulseinfer.io=per_fragment"], id="frag"),
        pytest.param(["policy.pulseinfer.selection=headwise", "policy.pulseinfer.io=batched"], id="headwise"),
    ],
)
def test_step_cost_with_overheads_equals_its_per_step_oracle(extra):
    pol = _policy("recall_stats.fresh_block_frac=0.5", *OVERHEADS, *extra)
    rng = np.random.default_rng(11)
    for _ in range(4):
        n = int(rng.integers(1, 6))
        ctx, offloaded, cold = rng.integers(16, 20_000, n), rng.random(n) < 0.7, rng.random(n) < 0.3
        state = rng.normal(size=(n, pol.recall_state_width))
        state_ref, seed = state.copy(), int(rng.integers(2**31))
        got = step_cost(pol, ctx, offloaded, cold, RecallDraws(np.random.default_rng(seed)), state, 10**10)
        want = offload_cost.step_cost(
            pol, ctx, offloaded, cold, RecallDraws(np.random.default_rng(seed)), state_ref, 10**10
        )
        assert got.compute_s == want.compute_s and got.recall_bytes == want.recall_bytes
        np.testing.assert_array_equal(state, state_ref)


def _simulate(skip_ahead: bool, *overrides: str):
    result = simulate(load_scenario("default", [*SMALL, f"run.skip_ahead={str(skip_ahead).lower()}", *overrides]))
    return result, result.policies["pulseinfer"].steps


def test_overheads_move_one_step_and_k_step_runs_alike(monkeypatch):
    """The mutation pattern of tests/sim/test_one_definition.py: the new costs, set high, move a stepped run and a
    skip-ahead run alike, and the two stay equal bit for bit."""
    high = ["policy.pulseinfer.eager_launch_us_per_layer=300", "policy.pulseinfer.event_wait_us=100",
            "policy.pulseinfer.selection_launch_us=100", "policy.pulseinfer.selection_per_block_ns=20"]  # fmt: skip
    k_steps = []
    real_costs = OffloadServing.step_costs

    def step_costs(self, ctx, *args):
        k_steps.append(len(ctx))
        return real_costs(self, ctx, *args)

    monkeypatch.setattr(OffloadServing, "step_costs", step_costs)
    (_, base_one), (_, base_k) = _simulate(False, *NONE), _simulate(True, *NONE)
    (one, one_s), (many, many_s) = _simulate(False, *high), _simulate(True, *high)
    assert max(k_steps) > 1  # the skip-ahead runs costed offloaded steps k at once
    _assert_equal(one, many)
    decode = [s[s["phase"] == "decode"]["duration_s"].sum() for s in (base_one, base_k, one_s, many_s)]
    assert decode[0] == decode[1] and decode[2] == decode[3] > 1.2 * decode[0]


# --- HiCache ---------------------------------------------------------------------------------------------------

BT = 512


def test_hicache_writes_new_nodes_through_once_and_counts_its_node_operations():
    cache = PrefixCache(1, host_tier=True)
    path, _, _ = cache.acquire([1, 2, 3], 1024 + 100, BT, 0.0)  # 3 new nodes: 512 + 512 + 100 tokens
    assert (cache.host_write_tokens, cache.host_node_ops) == (1124, 3)
    assert host_tier_forward(cache, 1.0, 0.0) == (1.0, 1124) and cache.host_write_tokens == cache.host_node_ops == 0
    cache.release(path, 0.0)
    cache.evict(10**9)  # backed up already: eviction writes nothing, 3 node operations
    path, hit, _ = cache.acquire([1, 2, 3], 1024 + 100, BT, 1.0)  # reloaded from host: no write, 3 operations
    assert hit == 1123 and (cache.host_write_tokens, cache.host_node_ops) == (0, 6)
    assert host_tier_forward(cache, 1.0, 250.0) == (pytest.approx(1.0 + 6 * 250e-6, rel=1e-12), 0)
    plain = PrefixCache(1)
    plain.acquire([1, 2, 3], 1124, BT, 0.0)
    assert host_tier_forward(plain, 1.0, 250.0) == (1.0, 0)


def _rows() -> pd.DataFrame:
    rows = [(0.0, 1600, 2, [1, 2, 3, 4]), (1.0, 1700, 2, [9]), (100.0, 1600, 2, [1, 2, 3, 5])]
    df = pd.DataFrame({
        "request_id": range(3), "arrival_s": [r[0] for r in rows], "prompt_tokens": [r[1] for r in rows],
        "output_tokens": [r[2] for r in rows], "hash_ids": [r[3] for r in rows],
    })  # fmt: skip
    df.attrs["hash_block_tokens"] = BT
    return df


def _hicache_runs(monkeypatch, *overrides: str):
    queued: list[float] = []
    real = StepDevices.queue_d2h

    def queue_d2h(self, now_s, nbytes):
        queued.append(nbytes)
        return real(self, now_s, nbytes)

    monkeypatch.setattr(StepDevices, "queue_d2h", queue_d2h)
    base = ["serving.prefill=colocated", "policies=sglang,sglang_hicache", "run.progress=false"]
    scn = load_scenario("default", [*base, "run.debug_checks=true", *overrides])
    out = {}
    for name in ("sglang", "sglang_hicache"):
        queued.clear()
        out[name] = (simulate_policy(scn, _rows(), name), sum(queued))
    return scn, out


def test_a_hicache_run_queues_its_writes_on_d2h_and_a_run_without_it_queues_none(monkeypatch):
    scn, out = _hicache_runs(monkeypatch)
    (plain, plain_bytes), (hicache, hicache_bytes) = out["sglang"], out["sglang_hicache"]
    # new nodes (the trace's hash blocks: 4, 1 and, after a 3-block hit, 1) are written through once
    new_tokens = 1600 + 512 + (1600 - 1536)
    assert plain_bytes == 0 and hicache_bytes == new_tokens * scn.model.kv_bytes_per_token
    assert hicache.summary["d2h_busy_frac"] > 0 == plain.summary["d2h_busy_frac"]
    # the bookkeeping knob changes nothing without a host tier, and charges each node operation with one
    _, costly = _hicache_runs(
        monkeypatch, "policy.sglang.hicache_node_op_us=500", "policy.sglang_hicache.hicache_node_op_us=500"
    )
    pd.testing.assert_frame_equal(costly["sglang"][0].steps, plain.steps, check_exact=True)
    prefill = [r.steps.query("phase == 'prefill'")["duration_s"] for r in (hicache, costly["sglang_hicache"][0])]
    ops = (prefill[1].to_numpy() - prefill[0].to_numpy()) / 500e-6
    np.testing.assert_allclose(ops, np.round(ops), atol=1e-6)
    assert ops.sum() == pytest.approx(4 + 1 + 1)  # 4 + 1 new nodes, then the third request's one new node
