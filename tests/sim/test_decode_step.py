"""A decode step is a run of one: ``Replica._decode_step`` (block growth from ``grown_blocks``, what the step leaves
behind from ``Replica._apply_run``, its row from ``Recorder.record_decode_run``) gives every table and the summary
bit for bit as the per-step reference written for one step (tests/sim/oracles/decode_step.py), over runs that
preempt (recompute and swap), evict prefix-cache nodes, recall (sequential and interruptible pipelines), keep the
timeline, cut at a horizon and keep only the summary; with skip-ahead off (every step) and on (the steps it
cannot cover).

Mutation tests show one definition: a change made in one place — block growth (``grown_blocks``) or a run's step
rows (``Recorder.record_decode_run``) — is seen by single steps and skip-ahead runs alike (their tables stay equal
and differ from the unchanged run's)."""

from __future__ import annotations

import pytest

from sim import load_scenario
from sim.metrics.recorder import Recorder
from sim.run import simulate
from sim.serving import decode_run
from sim.serving.replica import Replica
from tests.sim.oracles.decode_step import decode_step
from tests.sim.test_skip_ahead import SHORT, SMALL_POOL, _assert_equal, _both

OFFLOADING = ["policies=pulseinfer,headwise", "policy.pulseinfer.offload_threshold_tokens=1500"]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["policies=sglang", *SMALL_POOL], id="preempting"),
        pytest.param(["policies=sglang", "policy.sglang.prefix_cache=true", *SMALL_POOL], id="prefix-evicting"),
        pytest.param(["policies=sglang", "serving.prefill=disaggregated", "policy.sglang.retract=swap"], id="pd-swap"),
        pytest.param(OFFLOADING, id="recalling"),
        pytest.param([*OFFLOADING, "run.horizon_s=15", "run.timeline_step=3"], id="horizon-timeline"),
        pytest.param([*OFFLOADING, "run.tables=summary"], id="summary-only"),
    ],
)
@pytest.mark.parametrize("skip_ahead", ["false", "true"])
def test_decode_step_equals_the_per_step_reference(overrides, skip_ahead, monkeypatch):
    scenario = load_scenario("default", [*SHORT, *overrides, f"run.skip_ahead={skip_ahead}"])
    result = simulate(scenario)
    steps = [p.summary["num_preemptions"] for p in result.policies.values()]
    if SMALL_POOL[0] in overrides:
        assert sum(steps) > 0  # the comparison covers preemption
    monkeypatch.setattr(Replica, "_decode_step", decode_step)
    _assert_equal(simulate(scenario), result)


MUTATED = [*SHORT, *OFFLOADING, "run.debug_checks=false"]


@pytest.fixture
def counted(monkeypatch):
    """Counts the skip-ahead runs applied (``counted["runs"]``: runs of k ≥ 2 steps)."""
    counts = {"runs": 0}
    real = Replica._apply_run

    def apply(self, run):
        counts["runs"] += run.steps >= 2
        return real(self, run)

    monkeypatch.setattr(Replica, "_apply_run", apply)
    return counts


def _mutated_both(monkeypatch, target, name: str, mutant):
    """(unchanged, stepped, skip-ahead) results with ``target.name`` replaced by ``mutant(real)``."""
    plain = simulate(load_scenario("default", [*MUTATED, "run.skip_ahead=false"]))
    monkeypatch.setattr(target, name, mutant(getattr(target, name)))
    return (plain, *_both(MUTATED))


def test_block_growth_changed_in_one_place_changes_steps_and_runs(monkeypatch, counted):
    def mutant(real):
        def grown_blocks(policy, batch, steps):  # every request holds one block more than its tokens need
            ctx, held, _ = real(policy, batch, steps)
            held = held + 1
            return ctx, held, held.sum(axis=1) - int(batch.blocks.sum())

        return grown_blocks

    plain, stepped, skipped = _mutated_both(monkeypatch, decode_run, "grown_blocks", mutant)
    assert counted["runs"] > 10
    _assert_equal(stepped, skipped)
    for name, result in plain.policies.items():
        decode = result.steps["phase"] == "decode"
        before = result.steps.loc[decode, "kv_used_blocks"].to_numpy()
        after = stepped.policies[name].steps.loc[decode, "kv_used_blocks"].to_numpy()
        assert len(before) != len(after) or (before != after).any(), name


def test_step_rows_changed_in_one_place_change_steps_and_runs(monkeypatch, counted):
    def mutant(real):
        def record_decode_run(self, run, *rest):
            run.attended_tokens = run.attended_tokens + 1
            return real(self, run, *rest)

        return record_decode_run

    plain, stepped, skipped = _mutated_both(monkeypatch, Recorder, "record_decode_run", mutant)
    assert counted["runs"] > 10
    _assert_equal(stepped, skipped)
    for name, result in plain.policies.items():
        decode = result.steps["phase"] == "decode"
        before = result.steps.loc[decode, "attended_tokens"].to_numpy()
        after = stepped.policies[name].steps.loc[decode, "attended_tokens"].to_numpy()
        assert (after == before + 1).all(), name
