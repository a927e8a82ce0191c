"""The Ray backend on a local Ray instance gives the same tables as local processes (sweep 3 × 3 × 2 policies, plan).

Skipped when Ray is not installed (`pip install -e '.[ray]'`); .ci/run installs it and sets PULSEINFER_CI=1, under
which a missing Ray fails these instead.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest

from study.plan import PlanConfig, run_plan
from study.slo import TailSlo
from study.sweep import SweepConfig, run_sweep

from .conftest import CONSTANT, TINY

try:
    import ray
except ImportError:
    if os.environ.get("PULSEINFER_CI"):  # .ci/run installs the ray extra: there, a missing Ray is a failure
        pytest.fail("Ray is not installed under PULSEINFER_CI (pip install -e '.[ray]')", pytrace=False)
    pytest.skip("Ray is not installed: pip install -e '.[ray]' (.ci/run installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (starting Ray takes seconds); the backend uses it and leaves it running."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_sweep_on_ray_equals_local(local_ray, tmp_path):
    cfg = SweepConfig(
        scenario="default",
        grids=(
            ("workload.synthetic.prompt_tokens_mean", ("6000", "12000", "24000")),
            ("workload.synthetic.rate_per_s", ("1", "4", "16")),
        ),
        policies=("sglang", "pulseinfer"),
        overrides=tuple([*TINY, "workload.synthetic.num_requests=10"]),
        slo=TailSlo(tpot_p99_s=0.06),
    )
    local = run_sweep(cfg, tmp_path / "local", backend="local", jobs=1)
    on_ray = run_sweep(cfg, tmp_path / "ray", backend="ray", jobs=2)
    assert (local.num_simulated, on_ray.num_simulated) == (18, 18)
    pd.testing.assert_frame_equal(on_ray.table, local.table)
    local.table.to_csv(tmp_path / "a.csv", index=False)
    on_ray.table.to_csv(tmp_path / "b.csv", index=False)
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert ray.is_initialized()  # the caller's Ray is left running


def test_plan_on_ray_equals_local(local_ray):
    cfg = PlanConfig(
        scenario="default",
        slo=TailSlo(ttft_p99_s=3.0),
        hardware=("h200",),
        policies=("sglang", "pulseinfer"),
        overrides=tuple(CONSTANT),
        max_requests=20,
        rel_tol=0.2,
        swap_hardware=False,
    )
    local = run_plan(cfg, jobs=1)
    on_ray = run_plan(cfg, jobs=2, backend="ray")
    pd.testing.assert_frame_equal(on_ray, local)
    assert (local["num_simulations"] > 1).all()
