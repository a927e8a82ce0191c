"""check_plan refuses non-finite or out-of-range numbers through the Python API too (not only the CLI's flags)."""

from __future__ import annotations

import math

import pytest

from sim.study.plan import PlanConfig, PlanError, check_plan
from sim.study.slo import TailSlo


def _config(**changes) -> PlanConfig:
    return PlanConfig(
        scenario="default", slo=TailSlo(tpot_p99_s=0.05), hardware=("h200",), policies=("sglang",), **changes
    )


@pytest.mark.parametrize("rate", [math.inf, math.nan, -1.0, 0.0])
def test_target_rate_must_be_finite_and_positive(rate):
    with pytest.raises(PlanError, match="target_rate_per_s must be a finite number > 0") as info:
        check_plan(_config(target_rate_per_s=rate))
    assert info.value.field == "target_rate_per_s"


@pytest.mark.parametrize("rel_tol", [math.inf, math.nan, 0.0, 1.5])
def test_rel_tol_must_lie_in_zero_one(rel_tol):
    with pytest.raises(PlanError, match=r"rel_tol must be in \(0, 1\]"):
        check_plan(_config(rel_tol=rel_tol))


def test_a_good_config_passes():
    check_plan(_config(target_rate_per_s=5.3, rel_tol=0.05))


def test_plan_says_when_a_sample_shorter_than_the_workload_set_the_answer():
    from pulseinfer.commands.plan import _sample_note

    note = _sample_note(_config(max_requests=600))
    assert note is not None and "first 600 of the workload's 5,719 requests" in note and "--max-requests all" in note
    assert _sample_note(_config(max_requests=None)) is None
    assert _sample_note(_config(max_requests=600, overrides=("workload.max_requests=300",))) is None
