"""A fleet's per-replica samples (issue 49): ``Recorder.samples`` kept with ``run.tables: summary``, one decode and
one prefill step row at most every ``sample_s`` seconds (sim/serving/fleet.py ``sample_interval_s``), merged by
sim/metrics/fleet_summary.py into ``ClusterResult.series`` (``SERIES_COLUMNS``) and written as ``replica_series``;
recording them changes no other table or summary value."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from pulseinfer.tables_io import write_result
from sim.config import load_scenario
from sim.metrics import Recorder
from sim.metrics.fleet_summary import SERIES_COLUMNS
from sim.run import simulate
from sim.serving.cluster import simulate_cluster
from sim.serving.fleet import MIN_SAMPLE_S, SAMPLES_OVER_ARRIVALS, sample_interval_s
from sim.workload import load_workload

CAP = 3  # sglang's max_running_requests here: the load below fills it
TINY = [
    "workload.trace=null",
    "workload.synthetic.num_requests=40",
    "workload.synthetic.rate_per_s=40",
    "workload.synthetic.prompt_tokens_mean=2000",
    "workload.synthetic.output_tokens_mean=60",
    "policies=sglang",
    f"policy.sglang.max_running_requests={CAP}",
    "run.progress=false",
]


def _scenario(*extra: str):
    return load_scenario("default", [*TINY, *extra])


def _cluster(*extra: str, replicas: int = 2, router: str = "round_robin"):
    scenario = _scenario(*extra)
    return simulate_cluster(scenario, load_workload(scenario), "sglang", replicas, router)


def _equal_results(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.replicas, b.replicas, check_exact=True)
    assert a.summary.keys() == b.summary.keys()
    for key, value in a.summary.items():
        other = b.summary[key]
        assert value == other or (value != value and other != other), (key, value, other)


@pytest.mark.parametrize("prefill", ["disaggregated", "colocated"])
def test_the_series_covers_every_replica_within_the_run_and_the_pool(prefill):
    scenario = _scenario(f"serving.prefill={prefill}", "run.tables=summary")
    workload = load_workload(scenario)
    result = simulate_cluster(scenario, workload, "sglang", 3, "least_tokens")
    series = result.series
    assert list(series.columns) == SERIES_COLUMNS
    assert sorted(series["replica"].unique()) == [0, 1, 2]
    end_s = float(result.requests["finish_s"].max())
    assert series["time_s"].between(float(workload["arrival_s"].min()), end_s).all()
    decode = series[series["phase"] == "decode"]
    assert decode["batch_size"].between(1, CAP).all() and decode["batch_size"].max() == CAP  # the cap was reached
    assert (series["kv_pool_gib"] == result.kv_pool_gib).all()
    assert (series["kv_used_gib"] > 0).all() and (series["kv_used_gib"] <= series["kv_pool_gib"]).all()
    assert (series["hbm_used_gib"] > series["kv_used_gib"]).all()  # weights and reserve besides the KV
    assert set(series["phase"]) == ({"decode", "prefill"} if prefill == "colocated" else {"decode"})
    sample_s = sample_interval_s(workload)
    for _, rows in series.groupby(["replica", "phase"]):
        assert rows["time_s"].is_monotonic_increasing and (rows["time_s"].diff().dropna() >= sample_s).all()


def test_recording_the_samples_changes_no_table_or_summary_value(monkeypatch):
    sampled = _cluster(router="least_tokens")
    monkeypatch.setattr("sim.serving.cluster.sample_interval_s", lambda _workload: math.inf)
    plain = _cluster(router="least_tokens")
    assert len(sampled.series) > 0 and plain.series.empty
    _equal_results(sampled, plain)


def test_skip_ahead_worker_processes_and_stepping_sample_the_same_rows():
    one = _cluster("run.workers=1")
    assert len(one.series) > 20
    for other in (_cluster("run.workers=1", "run.skip_ahead=false"), _cluster("run.workers=2")):
        _equal_results(one, other)
        pd.testing.assert_frame_equal(one.series, other.series, check_exact=True)


def test_the_interval_is_the_arrival_span_over_500_with_a_floor():
    day = pd.DataFrame({"arrival_s": [10.0, 86_410.0]})
    assert sample_interval_s(day) == 86_400.0 / SAMPLES_OVER_ARRIVALS
    assert sample_interval_s(pd.DataFrame({"arrival_s": [0.0, 1.0]})) == MIN_SAMPLE_S
    assert sample_interval_s(pd.DataFrame({"arrival_s": []})) == MIN_SAMPLE_S


def _run(k: int) -> SimpleNamespace:
    """A run of k decode steps that recalled nothing (all ``record_decode_run`` reads with ``keep_steps=False``)."""
    return SimpleNamespace(steps=k, recall_bytes=None, jobs=None, sequential=None)


def test_a_run_of_steps_samples_what_single_steps_sample():
    times = [0.3 * i for i in range(41)]  # 40 steps of 0.3 s; one sample a second: at most one step a second
    blocks, hbm = list(range(10, 50)), [1000 + b for b in range(10, 50)]
    whole, single = (Recorder(4, keep_steps=False, sample_s=1.0) for _ in range(2))
    whole.record_decode_run(_run(40), times, [0.3] * 40, 5, 1, blocks, hbm, 0)
    for i in range(40):
        single.record_decode_run(_run(1), times[i : i + 2], [0.3], 5, 1, blocks[i : i + 1], hbm[i : i + 1], 0)
    assert whole.samples == single.samples
    starts = [row[0] for row in whole.samples]
    assert np.allclose(starts, [0.0, 1.2, 2.4, 3.6, 4.8, 6.0, 7.2, 8.4, 9.6, 10.8])  # first step past each due time
    assert whole.samples[1] == (starts[1], 1, 5, 1, blocks[4], hbm[4])  # the KV state after that step
    whole.record_prefill(11.5, 11.9, 2, 0, 4096, (60, 1060, 0))  # a prefill has its own due time
    assert whole.samples[-1] == (11.5, 0, 2, 0, 60, 1060)
    quiet = Recorder(4, keep_steps=False)  # no sample_s: nothing kept
    quiet.record_decode_run(_run(40), times, [0.3] * 40, 5, 1, blocks, hbm, 0)
    assert quiet.samples == []


def test_a_fleet_writes_its_series_with_a_policy_column(tmp_path):
    result = simulate(_scenario("serving.replicas=2", "policies=sglang,pulseinfer", "run.table_format=csv"))
    written = write_result(result, tmp_path)
    assert "replica_series.csv" in written
    table = pd.read_csv(tmp_path / "replica_series.csv")
    assert list(table.columns) == ["policy", *SERIES_COLUMNS]
    assert set(table["policy"]) == {"sglang", "pulseinfer"} and set(table["replica"]) == {0, 1}
    one = simulate(_scenario("run.table_format=csv"))
    assert not any(name.startswith("replica_series") for name in write_result(one, tmp_path / "one"))
