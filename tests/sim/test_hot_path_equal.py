"""Hot-path shortcuts of the offloaded step cost give the numbers of the plain expressions they replace, bit for bit:
the recall buffer's miss share of requests at the full budget (one row per model, broadcast), the Kumaraswamy
inverse CDF computed in place, and the interruptible pipeline's work arrays reused from step to step."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import HardwareSpec, ModelSpec, OffloadPolicy, RecallStatsSpec
from sim.config.loader import load_card
from sim.step import pipeline
from sim.step.link import LinkModel
from sim.step.recall import RecallModel

MODEL = ModelSpec.model_validate(load_card("model", "qwen3-14b"))
LINK = LinkModel(HardwareSpec.model_validate(load_card("hardware", "h200")))


@pytest.mark.parametrize("buffer_blocks", [64, 200, 256, 4096])
def test_buffer_miss_at_the_budget_equals_the_full_expression(buffer_blocks):
    rec = RecallModel(MODEL, OffloadPolicy(recall_buffer_blocks=buffer_blocks), RecallStatsSpec(), LINK)
    budget = rec.budget_blocks
    for selected in (np.full((7, 3), budget), np.array([[budget, budget - 5], [3, budget]]), np.full((1, 1), 1)):
        full = 1.0 - rec.returning * rec.buffer_hit(selected)  # float [k, n, L]
        if selected.min() == budget == selected.max():  # RecallModel.run's row at the budget, broadcast
            row = (1.0 - rec.returning * rec.buffer_hit(np.array([budget])))[0]
            assert np.array_equal(np.broadcast_to(row, full.shape), full)
        got = 1.0 - rec.returning * rec.buffer_hit(selected)
        assert np.array_equal(got, full)


@pytest.mark.parametrize("inv_a", [0.5, 1.0, 2.0, 1 / 2.88])
def test_in_place_kumaraswamy_equals_the_expression(inv_a):
    rng = np.random.default_rng(3)
    u = rng.random((40, 2, MODEL.num_layers))
    inv_b = 1.0 / (0.2 + 3 * rng.random(MODEL.num_layers))
    change = 1.0 - u  # as RecallModel.run computes it
    change **= inv_b
    np.subtract(1.0, change, out=change)
    change **= inv_a
    assert np.array_equal(change, (1.0 - (1.0 - u) ** inv_b) ** inv_a)


def test_interruptible_steps_with_reused_work_arrays_equal_fresh_ones():
    """k steps timed in one call (work arrays reused) equal each step timed alone (fresh arrays), Python kernel."""
    rng = np.random.default_rng(11)
    k, n = 6, 12
    compute = rng.uniform(1e-5, 1e-4, (k, n))
    jobs = np.zeros((k, n, 4))
    jobs[..., 0] = rng.integers(1, 8, (k, n)) * 2**20 * (rng.random((k, n)) < 0.8)
    jobs[..., 2] = jobs[..., 0] / 50e9
    jobs[..., 1] = jobs[..., 2] * 1.2
    jobs[..., 3] = jobs[..., 1] - jobs[..., 2]
    prefetch, correction = 0.9 * jobs, 0.1 * jobs
    none = np.zeros((1, 1))
    common = (1e-5, 2e-4, 1e-5, 0.3)
    whole = pipeline.time_steps(
        0.0, compute, np.ones(k, bool), 2, prefetch, correction, 2, 4.0 * 2**20, none, none, *common, 0.0, 0.0, 0.0,
        np.inf, np.inf, np.zeros((0, 5)), 0.0, np.inf,
    )  # fmt: skip
    now, link_free, d2h_free, d2h_busy = 0.0, 0.0, 0.0, 0.0
    for t in range(k):
        one = pipeline.time_steps(
            now, compute[t : t + 1], np.ones(1, bool), 2, prefetch[t : t + 1], correction[t : t + 1], 2,
            4.0 * 2**20, none, none, *common, link_free, d2h_free, d2h_busy, np.inf, np.inf, np.zeros((0, 5)), 0.0,
            np.inf,
        )  # fmt: skip
        assert one[1][1] == whole[1][t + 1] and one[3][0] == whole[3][t] and one[4][0] == whole[4][t]
        assert np.array_equal(one[6][0], whole[6][t])
        now, link_free, d2h_free, d2h_busy = one[1][1], one[7], one[8], one[9]
    assert (link_free, d2h_free, d2h_busy) == whole[7:10]
