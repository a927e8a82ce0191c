"""check_plan refuses non-finite or out-of-range numbers through the Python API too (not only the CLI's flags)."""

from __future__ import annotations

import math

import pytest

from study.bisection import bisect_max_rate
from study.plan import MIN_REL_TOL, PlanConfig, PlanError, check_plan
from study.slo import TailSlo


def _config(**changes) -> PlanConfig:
    return PlanConfig(
        scenario="default", slo=TailSlo(tpot_p99_s=0.05), hardware=("h200",), policies=("sglang",), **changes
    )


@pytest.mark.parametrize("rate", [math.inf, math.nan, -1.0, 0.0])
def test_target_rate_must_be_finite_and_positive(rate):
    with pytest.raises(PlanError, match="target_rate_per_s must be a finite number > 0") as info:
        check_plan(_config(target_rate_per_s=rate))
    assert info.value.field == "target_rate_per_s"


@pytest.mark.parametrize("rel_tol", [math.inf, math.nan, 0.0, 1.5, 1e-300, MIN_REL_TOL / 2])
def test_rel_tol_must_lie_in_min_one(rel_tol):
    with pytest.raises(PlanError, match=r"rel_tol must be in \[0.0001, 1\], got") as info:
        check_plan(_config(rel_tol=rel_tol))
    assert info.value.field == "rel_tol"


@pytest.mark.parametrize("boundary", [1.0, 3.7, 1e-3])
def test_bisection_ends_even_when_rel_tol_is_below_float_resolution(boundary):
    """Issue 30: ``--rel-tol 1e-300`` looped for ever once lo and hi were adjacent floats."""
    calls = []

    def feasible(rate: float) -> bool:
        calls.append(rate)
        if len(calls) > 10_000:  # a hang guard, far above the ~70 simulations a float bisection can take
            raise AssertionError("bisection does not end")
        return rate <= boundary

    found = bisect_max_rate(feasible, start=1.0, rel_tol=1e-300, max_steps=16)
    assert found.rate <= boundary and math.nextafter(found.rate, math.inf) > boundary * (1 - 1e-15)
    assert len(calls) == len(set(calls))  # no rate is simulated twice


def test_a_good_config_passes():
    check_plan(_config(target_rate_per_s=5.3, rel_tol=0.05))


def test_plan_says_when_a_sample_shorter_than_the_workload_set_the_answer():
    from pulseinfer.commands.plan import _sample_note

    note = _sample_note(_config(max_requests=600))
    assert note is not None and "first 600 of the workload's 5,719 requests" in note and "--max-requests all" in note
    assert _sample_note(_config(max_requests=None)) is None
    assert _sample_note(_config(max_requests=600, overrides=("workload.max_requests=300",))) is None
