"""Output at the size of the question (issue 19): the column recorder, ``run.tables: summary`` and
``run.table_format`` (CSV / Parquet).

- The step table built from the recorder's column arrays equals one tuple per step built from what the replica
  hands the recorder (``pd.DataFrame(rows, columns=STEP_COLUMNS)``), kept here as the reference builder, on a run
  of every policy kind (prefill and decode steps, offloaded requests, recalls), with and without skip-ahead.
- The requests table built column-wise equals the previous row-by-row builder, kept here as the reference, on
  generated requests (finished, cut, rejected, one output token, never admitted to decode, any order) and on a
  run's requests.
- ``run.tables: summary`` keeps no step rows, yet gives the same summary bit for bit and the same requests
  table, for single runs and for a cluster; it writes only summary.csv, the requests table and scenario.yaml.
- Parquet round trip (skipped without pyarrow); ``parquet`` without pyarrow is one error naming the field, the
  value and the fix; ``auto`` picks Parquet exactly when pyarrow is installed.
"""

from __future__ import annotations

import importlib.util
import math
import pickle

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plots.tables import read_table, table_path
from pulseinfer.cli import EXIT_BAD_INPUT, main
from pulseinfer.tables_io import write_result
from sim.config import ScenarioError, load_scenario
from sim.config.files import resolve_table_format
from sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS, Recorder, requests_table
from sim.metrics.recorder import RECALL_COLUMNS
from sim.run import simulate, simulate_policy
from sim.serving.cluster import simulate_cluster
from sim.serving.request import Request
from sim.workload import load_workload
from tests.sim.oracles.steps import recorded_run

# 30 Mooncake requests, colocated prefill (prefill and decode rows), every policy kind of the default scenario.
SMALL = ["workload.max_requests=30", "serving.prefill=colocated", "run.progress=false"]


def _reference_recording(rows: list):
    """The step table's rows as tuples, one per step, built from what the replica hands ``Recorder.record_prefill``
    and ``Recorder.record_decode_run`` (one run of k ≥ 1 decode steps: k tuples); appended to ``rows``."""

    def prefill(self, start_s, end_s, batch_size, num_offloaded, prefill_tokens, kv_state):
        blocks_used, hbm_bytes, host_bytes = kv_state
        rows.append(
            (len(rows), "prefill", start_s, end_s - start_s, batch_size, num_offloaded, prefill_tokens, 0, 0, 0, 0,
             0.0, 0.0, 0.0, blocks_used, hbm_bytes, host_bytes, 0)
        )  # fmt: skip

    def decode(self, run, times_s, steps_s, batch_size, num_offloaded, blocks_used, hbm_bytes, host_bytes):
        start_s, duration_s, attended = times_s[:-1], steps_s, run.attended_tokens
        for i in range(run.steps):
            recall = run.recall_bytes is not None
            r = {name: getattr(run, name)[i] for name in RECALL_COLUMNS} if recall else None
            ints = (0, 0, 0, 0) if r is None else tuple(int(r[c]) for c in INT_RECALL)
            floats = (0.0, 0.0, 0.0) if r is None else tuple(float(r[c]) for c in FLOAT_RECALL)
            rows.append(
                (len(rows), "decode", float(start_s[i]), float(duration_s[i]), batch_size, num_offloaded, 0,
                 int(attended[i]), *ints[:3], *floats, int(blocks_used[i]), int(hbm_bytes[i]), host_bytes, ints[3])
            )  # fmt: skip

    return prefill, decode


INT_RECALL = ("recall_bytes", "num_fragments", "num_transfers", "selected_fragments")
FLOAT_RECALL = ("stall_s", "link_busy_s", "gather_busy_s")


def _reference_requests_table(reqs: list) -> pd.DataFrame:
    """The previous ``requests_table``: one tuple per request, then sorted by request_id."""
    rows = []
    for r in reqs:
        done = not np.isnan(r.finish_s) and not r.unfinished_reason
        ttft = r.first_token_s - r.arrival_s
        e2e = r.finish_s - r.arrival_s if done else np.nan
        tpot = (e2e - ttft) / (r.output_tokens - 1) if done and r.output_tokens > 1 else np.nan
        admit = r.first_token_s if np.isnan(r.decode_admit_s) else r.decode_admit_s
        ttft_client = admit - r.arrival_s
        tpot_client = (e2e - ttft_client) / (r.output_tokens - 1) if done and r.output_tokens > 1 else np.nan
        rows.append(
            (
                r.request_id, r.arrival_s, r.first_token_s, r.finish_s, ttft, tpot, e2e, r.prompt_tokens,
                r.output_tokens, r.generated, r.offloaded, r.num_preemptions, done, r.unfinished_reason,
                max(r.prefix_hit_tokens, 0), r.decode_admit_s, ttft_client, tpot_client, admit - r.first_token_s,
                r.scheduled_s,
            )
        )  # fmt: skip
    df = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    return df.sort_values("request_id", kind="stable").reset_index(drop=True)


times = st.floats(0, 1e4, allow_nan=False) | st.just(math.nan)


@st.composite
def served_requests(draw) -> list[Request]:
    """Requests in any state a run leaves them in, in any order (ids may repeat: the sort must be stable)."""
    reqs = []
    for _ in range(draw(st.integers(1, 12))):
        arrival = draw(st.floats(0, 1e3))
        req = Request(draw(st.integers(0, 20)), arrival, draw(st.integers(1, 10**5)), draw(st.integers(1, 4)))
        req.first_token_s, req.finish_s, req.decode_admit_s = draw(times), draw(times), draw(times)
        req.generated, req.num_preemptions = draw(st.integers(0, 4)), draw(st.integers(0, 3))
        req.offloaded, req.prefix_hit_tokens = draw(st.booleans()), draw(st.integers(-1, 500))
        req.unfinished_reason = draw(st.sampled_from(["", "", "horizon", "stuck", "prompt exceeds the KV pool"]))
        reqs.append(req)
    return reqs


@given(served_requests())
def test_requests_table_equals_the_row_builder(reqs):
    pd.testing.assert_frame_equal(requests_table(reqs), _reference_requests_table(reqs), check_exact=True)


def test_requests_table_equals_the_row_builder_on_a_run(monkeypatch):
    # a horizon that cuts the run: finished, cut and never-started requests
    scenario = load_scenario("default", [*SMALL, "workload.max_requests=60", "run.horizon_s=60", "policies=sglang"])
    seen = []
    monkeypatch.setattr("sim.run.requests_table", lambda reqs: seen.append(list(reqs)) or requests_table(reqs))
    simulate(scenario)
    (reqs,) = seen
    table = requests_table(reqs)
    assert table["finished"].any() and not table["finished"].all()
    pd.testing.assert_frame_equal(table, _reference_requests_table(reqs), check_exact=True)
    assert requests_table([]).columns.tolist() == REQUEST_COLUMNS


@pytest.fixture(scope="module")
def full_and_summary():
    """The small scenario simulated with every table and with ``run.tables: summary``."""
    full = simulate(load_scenario("default", SMALL))
    only = simulate(load_scenario("default", [*SMALL, "run.tables=summary"]))
    return full, only


@pytest.mark.parametrize("skip_ahead", [False, True])
def test_step_table_from_columns_equals_the_tuple_builder(monkeypatch, skip_ahead):
    """Prefill rows, decode steps recorded as runs of one and (skip-ahead) longer runs, merged into columns."""
    scenario = load_scenario("default", [*SMALL, f"run.skip_ahead={str(skip_ahead).lower()}"])
    workload = load_workload(scenario)
    real_prefill, real_decode = Recorder.record_prefill, Recorder.record_decode_run
    for i, policy in enumerate(scenario.policies):
        rows: list[tuple] = []
        ref_prefill, ref_decode = _reference_recording(rows)

        def prefill(self, *args, _ref=ref_prefill):
            _ref(self, *args)
            real_prefill(self, *args)

        def decode(self, *args, _ref=ref_decode):
            _ref(self, *args)
            real_decode(self, *args)

        monkeypatch.setattr(Recorder, "record_prefill", prefill)
        monkeypatch.setattr(Recorder, "record_decode_run", decode)
        steps = simulate_policy(scenario, workload, policy, seed_index=i).steps
        expected = pd.DataFrame(rows, columns=STEP_COLUMNS)
        assert set(steps["phase"]) == {"prefill", "decode"}
        pd.testing.assert_frame_equal(steps, expected, check_exact=True)  # values and dtypes
    assert (steps["recall_bytes"] > 0).any()  # the last policy (pulseinfer) recalled


def test_summary_only_gives_the_same_summary_and_requests(full_and_summary):
    full, only = full_and_summary
    pd.testing.assert_frame_equal(full.summary, only.summary, check_exact=True)
    assert (full.summary["offloaded_frac"] > 0).any() and (full.summary["recall_gb_per_step"] > 0).any()
    for name, res in full.policies.items():
        pd.testing.assert_frame_equal(res.requests, only.policies[name].requests, check_exact=True)
        other = only.policies[name]
        assert other.steps is None and other.layers is None and other.layer_recall is None and other.timeline is None


def test_summary_only_recorder_keeps_no_step_rows():
    scenario = load_scenario("default", [*SMALL, "run.tables=summary", "policies=pulseinfer"])
    rec = Recorder(scenario.model.num_layers, keep_steps=False)
    rec.record_prefill(0.0, 1.0, 1, 0, 100, (5, 10, 0))
    run = recorded_run(1, [0.25], [9])
    rec.record_decode_run(run, [1.0, 1.5], [0.5], 2, 1, [7], [10], 0)
    assert rec.totals.num_steps == 2 and rec.totals.peak_kv_used_blocks == 7
    assert rec.totals.decode_time_s == 0.5 and rec.totals.prefill_time_s == 1.0 and rec.totals.decode_stall_s == 0.25
    assert all(len(column) == 0 for column in rec._columns.values())
    with pytest.raises(ValueError, match="keeps no step rows"):
        rec.step_columns()


def test_summary_totals_add_step_by_step_in_constant_memory():
    """The totals' float sums are those of single steps added in order whatever the runs' lengths, and keep nothing
    per step (64 replicas × 1M requests record ~2·10⁸ steps: 16 bytes a step was ~3.4 GB)."""
    rng = np.random.default_rng(3)
    durations, stalls = rng.uniform(0.005, 0.05, 1000).tolist(), rng.uniform(0.0, 0.004, 1000).tolist()
    one, runs = Recorder(4, keep_steps=False), Recorder(4, keep_steps=False)
    total_s = stall_s = 0.0
    for i in range(1000):
        one.record_decode_run(recorded_run(1, [stalls[i]]), [0.0, 0.0], [durations[i]], 1, 1, [1], [1], 0)
        total_s += durations[i]
        stall_s += stalls[i]
    size = len(pickle.dumps(one.totals))
    cuts = [0, 1, 3, 200, 201, 640, 1000]  # runs of 1, 2, 197, 1, 439 and 360 steps
    for a, b in zip(cuts, cuts[1:]):
        k = b - a
        runs.record_decode_run(recorded_run(k, stalls[a:b]), [0.0] * (k + 1), durations[a:b], 1, 1, [1] * k, [1] * k, 0)
    assert one.totals == runs.totals
    assert (one.totals.decode_time_s, one.totals.decode_stall_s) == (total_s, stall_s)  # a loop of +=, bit for bit
    assert len(pickle.dumps(runs.totals)) == size  # nothing grew with the steps


def test_cluster_summary_is_the_same_in_both_modes():
    scenario = load_scenario("default", [*SMALL, "policies=pulseinfer"])
    only = load_scenario("default", [*SMALL, "policies=pulseinfer", "run.tables=summary"])
    a = simulate_cluster(scenario, load_workload(scenario), "pulseinfer", 2, "least_tokens")
    b = simulate_cluster(only, load_workload(only), "pulseinfer", 2, "least_tokens")
    assert a.summary.keys() == b.summary.keys()
    for key, value in a.summary.items():
        assert value == b.summary[key] or (np.isnan(value) and np.isnan(b.summary[key])), key


def test_summary_only_writes_summary_requests_and_scenario(full_and_summary, tmp_path):
    _, only = full_and_summary
    written = write_result(only, tmp_path)
    table = "requests.parquet" if importlib.util.find_spec("pyarrow") else "requests.csv"
    assert written == ["summary.csv", table, "scenario.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)
    assert load_scenario(tmp_path / "scenario.yaml").run.tables == "summary"


def test_csv_tables_read_back(full_and_summary, tmp_path):
    full, _ = full_and_summary
    scenario = full.scenario.model_copy(update={"run": full.scenario.run.model_copy(update={"table_format": "csv"})})
    full.scenario, saved = scenario, full.scenario
    try:
        written = write_result(full, tmp_path)
    finally:
        full.scenario = saved
    assert written == [
        "summary.csv", "requests.csv", "steps.csv", "layers.csv", "layer_recall.csv", "timeline.csv", "scenario.yaml",
    ]  # fmt: skip
    steps = read_table(tmp_path, "steps")
    assert len(steps) == sum(len(r.steps) for r in full.policies.values())
    assert table_path(tmp_path, "steps.csv") == tmp_path / "steps.csv"


def test_parquet_round_trip_is_exact(full_and_summary, tmp_path):
    pytest.importorskip("pyarrow")
    full, _ = full_and_summary
    scenario = full.scenario.model_copy(
        update={"run": full.scenario.run.model_copy(update={"table_format": "parquet"})}
    )
    full.scenario, saved = scenario, full.scenario
    try:
        written = write_result(full, tmp_path)
    finally:
        full.scenario = saved
    assert "steps.parquet" in written and not (tmp_path / "steps.csv").exists()
    for name in ("requests", "steps", "layers", "timeline"):
        frames = [getattr(r, name).assign(policy=p) for p, r in full.policies.items()]
        expected = pd.concat(frames, ignore_index=True)
        expected = expected[["policy"] + [c for c in expected.columns if c != "policy"]]
        pd.testing.assert_frame_equal(read_table(tmp_path, name), expected, check_exact=True, check_dtype=False)
    assert table_path(tmp_path, "steps.csv") == tmp_path / "steps.parquet"  # a reader asking for the CSV name


@pytest.fixture
def no_pyarrow(monkeypatch):
    """Pretend pyarrow is not installed (``importlib.util.find_spec`` finds no ``pyarrow``)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))


def test_auto_format_follows_pyarrow(no_pyarrow):
    assert resolve_table_format("auto") == "csv"
    assert resolve_table_format("csv") == "csv"


def test_auto_format_is_parquet_with_pyarrow():
    pytest.importorskip("pyarrow")
    assert resolve_table_format("auto") == "parquet"


def test_parquet_without_pyarrow_names_field_value_and_fix(no_pyarrow):
    with pytest.raises(ScenarioError) as err:
        load_scenario("default", ["run.table_format=parquet"])
    message = str(err.value)
    assert message.startswith("run.table_format: ") and "'parquet'" in message
    assert "pip install 'pulseinfer[parquet]'" in message and "\n" not in message
    assert load_scenario("default", ["run.table_format=auto"]).run.table_format == "auto"


def test_cli_parquet_without_pyarrow_is_one_error_line(no_pyarrow, tmp_path, capsys):
    code = main(["simulate", "--set", "run.table_format=parquet", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip()]
    assert "run.table_format" in err and "pulseinfer[parquet]" in err
    assert not (tmp_path / "o").exists()


def test_cli_summary_only(tmp_path, capsys):
    sets = ["workload.trace=null", "workload.synthetic.num_requests=5", "workload.synthetic.rate_per_s=10",
            "workload.synthetic.prompt_tokens_mean=1000", "workload.synthetic.output_tokens_mean=20"]  # fmt: skip
    args = [arg for item in sets for arg in ("--set", item)]
    assert main(["simulate", *args, "--summary-only", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    names = sorted(p.name for p in (tmp_path / "o").iterdir() if not p.name.startswith("."))
    assert names == sorted(["summary.csv", table_path(tmp_path / "o", "requests").name, "scenario.yaml"])
    assert "summary.csv, requests." in capsys.readouterr().out
