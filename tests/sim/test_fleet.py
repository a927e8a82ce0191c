"""``Fleet.run`` (sim/serving/fleet.py): a run that runs out of events is "stuck"; any error a process raises
propagates, the pipeline's deadlock ``RuntimeError`` included (it used to read as a stuck run)."""

from __future__ import annotations

import pytest

from sim.config import load_scenario
from sim.metrics.outcomes import HORIZON, STUCK
from sim.serving.fleet import Fleet
from sim.serving.request import Request

SMALL = ["workload.max_requests=5", "run.progress=false", "policies=sglang"]


def _fleet(*overrides: str) -> Fleet:
    return Fleet(load_scenario("default", [*SMALL, *overrides]), "sglang")


def test_a_run_with_no_events_left_is_stuck():
    fleet = _fleet()
    replica = fleet.replicas[0]

    def driver():  # submits one request and never closes the replica: its scheduler waits for ever
        yield fleet.env.timeout(1.0)
        replica.submit(Request(0, 1.0, 100, 4))

    assert fleet.run(driver()) == STUCK
    (req,) = fleet.recorders[0].requests
    assert req.unfinished_reason == "" and req.finish_s > 1.0  # it finished; only the replica's wait was left


def test_a_process_error_propagates_rather_than_reading_as_stuck():
    fleet = _fleet()

    def driver():
        yield fleet.env.timeout(1.0)
        raise RuntimeError("interruptible step deadlocked: an item waits for a recall never released")

    with pytest.raises(RuntimeError, match="deadlocked"):
        fleet.run(driver())


def test_the_horizon_cuts_a_run():
    fleet = _fleet("run.horizon_s=2")

    def driver():
        yield fleet.env.timeout(10.0)

    assert fleet.run(driver()) == HORIZON and fleet.env.now == 2.0
