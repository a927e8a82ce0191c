"""IO-adaptive offloading admission (sim/serving/admission.py and the scheduler's use of it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.config import load_scenario
from sim.run import simulate
from sim.serving.admission import PHI_MAX, PHI_MIN, RecallBudget


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
    adm.observe(step_s=0.02, stall_s=0.005, link_busy_s=0.015)
    assert adm.phi == pytest.approx(0.8)
    adm.observe(step_s=0.02, stall_s=0.0, link_busy_s=0.001)
    assert adm.phi == pytest.approx(0.85)
    for _ in range(200):
        adm.observe(0.02, 0.02, 0.02)
    assert adm.phi == PHI_MIN
    for _ in range(200):
        adm.observe(0.02, 0.0, 0.0)
    assert adm.phi == PHI_MAX


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
