"""layer_recall.csv spreads a step's recall over the time bins it spans, so no bin exceeds what the link moved."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import load_scenario
from sim.metrics.recorder import Recorder
from sim.run import simulate
from tests.sim.oracles.steps import recorded_run


def _step(rec: Recorder, start_s: float, end_s: float, nbytes: list[int]) -> None:
    """One decode step that recalled ``nbytes`` per layer through the pipeline, recorded."""
    rec.record_decode_run(recorded_run(1, layer_bytes=[nbytes]), [start_s, end_s], [end_s - start_s], 1, 1, [1], [1], 0)


@pytest.mark.parametrize("steps", [1, 3])
def test_a_step_spanning_two_bins_is_split_by_overlap(steps):
    rec = Recorder(num_layers=2, layer_bin_s=10.0)
    if steps == 1:
        _step(rec, 7.5, 17.5, [100, 40])
    else:  # the same step in a run of three (the other two in bin 0, recalling nothing)
        run = recorded_run(3, layer_bytes=[[0, 0], [0, 0], [100, 40]])
        rec.record_decode_run(run, [1.0, 2.0, 7.5, 17.5], [1.0, 5.5, 10.0], 1, 1, [1] * 3, [1] * 3, 0)
    assert rec.binned_bytes[0] == pytest.approx([25.0, 10.0]) and rec.binned_bytes[1] == pytest.approx([75.0, 30.0])
    _step(rec, 20.0, 30.0, [8, 8])  # ends on an edge
    assert sorted(rec.binned_bytes) == [0, 1, 2] and rec.binned_bytes[2] == pytest.approx([8.0, 8.0])
    _step(rec, 31.0, 31.0, [5, 5])  # an instant
    assert rec.binned_bytes[3] == pytest.approx([5.0, 5.0]) and list(rec.layer_bytes) == [113, 53]


def test_no_bin_books_more_than_the_link_moves():
    """10 ms bins, far shorter than a headwise decode step: booking a step at its start showed 122 GB/s here."""
    bin_s = 0.01
    sc = load_scenario("default", ["workload.max_requests=40", "run.progress=false", f"run.layer_bin_s={bin_s}",
                                   "policies=headwise"])  # fmt: skip
    result = simulate(sc).policies["headwise"]
    per_bin = result.layer_recall.groupby("time_s")["recall_bytes"].sum()
    assert per_bin.sum() == pytest.approx(float(result.layers["recall_bytes"].sum()))  # nothing lost or added
    assert per_bin.max() / bin_s <= sc.hardware.h2d_bandwidth_gbps * 1e9
    steps = result.steps[result.steps["recall_bytes"] > 0]
    at_start = steps.groupby(np.floor(steps["start_s"] / bin_s))["recall_bytes"].sum().max() / bin_s
    assert at_start > sc.hardware.h2d_bandwidth_gbps * 1e9  # what the old booking showed
