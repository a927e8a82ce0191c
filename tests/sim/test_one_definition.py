"""One definition of each offloaded-step mechanism: a change made in one place reaches every step.

Each test perturbs one mechanism where sim/ defines it (the layer compute of a step, ``ComputeModel.decode_layer_s``,
which ``OffloadServing.step_costs`` charges; the recall buffer's hits, ``RecallModel.buffer_hit``, which
``RecallModel.run`` reads) and simulates a short
all-offloaded scenario twice: one step at a time (``run.skip_ahead=false``: every step is a run of one) and with
skip-ahead (offloaded steps timed k at once). Both must see the change (their tables move from the unperturbed
run) and still agree with each other bit for bit. A change made only in a second, per-step copy of a mechanism
would move the first and barely the second.
"""

from __future__ import annotations

import pytest

from sim import load_scenario
from sim.policies.offload import OffloadServing
from sim.run import simulate
from sim.step.compute import ComputeModel
from sim.step.recall import RecallModel
from tests.sim.test_skip_ahead import _assert_equal

SMALL = [
    "policies=pulseinfer", "policy.pulseinfer.offload_threshold_tokens=16", "model=llama-3.1-8b",
    "hardware=h100-sxm", "workload.trace=azure_conv_2023", "workload.max_requests=16",
    "workload.max_prompt_tokens=3000", "workload.time_scale=1", "workload.target_rate_per_s=4",
    "serving.prefill=colocated", "run.progress=false", "run.debug_checks=true",
]  # fmt: skip


def _layer_s_doubled(real):
    def decode_layer_s(self, batch_size, attended_tokens):
        return 2.0 * real(self, batch_size, attended_tokens)

    return decode_layer_s


def _no_buffer_hits(real):
    def buffer_hit(self, selected):
        return 0.0 * real(self, selected)

    return buffer_hit


def _run(skip_ahead: bool):
    result = simulate(load_scenario("default", [*SMALL, f"run.skip_ahead={str(skip_ahead).lower()}"]))
    return result, result.policies["pulseinfer"]


@pytest.mark.parametrize(
    ("owner", "name", "perturb", "column"),
    [
        pytest.param(ComputeModel, "decode_layer_s", _layer_s_doubled, "duration_s", id="step-cost-compute"),
        pytest.param(RecallModel, "buffer_hit", _no_buffer_hits, "recall_bytes", id="recall-buffer-hit"),
    ],
)
def test_a_perturbed_mechanism_moves_one_step_and_k_step_runs_alike(monkeypatch, owner, name, perturb, column):
    k_steps = []
    real_costs = OffloadServing.step_costs

    def step_costs(self, ctx, *args):
        k_steps.append(len(ctx))
        return real_costs(self, ctx, *args)

    monkeypatch.setattr(OffloadServing, "step_costs", step_costs)
    base_one, base_one_p = _run(skip_ahead=False)
    assert max(k_steps) == 1  # every step a run of one
    k_steps.clear()
    base_k, _ = _run(skip_ahead=True)
    assert max(k_steps) > 1  # offloaded steps were costed k at once
    _assert_equal(base_one, base_k)

    monkeypatch.setattr(owner, name, perturb(getattr(owner, name)))
    one, one_p = _run(skip_ahead=False)
    k_steps.clear()
    many, many_p = _run(skip_ahead=True)
    assert max(k_steps) > 1
    before, after_one, after_many = (p.steps[column].sum() for p in (base_one_p, one_p, many_p))
    assert after_one > 1.2 * before and after_many == after_one  # both see it, alike
    _assert_equal(one, many)
