"""The layer pipeline (sim/step/pipeline.py ``time_steps``, through ``StepDevices.time_steps``) equals the per-step
oracles of tests/sim/oracles/step_timing.py bit for bit, compiled by numba and run as Python: one step of either
pipeline with its D2H queue, slowdown and intervals, and k steps in order against k oracle steps; and over whole
simulations (every table) with ``run.kernels`` ``python`` vs ``numba``.

The numba cases are skipped when numba is not installed (`pip install -e '.[fast]'`); .ci/run installs it and sets
PULSEINFER_CI=1, under which a missing numba fails these instead.
"""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pandas as pd
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import ScenarioError, load_scenario
from sim.config import HardwareSpec
from sim.config.loader import load_card
from sim.run import simulate
from sim.step import pipeline
from sim.step.timing import StepDevices
from tests.sim.oracles.step_timing import Queues, step_reference
from tests.sim.oracles.steps import StepCost, run_step, time_steps

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed: pip install -e '.[fast]'")
if not HAVE_NUMBA and os.environ.get("PULSEINFER_CI"):  # .ci/run installs the fast extra: a missing numba fails
    pytest.fail("numba is not installed under PULSEINFER_CI (pip install -e '.[fast]')", pytrace=False)
KERNELS = [pytest.param("numba", marks=needs_numba), "python"]
H200 = HardwareSpec.model_validate(load_card("hardware", "h200"))


def _plan(rng: np.random.Generator, n: int, present: float) -> np.ndarray:
    """float64 [n, 4] jobs: bytes, link-held s, copy s, gather s; a job is absent with probability 1 − present."""
    nbytes = rng.uniform(1e3, 1e7, n) * (rng.random(n) < present)
    copy_s = nbytes / 2e10
    gather_s = copy_s * rng.uniform(0.0, 1.5, n) * (rng.random(n) < 0.5)
    service_s = np.maximum(copy_s, gather_s) + 1e-7 * (nbytes > 0)
    return np.stack([nbytes, service_s, copy_s, gather_s], axis=1)


def _devices(kernels: str, coupling: float) -> StepDevices:
    devices = StepDevices(simpy.Environment(), H200, kernels)
    devices.d2h.d2h_coupling = coupling
    return devices


def _queues(x) -> tuple[float, float, float]:
    return x.link_free_s, x.d2h_free_s, x.d2h_busy_s


def _random_step(rng: np.random.Generator, n: int, kind: str) -> dict:
    """One step's cost: ``kind`` idle (nothing recalled), sequential or interruptible."""
    step = {"compute_s": rng.uniform(1e-5, 1e-3, n).tolist(), "d2h_bytes": float(rng.choice([0.0, 1e5, 1e7]))}
    if kind == "sequential":
        step["recall_s"] = (rng.uniform(0.0, 1e-3, n) * (rng.random(n) < 0.8)).tolist()
        step["gather_s"] = (rng.uniform(0.0, 5e-4, n) * (rng.random(n) < 0.5)).tolist()
    elif kind == "interruptible":
        step["prefetch"], step["correction"] = _plan(rng, n, 0.8), _plan(rng, n, 0.4)
    return step


def _oracle(queues: Queues, devices: StepDevices, start_s: float, step: dict, lookahead: int, chunk_bytes: float,
            overhead_s: float, head_s: float, intervals: list | None = None) -> tuple:  # fmt: skip
    d2h_s = devices.d2h.d2h_s(step["d2h_bytes"]) if step["d2h_bytes"] > 0 else -1.0
    plan = (step["prefetch"], step["correction"], lookahead, chunk_bytes) if "prefetch" in step else None
    return step_reference(
        queues, start_s, step["compute_s"], overhead_s, head_s, d2h_s, devices.d2h.d2h_coupling,
        step.get("recall_s"), step.get("gather_s"), plan, intervals,
    )  # fmt: skip


def _time(devices: StepDevices, now_s: float, steps: list[dict], kind: str, lookahead: int, chunk_bytes: float,
          overhead_s: float, head_s: float, **kwargs):  # fmt: skip
    """The sim/ function over the steps (all of one pipeline ``kind``, or idle) with one d2h_bytes for all."""
    compute = np.array([s["compute_s"] for s in steps])
    has_recall = np.array([len(s) > 2 for s in steps])  # idle steps carry compute and D2H bytes only
    plan = sequential = None
    if kind == "interruptible":
        zero = np.zeros((compute.shape[1], 4))
        plan = tuple(np.array([s.get(part, zero) for s in steps]) for part in ("prefetch", "correction"))
    elif kind == "sequential":
        zero = [0.0] * compute.shape[1]
        sequential = tuple(np.array([s.get(part, zero) for s in steps]) for part in ("recall_s", "gather_s"))
    return time_steps(devices,
        now_s, compute, has_recall, overhead_s, head_s, steps[0]["d2h_bytes"], plan, lookahead, chunk_bytes,
        sequential, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("kind", ["sequential", "interruptible"])
@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 40),
    lookahead=st.integers(1, 5),
    chunk_bytes=st.sampled_from([1e4, 65536.0, 1e6, 1e9]),
    link_late_s=st.floats(-1e-3, 1e-3),
    d2h_late_s=st.floats(-1e-3, 5e-3),
    coupling=st.sampled_from([0.0, 0.3]),
)
def test_one_step_equals_the_oracle(kernels, kind, seed, n, lookahead, chunk_bytes, link_late_s, d2h_late_s, coupling):
    rng = np.random.default_rng(seed)
    step = _random_step(rng, n, kind)
    t0, overhead_s, head_s = float(rng.uniform(0.0, 1.0)), 2e-5, 3e-4
    devices = _devices(kernels, coupling)
    devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s = t0 + link_late_s, t0 + d2h_late_s, 1.0
    queues = Queues(devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s)
    ref_intervals: list[tuple] = []
    delay, ref = _oracle(queues, devices, t0, step, lookahead, chunk_bytes, overhead_s, head_s, ref_intervals)
    got = _time(devices, t0, [step], kind, lookahead, chunk_bytes, overhead_s, head_s, record=True)
    assert got.steps == 1
    assert got.step_s[0] == delay and got.times_s[1] == t0 + delay
    assert [got.stall_s[0], got.link_busy_s[0], got.gather_busy_s[0]] == [
        ref.stall_s,
        ref.link_busy_s,
        ref.gather_busy_s,
    ]
    assert got.item_stall_s[0].tolist() == ref.layer_stall_s
    assert _queues(got) == _queues(queues)
    assert got.intervals == ref_intervals
    assert (devices.link_free_s, devices.d2h_busy_s) == (t0 + link_late_s, 1.0)  # read, not changed


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("kind", ["sequential", "interruptible"])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 12), n=st.integers(1, 12), bound=st.floats(0.0, 1.2))
def test_k_steps_equal_k_oracle_steps_in_order(kernels, kind, seed, k, n, bound):
    """Steps that recall and steps that do not, timed in one pass from the state each step leaves (the D2H queue
    shared, the link's queue carried), stopping before the first step that would end at or after the bound."""
    rng = np.random.default_rng(seed)
    d2h_bytes = float(rng.choice([0.0, 1e7]))
    steps = [_random_step(rng, n, kind if rng.random() < 0.7 else "idle") for _ in range(k)]
    for s in steps:
        s["d2h_bytes"] = d2h_bytes
    devices = _devices(kernels, 0.4)
    now = 0.5
    queues, times, stalls, delays = Queues(), [now], [], []
    for s in steps:
        delay, timing = _oracle(queues, devices, now, s, 2, 65536.0, 2e-5, 3e-4)
        now += delay
        times.append(now)
        delays.append(delay)
        stalls.append(timing.stall_s if timing is not None else 0.0)
    next_event_s = times[0] + bound * (times[-1] - times[0]) if bound < 1.1 else math.inf
    j = next(i for i in range(k + 1) if i == k or times[i + 1] >= next_event_s)
    got = _time(devices, times[0], steps, kind, 2, 65536.0, 2e-5, 3e-4, next_event_s=next_event_s)
    assert got.steps == j
    assert got.times_s[: j + 1].tolist() == times[: j + 1]
    assert got.step_s[:j].tolist() == delays[:j] and got.stall_s[:j].tolist() == stalls[:j]
    if j == k:
        assert _queues(got) == _queues(queues)


@pytest.mark.parametrize("kernels", KERNELS)
def test_k_steps_stop_before_the_stop_recall_th_recalling_step(kernels):
    rng = np.random.default_rng(7)
    steps = [_random_step(rng, 4, kind) for kind in ("sequential", "idle", "sequential", "sequential")]
    for s in steps:
        s["d2h_bytes"] = 0.0
    got = _time(_devices(kernels, 0.0), 0.0, steps, "sequential", 1, 1.0, 0.0, 0.0, stop_recall=3)
    assert got.steps == 3  # the third recalling step is the fourth


def test_release_lengthens_the_copy_share_of_present_jobs_only():
    jobs = np.array([[1e6, 3.0, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    p = pipeline
    for slow, service_s in ((1.5, 4.0), (1.0, 3.0)):
        keyed, ints, fs = p.interrupt_scratch(2)
        ints[p._LINK, 0] = -1  # nothing on the link
        for i in range(2):
            p._release(jobs, i, i, 0.0, 4e6, slow, keyed, ints, fs)
        # copy 2 s runs 1.5× longer: +1 s on the service and on the copy; the gather share is untouched
        assert ints[p._LINK, 1] == 1 and keyed[p._REM, 0] == service_s  # the absent job is not released
        assert keyed[p._COPY, 0] == (service_s - 1.0) / service_s and keyed[p._GATHER, 0] == 1.0 / service_s
    assert jobs[0, 1] == 3.0  # the jobs are not modified


def test_both_pipelines_at_once_are_refused():
    one = np.ones((1, 1))
    with pytest.raises(ValueError, match="not both"):
        time_steps(StepDevices(None), 0.0, one, np.ones(1, bool), 0.0, 0.0, 0, (np.zeros((1, 1, 4)),) * 2,
                                     sequential=(one, one))  # fmt: skip


@pytest.mark.parametrize("kernels", KERNELS)
def test_a_plan_whose_item_never_gets_its_recall_deadlocks_loudly(kernels):
    jobs = np.array([[[1e6, 1e-3, 1e-3, 0.0], [1e6, 1e-3, 1e-3, 0.0]]])
    devices = _devices(kernels, 0.0)
    assert time_steps(devices, 0.0, np.ones((1, 2)), np.ones(1, bool), 0.0, 0.0, 0, (jobs, jobs), 1, 1e6).steps == 1
    with pytest.raises(RuntimeError, match="deadlocked"):  # look-ahead 0: item 0's prefetch waits for item 0 to start
        time_steps(devices, 0.0, np.ones((1, 2)), np.ones(1, bool), 0.0, 0.0, 0, (jobs, jobs), 0, 1e6)


def test_a_change_to_the_pipeline_reaches_a_single_step_and_a_k_step_run(monkeypatch):
    """Mutation (one definition): delay every sequential pipeline's end by 1 ms in ``pipeline._sequential`` alone (run
    as Python); a single decode step (``run_step``) and a k-step run (skip-ahead's call) both take it."""
    cost = StepCost([1e-4] * 4, [5e-5] * 4, None, 2e-4, 1, 1, 1, 1)
    compute, link = np.full((3, 4), 1e-4), np.full((3, 4), 5e-5)

    def timed() -> tuple[float, list[float]]:
        env = simpy.Environment()
        devices = StepDevices(env, H200, "python")
        env.run(env.process(run_step(devices, cost, 1e-5)))
        run = time_steps(
            StepDevices(simpy.Environment(), H200, "python"),
            0.0,
            compute,
            np.ones(3, bool),
            1e-5,
            2e-4,
            0,
            sequential=(link, np.zeros((3, 4))),
        )
        return env.now, run.step_s.tolist()

    one, k_steps = timed()
    real = pipeline._sequential
    monkeypatch.setattr(pipeline, "_sequential", lambda t0, *args: (real(t0, *args)[0] + 1e-3, *real(t0, *args)[1:]))
    one_after, k_after = timed()
    assert one_after == pytest.approx(one + 1e-3, abs=1e-12)
    assert k_after == pytest.approx([s + 1e-3 for s in k_steps], abs=1e-12)


OFFLOADED = [
    "model=llama-3.1-8b", "hardware=h100-sxm", "workload.trace=azure_conv_2023", "workload.max_prompt_tokens=3500",
    "workload.max_requests=40", "workload.time_scale=1", "workload.target_rate_per_s=2",
    "serving.prefill=colocated", "policies=pulseinfer", "policy.pulseinfer.offload_threshold_tokens=16",
    "run.progress=false",
]  # fmt: skip


@needs_numba
def test_whole_run_tables_equal_with_and_without_the_compiled_kernel():
    results = {k: simulate(load_scenario("default", OFFLOADED + [f"run.kernels={k}"])) for k in ("python", "numba")}
    ref, fast = (results[k].policies["pulseinfer"] for k in ("python", "numba"))
    assert (ref.steps["recall_bytes"] > 0).sum() > 100  # the interruptible pipeline did run
    for name in ("steps", "requests", "layers", "layer_recall", "timeline"):
        pd.testing.assert_frame_equal(getattr(ref, name), getattr(fast, name), check_exact=True)
    assert ref.summary == fast.summary


def test_numba_kernels_refused_without_numba(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a))
    with pytest.raises(ScenarioError, match=r"run\.kernels.*numba.*pulseinfer\[fast\]"):
        load_scenario("default", ["run.kernels=numba"])


def test_python_kernels_run_the_drift_recurrence_as_python(monkeypatch):
    """``run.kernels: python`` reaches the recall model's drift recurrence (sim/step/drift.py): the compiled
    dispatcher is never asked for, the Python source runs, and every table equals the ``auto`` run's."""
    from sim.step import drift

    auto = simulate(load_scenario("default", OFFLOADED + ["run.kernels=auto"])).policies["pulseinfer"]

    def refuse():
        raise AssertionError("run.kernels=python asked for the compiled drift recurrence")

    calls = []
    python_source = drift.drift_steps_py

    def counted(*args):
        calls.append(1)
        return python_source(*args)

    monkeypatch.setattr(drift, "compiled_drift_steps", refuse)
    monkeypatch.setattr(drift, "drift_steps_py", counted)
    python = simulate(load_scenario("default", OFFLOADED + ["run.kernels=python"])).policies["pulseinfer"]
    assert calls, "no offloaded step drifted: the scenario does not exercise the recurrence"
    for name in ("steps", "requests", "layers", "layer_recall", "timeline"):
        pd.testing.assert_frame_equal(getattr(python, name), getattr(auto, name), check_exact=True)
    assert python.summary == auto.summary
