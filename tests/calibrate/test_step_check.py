"""calibrate.step_check and its input, traces.measured.forward_pass (per-iteration ForwardPassMetrics).

The record layout is the ``ForwardPassMetrics`` msgspec struct of sgl-project/sglang
``python/sglang/srt/observability/forward_pass_metrics.py`` (e861116ea4051e42983d13ce255111cd2c059fc1: with
``version`` and ``counter_id``; 48ccb9a4b9e8864b6d8e69363b2094e36b7e204f: without) and ai-dynamo/dynamo
``components/src/dynamo/common/forward_pass_metrics.py`` (327e70f4b436ac6ff9c038d9e0e513c259b5fe86); the console
form is what ``components/src/dynamo/common/recv_forward_pass_metrics.py`` (16487d648608ca2ab7eaa71e852cf57ca24393ed)
prints. The fixtures ``fixtures/measured/forward_pass_metrics.jsonl`` (12 records, msgspec JSON, one a line) and
``forward_pass_recv.txt`` (3 records of the struct's first release as recv prints them) are written by hand in
that layout — three requests (prompts 3100, 2100, 1200 tokens, 2048-token budget) going through chunked prefill,
mixed and decode-only iterations, with two idle heartbeats. Their wall times are plausible, not measured.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from calibrate.step_check import STEP_CHECK_COLUMNS, step_check, step_check_summary
from plots import step_check_figure
from plots.style import MissingData
from sim.config import load_scenario
from sim.policies import make_policy
from traces.measured import (
    IterationRun,
    MeasuredFormatError,
    detect_iteration_file,
    detect_measured_format,
    read_forward_pass_metrics,
)

FIXTURES = Path(__file__).resolve().parents[1] / "traces" / "fixtures" / "measured"
FPM = FIXTURES / "forward_pass_metrics.jsonl"
RECV = FIXTURES / "forward_pass_recv.txt"
SCENARIO_SETS = ["model=llama-3.1-8b", "hardware=h100-sxm", "serving.prefill=colocated", "policies=sglang"]


@pytest.fixture(scope="module")
def scenario():
    return load_scenario(None, SCENARIO_SETS)


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------------------------
# The reader


def test_reads_iterations_and_skips_heartbeats():
    run = read_forward_pass_metrics(FPM, engine="vllm-0.11.0")
    df = run.iterations
    assert isinstance(run, IterationRun) and run.tool == "forward_pass_metrics" and run.engine == "vllm-0.11.0"
    assert run.source_path == str(FPM)
    assert df["iteration"].tolist() == list(range(10))
    assert df["counter_id"].tolist() == list(range(1, 11))  # records 0 and 11 are idle heartbeats
    assert df["kind"].tolist() == ["prefill_only"] * 2 + ["mixed"] * 2 + ["decode_only"] * 6
    assert df["wall_time_s"].tolist() == [0.0612, 0.0447, 0.0391, 0.0268, 0.00712, 0.00715, 0.00719, 0.00698,
                                          0.00701, 0.00655]  # fmt: skip
    assert df["num_prefill_requests"].tolist() == [1, 2, 1, 1, 0, 0, 0, 0, 0, 0]
    assert df["num_prefill_tokens"].tolist() == [2048, 2048, 1104, 1200, 0, 0, 0, 0, 0, 0]
    # the second iteration finishes the 3100-token prompt (2048 computed before) and starts the 2100-token one
    assert df["sum_prefill_kv_tokens"].tolist() == [0, 2048, 996, 0, 0, 0, 0, 0, 0, 0]
    assert df["var_prefill_length"].iloc[1] == 250000.0  # population variance of 3100 and 2100
    assert df["num_decode_requests"].tolist() == [0, 0, 1, 2, 3, 3, 3, 2, 2, 1]
    assert df["sum_decode_kv_tokens"].tolist() == [0, 0, 3101, 5203, 6406, 6409, 6412, 4310, 4312, 3108]
    assert df["var_decode_kv_tokens"].iloc[3] == pytest.approx(((3102 - 2601.5) ** 2 + (2101 - 2601.5) ** 2) / 2)
    assert df["queued_prefill_requests"].tolist()[:3] == [2, 1, 0] and df["queued_prefill_tokens"].iloc[0] == 3300
    assert df["worker_id"].eq("dyn-worker-7f3a").all() and df["dp_rank"].eq(0).all()
    assert run.notes[:2] == [
        "read 10 iteration(s) of 12 record(s)",
        "skipped 2 idle heartbeat(s) (wall_time 0, nothing scheduled)",
    ]


def test_reads_the_recv_console_output_of_the_first_struct_release():
    run = read_forward_pass_metrics(RECV)
    df = run.iterations
    assert df["kind"].tolist() == ["mixed", "decode_only", "decode_only"]
    assert df["wall_time_s"].tolist() == [0.0391, 0.00712, 0.00655]
    assert df["sum_decode_kv_tokens"].tolist() == [3101, 6406, 3108]
    assert df["counter_id"].isna().all() and run.engine is None
    assert any("no counter_id" in note for note in run.notes)


def test_reads_records_in_a_receivers_envelope_and_as_a_json_list(tmp_path):
    records = [json.loads(line) for line in FPM.read_text().splitlines()]
    wrapped = tmp_path / "wrapped.jsonl"
    wrapped.write_text(
        "".join(json.dumps({"received_at": "2026-09-01T00:00:00Z", "transport_sequence": i, "metrics": r}) + "\n"
                for i, r in enumerate(records))
    )  # fmt: skip
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps(records, indent=1))
    expected = read_forward_pass_metrics(FPM).iterations
    for path in (wrapped, as_list):
        assert detect_iteration_file(path)
        pd.testing.assert_frame_equal(read_forward_pass_metrics(path).iterations, expected)


def test_detects_iteration_files_by_content_only(tmp_path):
    for path in (FPM, RECV):
        assert detect_iteration_file(path)
        renamed = tmp_path / f"x{path.suffix}.log"
        renamed.write_bytes(path.read_bytes())
        assert detect_iteration_file(renamed)
        with pytest.raises(MeasuredFormatError):
            detect_measured_format(path)  # not a per-request run, and not mistaken for one
    others = [p for p in FIXTURES.iterdir() if p not in (FPM, RECV)]
    assert len(others) >= 8
    for path in others:
        assert not detect_iteration_file(path), path.name
    assert not detect_iteration_file(FIXTURES / "vllm_requests" / "requests.jsonl")


def _fpm_lines() -> list[dict]:
    return [json.loads(line) for line in FPM.read_text().splitlines()]


def _write(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "fpm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _set(record: dict, dotted: str, value) -> None:
    *parents, key = dotted.split(".")
    for parent in parents:
        record = record[parent]
    if value is KeyError:
        del record[key]
    else:
        record[key] = value


@pytest.mark.parametrize(
    ("index", "field", "value", "expected"),
    [
        (5, "wall_time", -0.007, r"field 'wall_time' index 5: negative time -0\.007; expected >= 0 seconds$"),
        (
            5,
            "wall_time",
            float("nan"),
            r"field 'wall_time' index 5: expected a non-negative number of seconds, got nan",
        ),
        (
            6,
            "wall_time",
            float("inf"),
            r"field 'wall_time' index 6: expected a non-negative number of seconds, got inf",
        ),
        (7, "wall_time", 0.0, r"field 'wall_time' index 7: 0 seconds for an iteration that scheduled 3 request"),
        (4, "wall_time", KeyError, r"not a ForwardPassMetrics file .*: missing 'wall_time' at index 4"),
        (4, "scheduled_requests", KeyError, r"missing 'scheduled_requests' at index 4"),
        (
            3,
            "scheduled_requests.num_decode_requests",
            KeyError,
            r"missing 'scheduled_requests\.num_decode_requests' at index 3",
        ),
        (
            3,
            "scheduled_requests.sum_decode_kv_tokens",
            -1,
            r"field 'scheduled_requests\.sum_decode_kv_tokens' index 3: expected a non-negative integer, got -1$",
        ),
        (
            5,
            "scheduled_requests.sum_decode_kv_tokens",
            2,
            r"field 'scheduled_requests\.sum_decode_kv_tokens' index 5: 2 token\(s\) for 3 decode request\(s\)",
        ),
        (
            1,
            "scheduled_requests.var_prefill_length",
            -4.0,
            r"field 'scheduled_requests\.var_prefill_length' index 1: expected a non-negative variance, got -4\.0$",
        ),
        (2, "version", 2, r"field 'version' index 2: unsupported version 2; expected 1$"),
    ],
)
def test_bad_records_are_one_line_errors_naming_the_field(tmp_path, index, field, value, expected):
    records = _fpm_lines()
    _set(records[index], field, value)
    path = _write(tmp_path, records)
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_forward_pass_metrics(path)
    message = _one_line(excinfo)
    assert message.startswith(f"{path} line {index + 1}: ")
    assert re.search(expected, message), message


def test_missing_optional_fields_are_noted_not_invented(tmp_path):
    records = _fpm_lines()
    for r in records:
        del r["scheduled_requests"]["sum_prefill_kv_tokens"], r["scheduled_requests"]["var_decode_kv_tokens"]
    run = read_forward_pass_metrics(_write(tmp_path, records))
    assert run.iterations["sum_prefill_kv_tokens"].eq(0).all()
    assert run.iterations["var_decode_kv_tokens"].isna().all()
    assert any("scheduled_requests.sum_prefill_kv_tokens" in n and "var_decode_kv_tokens" in n for n in run.notes)


# ---------------------------------------------------------------------------------------------------------------
# step_check: a known truth built from the simulator's own step model


# (decode requests, their summed context, prefill requests, prefill tokens, prefill KV read)
COMPOSITIONS = [
    (1, 900, 0, 0, 0),
    (8, 8 * 1500, 0, 0, 0),
    (64, 64 * 2400 + 17, 0, 0, 0),
    (200, 200 * 700, 0, 0, 0),
    (16, 16 * 1000, 1, 512, 0),
    (40, 40 * 3000, 3, 1500, 4096),
    (0, 0, 1, 2048, 0),
    (0, 0, 4, 8190, 1024),
]


def _truth_s(policy, n_dec: int, kv_dec: int, n_pre: int, tok_pre: int, kv_pre: int) -> float:
    """The simulator's time for one forward, written out from ComputeModel as sim/serving and sim/step combine it:
    a decode step is overhead (+ the chunks' extra FLOPs) + L layers + head (no engine here overlaps host work);
    a prefill-only forward is ``prefill_s``."""
    compute = policy.compute
    assert compute.overlapped_host_s(n_dec) == 0.0  # the sglang-0.4 card overlaps nothing: the max rule is moot
    chunks = []
    if n_pre:
        q, r = divmod(tok_pre, n_pre)
        kq, kr = divmod(kv_pre, n_pre)
        chunks = [(q + (i < r), kq + (i < kr)) for i in range(n_pre)]
    if not n_dec:
        return compute.prefill_s(chunks, n_pre)
    extra = compute.prefill_extra_s(chunks, n_pre) if chunks else 0.0
    layer = compute.decode_layer_s(n_dec, kv_dec)
    return compute.step_overhead_s + extra + compute.num_layers * layer + compute.decode_head_s(n_dec)


def _iteration_file(tmp_path: Path, compositions, times) -> Path:
    records = []
    for counter, ((n_dec, kv_dec, n_pre, tok_pre, kv_pre), wall) in enumerate(zip(compositions, times, strict=True)):
        records.append({
            "version": 1, "worker_id": "w", "dp_rank": 0, "counter_id": counter, "wall_time": wall,
            "scheduled_requests": {
                "num_prefill_requests": n_pre, "sum_prefill_tokens": tok_pre, "var_prefill_length": 0.0,
                "sum_prefill_kv_tokens": kv_pre, "num_decode_requests": n_dec, "sum_decode_kv_tokens": kv_dec,
                "var_decode_kv_tokens": 0.0,
            },
        })  # fmt: skip
    return _write(tmp_path, records)


@pytest.fixture(scope="module")
def truth(scenario):
    policy = make_policy(scenario, "sglang")
    return np.array([_truth_s(policy, *c) for c in COMPOSITIONS])


def test_the_simulators_own_times_give_zero_error(tmp_path, scenario, truth):
    run = read_forward_pass_metrics(_iteration_file(tmp_path, COMPOSITIONS, truth.tolist()))
    table = step_check(run, scenario)
    assert list(table.columns) == STEP_CHECK_COLUMNS
    assert table["kind"].tolist() == ["decode_only"] * 4 + ["mixed"] * 2 + ["prefill_only"] * 2
    assert table["num_decode_requests"].tolist() == [c[0] for c in COMPOSITIONS]
    assert table["mean_decode_context"].iloc[2] == pytest.approx(2400 + 17 / 64)
    assert math.isnan(table["mean_decode_context"].iloc[6])
    np.testing.assert_allclose(table["simulated_s"], truth, rtol=1e-12)
    np.testing.assert_allclose(table["error_pct"], 0.0, atol=1e-9)
    # the times are the model's, not constants: more context and more requests take longer
    assert truth[1] > truth[0] and truth[3] > truth[1] and truth[6] > truth[0]


def test_doubling_the_measured_times_gives_minus_fifty_percent(tmp_path, scenario, truth):
    run = read_forward_pass_metrics(_iteration_file(tmp_path, COMPOSITIONS, (2 * truth).tolist()))
    table = step_check(run, scenario)
    np.testing.assert_allclose(table["error_pct"], -50.0, atol=1e-9)
    summary = step_check_summary(table)
    assert summary["all"]["count"] == 8
    assert summary["decode_only"]["count"] == 4 and summary["mixed"]["count"] == 2
    assert summary["prefill_only"]["count"] == 2
    for kind in ("all", "decode_only", "mixed", "prefill_only"):
        stats = summary[kind]
        assert stats["mape_pct"] == pytest.approx(50.0)
        assert stats["mean_error_pct"] == pytest.approx(-50.0)
        assert stats["total_error_pct"] == pytest.approx(-50.0)
        for p in (10, 50, 90):
            assert stats[f"p{p}_error_pct"] == pytest.approx(-50.0)


def test_summary_statistics_by_hand(scenario):
    table = pd.DataFrame(
        {
            "kind": ["decode_only", "decode_only", "mixed", "decode_only"],
            "measured_s": [1.0, 2.0, 4.0, 1.0],
            "simulated_s": [1.1, 1.8, 5.0, 1.0],
            "error_pct": [10.0, -10.0, 25.0, 0.0],
        }
    )
    summary = step_check_summary(table)
    dec = summary["decode_only"]
    assert dec["count"] == 3 and dec["mape_pct"] == pytest.approx(20 / 3) and dec["mean_error_pct"] == 0.0
    assert dec["p50_error_pct"] == 0.0 and dec["p10_error_pct"] == pytest.approx(-8.0)
    assert dec["total_error_pct"] == pytest.approx((3.9 - 4.0) / 4.0 * 100)
    assert summary["all"]["count"] == 4 and summary["all"]["mean_error_pct"] == pytest.approx(25 / 4)
    assert summary["prefill_only"]["count"] == 0 and math.isnan(summary["prefill_only"]["mape_pct"])


def test_fixture_runs_end_to_end_and_draws(scenario):
    table = step_check(read_forward_pass_metrics(FPM), scenario)
    assert len(table) == 10 and np.isfinite(table["simulated_s"]).all() and (table["simulated_s"] > 0).all()
    np.testing.assert_allclose(
        table["error_pct"], (table["simulated_s"] - table["measured_s"]) / table["measured_s"] * 100
    )
    fig = step_check_figure(table)
    assert isinstance(fig, Figure)
    scatter, hist = fig.axes
    assert scatter.get_xscale() == "log" and scatter.get_yscale() == "log"
    assert len(scatter.collections) == 3 and len(hist.patches) > 0
    with pytest.raises(MissingData):
        step_check_figure(table.iloc[:0])


def test_a_policy_that_is_not_dense_or_not_there_is_refused(scenario):
    run = read_forward_pass_metrics(RECV)
    with pytest.raises(ValueError, match="policy 'nope' is not in the scenario"):
        step_check(run, scenario, policy="nope")
