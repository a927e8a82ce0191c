"""Admission (sim/serving/admission.py, sim/serving/decode_admission.py): each rule's one definition against its
per-step reference (tests/sim/oracles/admission.py), its feedback, and IO-adaptive admission in the scheduler."""

from __future__ import annotations

from collections import deque
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sim.config import load_scenario
from sim.policies import make_policy
from sim.run import simulate
from sim.serving import admission as admission_module
from sim.serving import io_admission
from sim.serving.admission import memory_waits
from sim.serving.io_admission import PHI_MAX, PHI_MIN, RecallBudget
from sim.serving.kv import KvState
from sim.serving.policy_admission import admission_of
from sim.serving.request import DecodeBatch, Request
from tests.sim.oracles import admission as oracle


@given(
    warm=st.integers(0, 500),
    cold=st.integers(0, 50),
    compute=st.floats(1e-5, 1e-2),
    slack=st.floats(-0.75, 2.0),
)
def test_admission_never_lets_predicted_recall_exceed_compute_plus_slack(warm, cold, compute, slack):
    adm = RecallBudget(slack, 0.05, warm_layer_s=2e-5, cold_layer_s=1.5e-4)
    if adm.allows(warm, cold, compute):
        assert adm.predicted_recall_s(warm, cold + 1) <= adm.phi * compute


def test_stall_shrinks_and_idle_link_grows_the_slack():
    adm = RecallBudget(0.0, 0.05, 1e-5, 1e-4)
    adm.observe([0.02], [0.005], [0.015])
    assert adm.phi == pytest.approx(0.8)
    adm.observe([0.02], [0.0], [0.001])
    assert adm.phi == pytest.approx(0.85)
    adm.observe([0.02] * 200, [0.02] * 200, [0.02] * 200)
    assert adm.phi == PHI_MIN
    adm.observe([0.02] * 200)  # no stall, the link idle
    assert adm.phi == PHI_MAX


_seconds = st.sampled_from([0.0, -1.0, 1e-4, 0.01, 0.015, 0.02]) | st.floats(0, 0.05)


@given(
    phi=st.sampled_from([PHI_MIN, 1.0, 2.4, 2.98, PHI_MAX]) | st.floats(PHI_MIN, PHI_MAX),
    target=st.sampled_from([0.0, 0.05, 0.3]),
    steps=st.lists(st.tuples(_seconds, _seconds, _seconds), max_size=120),
)
# growing steps at the cap skipped up to a shrinking one, then growing again; shrinking at the floor
@example(phi=PHI_MAX, target=0.3, steps=[(0.01, 0.0, 0.0), (0.01, 0.0, 0.0), (0.01, 0.01, 0.0), (0.01, 0.0, 0.0)])
@example(phi=PHI_MIN, target=0.05, steps=[(0.01, 0.01, 0.0)] * 20 + [(0.02, 0.0, 0.001)])
def test_aimd_of_a_run_equals_the_steps_one_by_one(phi, target, steps):
    """``RecallBudget.observe`` of a run (the tests of k steps at once, on Python floats or on arrays, the steps that
    leave φ as it is skipped) equals the oracle step by step: shrinking, growing, at the cap and at the floor, steps
    of length 0 or less."""
    one = phi
    for step_s, stall_s, busy_s in steps:
        one = oracle.aimd_step(one, target, step_s, stall_s, busy_s)
    step_s, stalls_s, busy_s = ([x[i] for x in steps] for i in range(3))
    for loop_steps in (0, 10**9):  # every run on arrays, every run on Python floats
        with mock.patch.object(io_admission, "AIMD_LOOP_STEPS", loop_steps):
            budget = RecallBudget(0.0, target, 0.0, 0.0)
            budget.phi = phi
            budget.observe(step_s, stalls_s, busy_s)
            assert budget.phi == one


@pytest.mark.parametrize("policy", ["sglang", "headwise", "pulseinfer"])
def test_feedback_of_k_steps_equals_k_runs_of_one(policy):
    """``on_decode_run`` of k steps leaves the admission (new_token_ratio; φ and last_attended for IO-adaptive) as k
    runs of one step do, from random states (the ratio at its floor and φ at its cap: the shortcuts)."""
    scenario = load_scenario("default", [])
    rng = np.random.default_rng(3)
    for _ in range(200):
        a, b = admission_of(make_policy(scenario, policy)), admission_of(make_policy(scenario, policy))
        ratio = float(rng.choice([a.ratio_min, rng.uniform(0.0, 1.0)]))
        a.new_token_ratio = b.new_token_ratio = ratio
        if hasattr(a, "budget"):
            a.budget.phi = b.budget.phi = float(rng.choice([0.25, 2.98, 3.0, rng.uniform(0.25, 3.0)]))
        k = int(rng.integers(1, 800))
        steps_s = rng.uniform(1e-4, 0.2, k).tolist()
        attended = rng.integers(1, 10**6, k).tolist()
        recalled = rng.random() < 0.5  # with measured stalls, or none (steps that recalled nothing)
        stalls = rng.uniform(0, 0.02, k).tolist() if recalled else [0.0] * k
        busy = rng.uniform(0, 0.2, k).tolist() if recalled else [0.0] * k
        for i in range(k):
            a.on_decode_run(steps_s[i : i + 1], attended[i : i + 1], stalls[i : i + 1], busy[i : i + 1])
        b.on_decode_run(steps_s, attended, stalls if recalled else None, busy if recalled else None)
        assert a.new_token_ratio == b.new_token_ratio
        if hasattr(a, "budget"):
            assert a.budget.phi == b.budget.phi and a.last_attended == b.last_attended


@given(
    need=st.integers(0, 10**6),
    growth=st.integers(0, 10**5),
    worst=st.integers(0, 10**6),
    cached=st.integers(0, 10**5),
    room=st.lists(st.integers(0, 2 * 10**6), min_size=1, max_size=8),
    reserved=st.floats(0, 10**6),
    ratio=st.floats(0, 1),
)
def test_memory_rule_over_decisions_equals_the_min_form(need, growth, worst, cached, room, reserved, ratio):
    """:func:`memory_waits` (two comparisons, scalars or arrays) equals ``min(need + growth·ratio, worst) − cached >
    room − reserved`` as ``Admission._try`` wrote it, bit for bit, also near the edge."""
    edge = need + growth * ratio - cached - reserved  # a room at which the float comparison is tight
    rooms = [*room, int(edge), int(edge) + 1, worst - cached - int(reserved)]
    expected = [min(need + growth * ratio, worst) - cached > r - reserved for r in rooms]
    assert [bool(memory_waits(need, growth, worst, cached, r, reserved, ratio)) for r in rooms] == expected
    rooms_arr = np.array(rooms, dtype=np.int64)
    reserved_arr = np.full(len(rooms), reserved)
    ratio_arr = np.full(len(rooms), ratio)
    assert memory_waits(need, growth, worst, cached, rooms_arr, reserved_arr, ratio_arr).tolist() == expected


def _random_state(rng, pol, disaggregated, steps):
    """A running batch (int64 columns) and a queued head for admission checks."""
    n = int(rng.integers(1, 3 if disaggregated else 12))
    batch = DecodeBatch(pol.recall_state_width)
    running = []
    for i in range(n):
        prompt, output = int(rng.integers(100, 20_000)), int(rng.integers(steps + 2, 3000))
        generated = int(rng.integers(1, output - steps))
        req = Request(i, 0.0, prompt, output, generated, prompt + generated, device_blocks=1)
        req.offloaded = bool(pol.wants_offload(prompt))
        running.append(req)
    batch.add(running)
    head = Request(999, 0.0, int(rng.integers(100, 20_000)), int(rng.integers(2, 3000)), 1 if disaggregated else 0)
    return batch, head


def _oracle_joins(adm, head, batch, kv, disaggregated):
    if disaggregated and hasattr(adm, "reserved_tokens"):
        return oracle.decode_budget_joins(adm, head, batch, kv)
    return oracle.memory_joins(adm, head, batch, kv, disaggregated)


@pytest.mark.parametrize(
    "policy, disaggregated, overrides",
    [
        ("sglang", False, ["policy.sglang.decode_scheduler=prefill_adder"]),  # memory rule, block 1
        ("sglang", True, []),  # SGLang's PD decode budget
        ("headwise", False, []),  # memory rule, block 16, offloaded heads and batch requests
        ("pulseinfer", True, ["policy.pulseinfer.offload_threshold_tokens=100000"]),  # IO-adaptive, dense heads
    ],
)
def test_select_and_quiet_decisions_equal_the_per_step_reference(policy, disaggregated, overrides):
    """The decision now (``select``) and at each of the next m decisions (``quiet_decisions``, the skip-ahead
    planner's question) equal the per-step reference asked after each step, near the admission edge."""
    pol = make_policy(load_scenario("default", overrides), policy)
    adm, bs, steps = admission_of(pol), pol.block_size, 40
    capacity, block_bytes = 2_000_000, bs * pol.model.kv_bytes_per_token
    rng = np.random.default_rng(11)

    def kv_with(free: int) -> KvState:
        kv = KvState(capacity, 2**50, block_bytes, 0)
        kv.device.used = capacity - free
        return kv

    def joins(batch, head, ratio, generated0, free, after_steps) -> bool:
        batch.generated = generated0 + after_steps
        adm.new_token_ratio = ratio
        adm.on_decode_run([0.0] * after_steps, [0] * after_steps)
        return _oracle_joins(adm, head, batch, kv_with(free), disaggregated)

    edges = 0
    for trial in range(200):
        batch, head = _random_state(rng, pol, disaggregated, steps)
        ratio0, generated0 = float(rng.uniform(adm.ratio_min, adm.ratio_init)), batch.generated.copy()
        lo, hi = 0, capacity  # the least free pool at which the head joins after one step (bisection)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if joins(batch, head, ratio0, generated0, mid, 1) else (mid + 1, hi)
        free0 = max(0, lo + int(rng.integers(-60, 10)) // bs)  # near the edge: within ~60 tokens' blocks
        # tokens taken per step: any non-increasing pool will do; up to n (as the batch grows) or faster
        growth = int(rng.integers(0, len(batch) + 1 if rng.random() < 0.5 else 3 * len(batch)))
        free = np.maximum(0, free0 - (np.arange(steps) * growth) // bs)
        expected = next((j for j in range(steps) if joins(batch, head, ratio0, generated0, int(free[j]), j + 1)), steps)
        for f in (free0 - 1, free0, free0 + 1):  # the decision now, the head fresh each time
            now = joins(batch, head, ratio0, generated0, max(0, f), 0)
            fresh = Request(999, 0.0, head.prompt_tokens, head.output_tokens, head.generated)
            taken = list(adm.select(deque([fresh]), batch, kv_with(max(0, f)), len(batch), lambda: True, disaggregated))
            assert bool(taken) == now, (trial, f)
        batch.generated, adm.new_token_ratio = generated0, ratio0
        quiet = adm.quiet_decisions(deque([head]), batch, kv_with(free0), free.astype(np.int64), disaggregated)
        assert quiet == expected, trial
        edges += 0 < expected < steps
    assert edges >= 15, edges  # the head joined mid-run often enough for the comparison to mean something


def test_admission_imports_nothing_from_the_policies():
    """Serving owns admission: it takes plain parameters (AdmissionParams), not the policy object."""
    import ast
    import inspect

    from sim.serving import decode_admission

    for module in (admission_module, decode_admission):
        tree = ast.parse(inspect.getsource(module))
        names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in names if m and m.startswith("sim.policies")], module.__name__


def _run(admission: str, h2d_gbps: float):
    scn = load_scenario(
        "default",
        [
            "policies=pulseinfer",
            "workload.max_requests=500",
            f"policy.pulseinfer.admission={admission}",
            f"hardware.h2d_bandwidth_gbps={h2d_gbps}",
            "run.progress=false",
        ],
    )
    return simulate(scn).policies["pulseinfer"].summary


@pytest.fixture(scope="module")
def slow_link_runs():
    return {a: _run(a, 5.5) for a in ("static", "io_adaptive")} | {"fast": _run("io_adaptive", 55.0)}


def test_slower_link_offloads_fewer_requests(slow_link_runs):
    assert slow_link_runs["io_adaptive"]["offloaded_frac"] < slow_link_runs["fast"]["offloaded_frac"]


def test_slower_link_keeps_stall_bounded_with_adaptive_admission(slow_link_runs):
    adaptive, static = slow_link_runs["io_adaptive"], slow_link_runs["static"]
    assert adaptive["stall_frac"] < 0.2
    assert adaptive["stall_frac"] < 0.5 * static["stall_frac"]


@pytest.mark.parametrize("time_scale", [0.6, 0.3])
def test_more_hbm_never_makes_the_tpot_tail_worse(time_scale):
    """Offloaded first, dense only as a fallback that keeps throughput and the TPOT SLO: more HBM adds room, it
    does not make long requests run dense and slow every step (the old dense-while-HBM-allows rule did)."""
    p99 = []
    for hbm_gib in (80, 140.4, 400):
        scn = load_scenario(
            "default",
            [
                "policies=pulseinfer",
                "workload.max_requests=600",
                f"workload.time_scale={time_scale}",
                f"hardware.hbm_gib={hbm_gib}",
                "run.progress=false",
            ],
        )
        p99.append(simulate(scn).policies["pulseinfer"].summary["tpot_p99_s"])
    assert all(later <= earlier * 1.02 for earlier, later in zip(p99, p99[1:])), p99


@pytest.mark.parametrize(
    "policy, disaggregated, overrides, rule",
    [
        ("sglang", False, ["policy.sglang.decode_scheduler=prefill_adder"], "memory_waits"),
        ("headwise", False, [], "memory_waits"),
        ("sglang", True, [], "budget_waits"),
    ],
)
def test_one_rule_decides_now_and_ahead(monkeypatch, policy, disaggregated, overrides, rule):
    """Mutation: a rule perturbed in its one place changes both the decision now (``select``) and the skip-ahead
    planner's answer (``quiet_decisions``)."""
    pol = make_policy(load_scenario("default", overrides), policy)
    adm = admission_of(pol)
    rng = np.random.default_rng(5)
    batch, head = _random_state(rng, pol, disaggregated, 8)
    free = np.full(8, 10**6, dtype=np.int64)

    def kv() -> KvState:
        return KvState(10**6, 2**50, pol.block_size * pol.model.kv_bytes_per_token, 0)

    def asked() -> tuple[bool, int]:
        fresh = Request(999, 0.0, head.prompt_tokens, head.output_tokens, head.generated)
        taken = list(adm.select(deque([fresh]), batch, kv(), len(batch), lambda: True, disaggregated))
        return bool(taken), adm.quiet_decisions(deque([head]), batch, kv(), free, disaggregated)

    assert asked() == (True, 0)  # an empty pool: the head joins now and at the first decision ahead
    if rule == "memory_waits":
        monkeypatch.setattr(admission_module, "memory_waits", lambda *args: np.full(np.shape(args[4]), True)[()])
    else:
        monkeypatch.setattr(type(adm), "budget_waits", lambda self, *args: np.full(np.shape(args[3]), True)[()])
    assert asked() == (False, len(free))  # the perturbed rule holds it back in both
