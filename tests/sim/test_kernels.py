"""The compiled interruptible pipeline (sim/step/kernels.py) equals the pure-Python reference
(sim/step/interrupt.py): on random plans, and over whole simulations (every table) with ``run.kernels``
``python`` vs ``auto``.

Skipped when numba is not installed (`pip install -e '.[fast]'`); .ci/run installs it and sets PULSEINFER_CI=1,
under which a missing numba fails these instead.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import ScenarioError, load_scenario
from sim.run import simulate
from sim.step.cost import InterruptPlan
from sim.step.interrupt import run_interruptible
from sim.step.timing import stretched

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed: pip install -e '.[fast]'")
if not HAVE_NUMBA and os.environ.get("PULSEINFER_CI"):  # .ci/run installs the fast extra: a missing numba fails
    pytest.fail("numba is not installed under PULSEINFER_CI (pip install -e '.[fast]')", pytrace=False)


def _plan(rng: np.random.Generator, n: int, present: float) -> np.ndarray:
    """float64 [n, 4] jobs: bytes, link-held s, copy s, gather s; a job is absent with probability 1 − present."""
    nbytes = rng.uniform(1e3, 1e7, n) * (rng.random(n) < present)
    copy_s = nbytes / 2e10
    gather_s = copy_s * rng.uniform(0.0, 1.5, n) * (rng.random(n) < 0.5)
    service_s = np.maximum(copy_s, gather_s) + 1e-7 * (nbytes > 0)
    return np.stack([nbytes, service_s, copy_s, gather_s], axis=1)


@needs_numba
@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 40),
    lookahead=st.integers(1, 5),
    chunk_bytes=st.sampled_from([1e4, 65536.0, 1e6, 1e9]),
    link_late_s=st.floats(-1e-3, 1e-3),
)
def test_compiled_equals_reference_on_random_plans(seed, n, lookahead, chunk_bytes, link_late_s):
    from sim.step.kernels import interruptible_arrays

    rng = np.random.default_rng(seed)
    compute = rng.uniform(1e-5, 1e-3, n)
    pre, cor = _plan(rng, n, 0.8), _plan(rng, n, 0.4)
    t0 = float(rng.uniform(0.0, 1.0))
    ref = run_interruptible(t0, compute.tolist(), pre.tolist(), cor.tolist(), lookahead, chunk_bytes, t0 + link_late_s)
    fast = interruptible_arrays(t0, compute, pre, cor, lookahead, chunk_bytes, t0 + link_late_s)
    assert fast.end_s == ref.end_s
    assert fast.stall_s == ref.stall_s
    assert fast.link_busy_s == ref.link_busy_s
    assert fast.gather_busy_s == ref.gather_busy_s
    assert fast.link_free_s == ref.link_free_s
    assert fast.layer_stall_s.tolist() == ref.layer_stall_s


def test_stretch_lengthens_copy_share_of_present_jobs_only():
    jobs = np.array([[1e6, 3.0, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    plan = stretched(InterruptPlan(jobs, jobs.copy(), 1, 65536), 1.5)
    # copy 2 s runs 1.5× longer: +1 s on the service and on the copy; the gather share is untouched
    assert plan.prefetch.tolist() == [[1e6, 4.0, 3.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    assert jobs[0, 1] == 3.0  # the input plan is not modified


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
