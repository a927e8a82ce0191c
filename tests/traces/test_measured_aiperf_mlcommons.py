"""traces.measured.aiperf and traces.measured.mlcommons: NVIDIA AIPerf's profile_export.jsonl and the MLCommons
endpoints client's result_summary.json.

Field lists (the fixtures and the writers below follow them):

- AIPerf, ai-dynamo/aiperf at db4f6397d11ee2d4cfbb41f70b2327315163dcf0: `aiperf/common/models/record_models.py`
  (`MetricRecordInfo` {metadata, metrics, error}, `MetricRecordMetadata`, `MetricValue` {value, unit}),
  `aiperf/post_processors/record_export_results_processor.py` (one record per line, display units: ms for times),
  `aiperf/metrics/types/*.py` (request_latency, time_to_first_token, inter_chunk_latency, inter_token_latency,
  input_sequence_length / error_isl, output_sequence_length, output_token_count,
  output_token_throughput_per_user), `aiperf/common/models/export_models.py` (`JsonExportData`, the aggregate
  profile_export_aiperf.json) and docs/tutorials/working-with-profile-exports.md (example records).
- MLCommons endpoints, mlcommons/endpoints at ea3327530376fef63d706f4105612e17c2c80a8d:
  `src/inference_endpoint/metrics/report.py` (`Report`, `_series_to_metric_dict`: {total, min, max, median, avg,
  std_dev, percentiles, histogram {buckets, counts}}), `src/inference_endpoint/async_utils/services/
  metrics_aggregator/registry.py` (`_log_spaced_edges`, `SeriesSampler._exact_stat`: np.histogram over 30
  log-spaced bins, percentiles method="lower", `DEFAULT_PERCENTILES`), `.../metrics_table.py` (what each series
  holds), `src/inference_endpoint/config/schema.py` (`run_config.load_pattern`, `warmup`). The fixture was written
  as with `--no-early-stopping` (no `early_stopping_percentiles` maps).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from traces.measured import (
    MEASURED_FORMATS,
    MeasuredFormatError,
    build_requests,
    detect_measured_format,
    read_measured,
)
from traces.measured.aiperf import read_aiperf_profile_export
from traces.measured.mlcommons import read_mlcommons_result_summary

FIXTURES = Path(__file__).parent / "fixtures" / "measured"
AIPERF_DIR = FIXTURES / "aiperf_run"
AIPERF = AIPERF_DIR / "profile_export.jsonl"
AIPERF_AGG = AIPERF_DIR / "profile_export_aiperf.json"
MLCOMMONS = FIXTURES / "mlcommons_result_summary.json"
OURS = {"aiperf_profile_export", "mlcommons_endpoints"}


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------------------------
# Writers in each tool's format (the round trips, and how the fixtures were made)

MS_PER_NS = 1000 / 1_000_000_000  # aiperf: MetricTimeUnit.convert_to, value * (other.per_second / self.per_second)


def _tv(ns: float) -> dict[str, Any]:
    return {"value": ns * MS_PER_NS, "unit": "ms"}


def _tokens(n: int) -> dict[str, Any]:
    return {"value": n, "unit": "tokens"}


def aiperf_record(
    session: int,
    start_ns: int,
    ttft_ns: int,
    gaps_ns: list[int],
    isl: int,
    osl: int,
    error: dict[str, Any] | None = None,
    cancelled: bool = False,
    phase: str = "profiling",
) -> dict[str, Any]:
    """One MetricRecordInfo line as RecordExportResultsProcessor writes it (times in ms)."""
    if error is None:
        latency_ns = ttft_ns + sum(gaps_ns)
        metrics: dict[str, Any] = {"input_sequence_length": _tokens(isl), "time_to_first_token": _tv(ttft_ns)}
        metrics["request_latency"] = _tv(latency_ns)
        metrics["output_token_count"] = _tokens(osl)
        if gaps_ns:
            metrics["inter_chunk_latency"] = {"value": [g * MS_PER_NS for g in gaps_ns], "unit": "ms"}
        metrics["output_sequence_length"] = _tokens(osl)
        if osl >= 2:
            itl_ns = (latency_ns - ttft_ns) / (osl - 1)
            metrics["inter_token_latency"] = _tv(itl_ns)
            metrics["output_token_throughput_per_user"] = {"value": 1e9 / itl_ns, "unit": "tokens/sec/user"}
        end_ns = start_ns + latency_ns
    else:
        metrics = {"error_isl": _tokens(isl)}
        end_ns = start_ns + ttft_ns
    metadata = {
        "session_num": session,
        "x_request_id": f"00000000-0000-4000-8000-{session:012d}",
        "x_correlation_id": f"00000000-0000-4000-9000-{session:012d}",
        "conversation_id": f"conv-{session:04d}",
        "turn_index": 0,
        "request_start_ns": start_ns,
        "request_ack_ns": start_ns + 1_200_000 if error is None else None,
        "request_end_ns": end_ns,
        "worker_id": f"worker_{session % 2:08x}",
        "record_processor_id": "record_processor_0a1b2c3d",
        "benchmark_phase": phase,
        "was_cancelled": cancelled,
        "cancellation_time_ns": end_ns if cancelled else None,
    }
    return {"metadata": metadata, "metrics": metrics, "error": error}


def write_aiperf(records: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _edges(low: float, high: float, n: int) -> list[float]:
    """endpoints' registry._log_spaced_edges."""
    safe_low = max(float(low), 1.0)
    safe_high = max(float(high), safe_low * 10.0)
    lo, hi = math.log(safe_low), math.log(safe_high)
    step = (hi - lo) / n
    return [math.exp(lo + i * step) for i in range(n + 1)]


PERCENTILES = (99.9, 99.0, 97.0, 95.0, 90.0, 80.0, 75.0, 50.0, 25.0, 10.0, 5.0, 1.0)


def endpoints_series(values: list[float] | np.ndarray, n_buckets: int = 30, dtype: type = int) -> dict[str, Any]:
    """One series of result_summary.json as SeriesSampler._exact_stat + Report._series_to_metric_dict make it."""
    if not len(values):
        return {}
    arr = np.sort(np.asarray(values, dtype=np.int64 if dtype is int else np.float64))
    count = len(arr)
    total = int(arr.sum()) if dtype is int else float(arr.sum())
    sum_sq = int((arr.astype(object) ** 2).sum()) if dtype is int else float((arr**2).sum())
    s_min = int(arr[0]) if dtype is int else float(arr[0])
    s_max = int(arr[-1]) if dtype is int else float(arr[-1])
    perc = {str(p): float(v) for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES, method="lower"))}
    edges = _edges(s_min, s_max, n_buckets)
    counts, _ = np.histogram(np.clip(arr, edges[0], edges[-1]), bins=edges)
    if count > 1 and dtype is int:
        std = math.sqrt(max(0, count * sum_sq - total * total)) / math.sqrt(count * (count - 1))
    elif count > 1:
        std = math.sqrt(max(0.0, (sum_sq - total * total / count) / (count - 1)))
    else:
        std = 0.0
    return {
        "total": total,
        "min": s_min,
        "max": s_max,
        "median": perc["50.0"],
        "avg": total / count,
        "std_dev": std,
        "percentiles": perc,
        "histogram": {
            "buckets": [[edges[i], edges[i + 1]] for i in range(n_buckets)],
            "counts": [int(c) for c in counts],
        },
    }


def write_result_summary(
    path: Path,
    latency_ns: list[int],
    isl: list[int],
    osl: list[int],
    ttft_ns: list[int] | None = None,
    tpot_ns: list[float] | None = None,
    failed: int = 0,
    duration_ns: int | None = 4_000_000_000,
    load_pattern: dict[str, Any] | None = None,
) -> Path:
    """A result_summary.json as Report.to_json writes it."""
    n = len(latency_ns)
    osl_series = endpoints_series(osl)
    qps = n / (duration_ns / 1e9) if duration_ns else None
    summary = {
        "version": "0.1.0",
        "git_sha": "ea33275",
        "test_started_at": 0,
        "n_samples_issued": n,
        "n_samples_completed": n,
        "n_samples_failed": failed,
        "duration_ns": duration_ns,
        "state": "complete",
        "complete": True,
        "ttft": endpoints_series(ttft_ns or []),
        "tpot": endpoints_series(tpot_ns or [], dtype=float),
        "latency": endpoints_series(latency_ns),
        "output_sequence_lengths": osl_series,
        "input_sequence_lengths": endpoints_series(isl),
        "legacy_loadgen_window_duration_ns": None,
        "qps": qps,
        "tps": osl_series["total"] / (duration_ns / 1e9) if duration_ns and osl_series else None,
        "finish_reason_counts": {
            "stop": n - failed,
            "length": 0,
            "tool_calls": 0,
            "content_filter": 0,
            "function_call": 0,
            "other": 0,
        },
        "run_config": {
            "load_pattern": load_pattern or {"type": "concurrency", "target_qps": None, "target_concurrency": 4},
            "warmup": {"enabled": False, "n_requests": None, "salt": False, "drain": False, "warmup_random_seed": 42},
            "scheduler_random_seed": 42,
            "dataloader_random_seed": 42,
        },
    }
    path.write_text(json.dumps(summary, indent=2))
    return path


def _rebuilt(stat: dict[str, Any]) -> list[float]:
    """The spec of the rebuild, by hand: each count at the midpoint of its bin cut to [min, max] (bin 0 from min)."""
    out = []
    for j, ((lo, hi), c) in enumerate(zip(stat["histogram"]["buckets"], stat["histogram"]["counts"])):
        a = stat["min"] if j == 0 else max(lo, stat["min"])
        b = min(hi, stat["max"])
        out += [(a + b) / 2] * c
    return sorted(out)


# ---------------------------------------------------------------------------------------------------------------
# AIPerf: the fixture


def test_aiperf_fixture_reads_records_in_send_order_with_the_aggregates_settings():
    run = read_aiperf_profile_export(AIPERF)
    df = run.requests
    lines = [json.loads(line) for line in AIPERF.read_text().splitlines()]
    profiling = [r for r in lines if r["metadata"]["benchmark_phase"] == "profiling"]
    assert len(lines) == 13 and len(profiling) == 12 == len(df) == run.num_prompts
    assert any("warmup" in note for note in run.notes)
    # rows in send order; the file is in completion order
    by_start = sorted(profiling, key=lambda r: r["metadata"]["request_start_ns"])
    assert [r["metadata"]["session_num"] for r in by_start] != [r["metadata"]["session_num"] for r in profiling]
    t0 = by_start[0]["metadata"]["request_start_ns"]
    want_arrivals = [(r["metadata"]["request_start_ns"] - t0) / 1e9 for r in by_start]
    np.testing.assert_allclose(df["arrival_s"], want_arrivals, rtol=0, atol=1e-12)
    assert df["arrival_s"].iloc[0] == 0.0 and run.load == "trace"
    # success: error null and not cancelled (sessions 6 = HTTP 500, 9 = cancelled)
    failed_sessions = {r["metadata"]["session_num"] for r in by_start if r["error"] is not None}
    assert failed_sessions == {6, 9}
    assert df["success"].tolist() == [r["error"] is None for r in by_start]
    assert int(df["success"].sum()) == 10
    ok = df[df["success"]]
    # by hand from the fixture's ms values
    e2e_ms = [r["metrics"]["request_latency"]["value"] for r in by_start if r["error"] is None]
    ttft_ms = [r["metrics"]["time_to_first_token"]["value"] for r in by_start if r["error"] is None]
    assert ok["e2e_s"].mean() == pytest.approx(sum(e2e_ms) / 10 / 1000, rel=1e-12)
    assert ok["ttft_s"].mean() == pytest.approx(sum(ttft_ms) / 10 / 1000, rel=1e-12)
    assert ok["e2e_s"].mean() == pytest.approx(0.3351465, abs=1e-6)
    assert ok["ttft_s"].mean() == pytest.approx(0.1373871, abs=1e-6)
    assert df["prompt_tokens"].tolist() == [
        r["metrics"].get("input_sequence_length", r["metrics"].get("error_isl"))["value"] for r in by_start
    ]
    assert df["prompt_tokens"].sum() == 9458
    assert ok["output_tokens"].sum() == 376
    failed = df[~df["success"]]
    assert failed["output_tokens"].tolist() == [0, 0] and failed["prompt_tokens"].tolist() == [1800, 640]
    assert failed["e2e_s"].isna().all() and failed["ttft_s"].isna().all() and failed["itl_s"].isna().all()
    # itl_s = inter_chunk_latency in seconds, per row
    first = df.iloc[0]
    assert first["itl_s"].tolist() == pytest.approx(
        [v / 1000 for v in by_start[0]["metrics"]["inter_chunk_latency"]["value"]], rel=1e-12
    )
    assert first["e2e_s"] == pytest.approx(first["ttft_s"] + first["itl_s"].sum(), rel=1e-12)
    # tpot = aiperf's inter_token_latency per request
    for row, rec in zip(df.itertuples(), by_start):
        if "inter_token_latency" in rec["metrics"]:
            assert row.tpot_s == pytest.approx(rec["metrics"]["inter_token_latency"]["value"] / 1000, rel=1e-9)
    # session 4: five chunk gaps for five output tokens (re-tokenised): no gaps kept, and notes say why
    s4 = [i for i, r in enumerate(by_start) if r["metadata"]["session_num"] == 4][0]
    assert df["itl_s"].iloc[s4] is None and df["output_tokens"].iloc[s4] == 5
    assert any("more gaps than output_sequence_length - 1" in note for note in run.notes)
    assert any("output_token_throughput_per_user" in note for note in run.notes)
    # run settings from the aggregate beside it
    assert (run.tool, run.model, run.backend, run.engine) == ("aiperf_profile_export", "Qwen/Qwen3-8B", "chat", None)
    assert math.isinf(run.request_rate) and run.max_concurrency == 4
    assert run.duration_s == pytest.approx(json.loads(AIPERF_AGG.read_text())["benchmark_duration"]["avg"])
    assert run.summary["request_count"]["avg"] == 10
    assert df["cached_tokens"].isna().all() and df["prefix_ids"].isna().all()


def test_aiperf_without_the_aggregate_says_what_it_could_not_know(tmp_path):
    path = tmp_path / "profile_export.jsonl"
    shutil.copy(AIPERF, path)
    run = read_aiperf_profile_export(path)
    assert math.isnan(run.request_rate) and run.max_concurrency is None and run.model is None
    assert any("no profile_export_aiperf.json" in note for note in run.notes)
    df = run.requests
    lines = [json.loads(line)["metadata"] for line in AIPERF.read_text().splitlines()]
    lines = [m for m in lines if m["benchmark_phase"] == "profiling"]
    span = (max(m["request_end_ns"] for m in lines) - min(m["request_start_ns"] for m in lines)) / 1e9
    assert run.duration_s == pytest.approx(span, rel=1e-12)
    # an explicit aggregate path works from anywhere
    run = read_aiperf_profile_export(path, aggregate_path=AIPERF_AGG)
    assert run.model == "Qwen/Qwen3-8B" and len(run.requests) == len(df)
    # and through read_measured, the keyword reaches the reader
    assert read_measured(path, aggregate_path=AIPERF_AGG).max_concurrency == 4


def test_aiperf_units_are_converted_as_the_record_states_them(tmp_path):
    base = aiperf_record(0, 1_760_000_000_000_000_000, 80_000_000, [10_000_000, 12_500_000], 100, 3)
    other = json.loads(json.dumps(base))
    other["metrics"]["time_to_first_token"] = {"value": 80_000_000, "unit": "ns"}
    other["metrics"]["request_latency"] = {"value": 0.1025, "unit": "sec"}
    other["metrics"]["inter_chunk_latency"] = {"value": [10_000.0, 12_500.0], "unit": "us"}
    a = read_aiperf_profile_export(write_aiperf([base], tmp_path / "a" / "p.jsonl")).requests
    b = read_aiperf_profile_export(write_aiperf([other], tmp_path / "b" / "p.jsonl")).requests
    for col in ("ttft_s", "e2e_s", "tpot_s"):
        assert b[col].iloc[0] == pytest.approx(a[col].iloc[0], rel=1e-12)
    assert b["itl_s"].iloc[0].tolist() == pytest.approx(a["itl_s"].iloc[0].tolist(), rel=1e-12)
    assert a["ttft_s"].iloc[0] == pytest.approx(0.08) and a["e2e_s"].iloc[0] == pytest.approx(0.1025)


def test_aiperf_mean_itl_only_is_noted_not_expanded(tmp_path):
    record = aiperf_record(0, 1_760_000_000_000_000_000, 50_000_000, [40_000_000], 64, 8)
    del record["metrics"]["inter_chunk_latency"]  # one chunk after the first, but 8 tokens: no per-token gaps
    run = read_aiperf_profile_export(write_aiperf([record], tmp_path / "p.jsonl"))
    assert run.requests["itl_s"].iloc[0] is None
    assert run.requests["tpot_s"].iloc[0] == pytest.approx(0.040 / 7)
    assert any("only a mean inter_token_latency" in note for note in run.notes)


# ---------------------------------------------------------------------------------------------------------------
# AIPerf: bad input


def _aiperf_lines() -> list[dict[str, Any]]:
    return [json.loads(line) for line in AIPERF.read_text().splitlines()]


def _first_success(lines: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in lines if r["error"] is None and r["metadata"]["benchmark_phase"] == "profiling")


def _edit_del_latency(r):
    del r["metrics"]["request_latency"]


def _edit_neg_latency(r):
    r["metrics"]["request_latency"]["value"] = -12.5


def _edit_ttft_above_e2e(r):
    r["metrics"]["time_to_first_token"]["value"] = r["metrics"]["request_latency"]["value"] + 1.0


def _edit_nan_ttft(r):
    r["metrics"]["time_to_first_token"]["value"] = float("nan")


def _edit_inf_gap(r):
    r["metrics"]["inter_chunk_latency"]["value"][1] = float("inf")


def _edit_unit(r):
    r["metrics"]["request_latency"]["unit"] = "minutes"


def _edit_token_unit(r):
    r["metrics"]["output_sequence_length"]["unit"] = "ms"


def _edit_del_start(r):
    del r["metadata"]["request_start_ns"]


def _edit_end_before_start(r):
    r["metadata"]["request_end_ns"] = r["metadata"]["request_start_ns"] - 5


def _edit_bare_value(r):
    r["metrics"]["time_to_first_token"] = 41.2


def _edit_fractional_isl(r):
    r["metrics"]["input_sequence_length"]["value"] = 412.5


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (_edit_del_latency, r"not an AIPerf profile_export\.jsonl: missing 'metrics\.request_latency' in record index"),
        (_edit_neg_latency, r"field 'metrics\.request_latency' index \d+: negative time -12\.5; expected >= 0 ms"),
        (_edit_ttft_above_e2e, r"field 'metrics\.time_to_first_token' index \d+: .* exceeds request_latency"),
        (_edit_nan_ttft, r"'metrics\.time_to_first_token' index \d+: expected a non-negative number of ms, got nan"),
        (_edit_inf_gap, r"'metrics\.inter_chunk_latency' index \d+: expected a non-negative number of ms, got inf"),
        (_edit_unit, r"field 'metrics\.request_latency\.unit' index \d+: 'minutes' is not a time unit"),
        (_edit_token_unit, r"field 'metrics\.output_sequence_length\.unit' index \d+: expected 'tokens', got 'ms'"),
        (_edit_del_start, r"missing 'metadata\.request_start_ns' in record index \d+"),
        (_edit_end_before_start, r"field 'metadata\.request_end_ns' index \d+: negative time: end"),
        (_edit_bare_value, r"field 'metrics\.time_to_first_token' index \d+: expected \{value, unit\}, got 41\.2"),
        (_edit_fractional_isl, r"field 'metrics\.input_sequence_length' index \d+: expected a non-negative integer"),
    ],
)
def test_aiperf_bad_values_are_one_line_errors_naming_the_field(tmp_path, edit, expected):
    import re

    lines = _aiperf_lines()
    edit(_first_success(lines))
    path = write_aiperf(lines, tmp_path / "profile_export.jsonl")
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_measured(path)
    message = _one_line(excinfo)
    assert message.startswith(f"{path} line "), message
    assert re.search(expected, message), message


def test_aiperf_bad_aggregate_and_no_profiling_records(tmp_path):
    path = write_aiperf(_aiperf_lines(), tmp_path / "profile_export.jsonl")
    agg = json.loads(AIPERF_AGG.read_text())
    agg["input_config"]["loadgen"]["concurrency"] = 0
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(agg))
    with pytest.raises(MeasuredFormatError, match=r"aiperf\.json: .*'input_config\.loadgen\.concurrency'"):
        read_aiperf_profile_export(path)
    (tmp_path / "profile_export_aiperf.json").write_text("[1, 2]")
    with pytest.raises(MeasuredFormatError, match=r"not an AIPerf profile_export_aiperf\.json: expected one"):
        read_aiperf_profile_export(path)
    warm = [r for r in _aiperf_lines() if r["metadata"]["benchmark_phase"] == "warmup"]
    only_warm = write_aiperf(warm, tmp_path / "w" / "profile_export.jsonl")
    with pytest.raises(MeasuredFormatError, match=r"no profiling-phase records \(skipped \{'warmup': 1\}\)"):
        read_aiperf_profile_export(only_warm)


# ---------------------------------------------------------------------------------------------------------------
# AIPerf: write -> read


def test_aiperf_round_trip_from_a_known_table(tmp_path):
    rng = np.random.default_rng(11)
    n = 9
    outputs = rng.integers(2, 30, size=n)
    gaps = [rng.integers(5_000_000, 25_000_000, size=int(o) - 1) for o in outputs]
    ttft_ns = rng.integers(30_000_000, 300_000_000, size=n)
    starts = np.cumsum(rng.integers(1_000_000, 400_000_000, size=n))
    success = [i != 5 for i in range(n)]
    prompts = rng.integers(50, 3000, size=n)
    table = build_requests(
        prompt_tokens=prompts.tolist(),
        output_tokens=[int(o) if ok else 0 for o, ok in zip(outputs, success)],
        arrival_s=(starts / 1e9).tolist(),
        ttft_s=[t / 1e9 if ok else math.nan for t, ok in zip(ttft_ns, success)],
        e2e_s=[(t + g.sum()) / 1e9 if ok else math.nan for t, g, ok in zip(ttft_ns, gaps, success)],
        itl_s=[g / 1e9 if ok else None for g, ok in zip(gaps, success)],
        success=success,
    )
    t0 = 1_760_000_000_000_000_000
    records = [
        aiperf_record(
            i,
            t0 + int(starts[i]),
            int(ttft_ns[i]),
            [int(g) for g in gaps[i]],
            int(prompts[i]),
            int(outputs[i]),
            error=None if success[i] else {"code": 503, "type": "HTTPError", "message": "Service Unavailable"},
        )
        for i in range(n)
    ]
    path = write_aiperf(records[::-1], tmp_path / "profile_export.jsonl")  # completion order differs from send order
    assert detect_measured_format(path) == "aiperf_profile_export"
    back = read_measured(path).requests
    for col in ("request_id", "prompt_tokens", "output_tokens", "success"):
        assert back[col].tolist() == table[col].tolist(), col
    for col in ("arrival_s", "ttft_s", "e2e_s", "tpot_s"):
        np.testing.assert_allclose(back[col], table[col], rtol=1e-12, atol=1e-15, err_msg=col)
    for got, want in zip(back["itl_s"], table["itl_s"]):
        assert (got is None and want is None) or np.allclose(got, want, rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# MLCommons endpoints: the fixture


def test_mlcommons_fixture_rebuilds_one_row_per_latency_count():
    summary = json.loads(MLCOMMONS.read_text())
    run = read_mlcommons_result_summary(MLCOMMONS)
    df = run.requests
    assert len(df) == 20 == run.num_prompts == sum(summary["latency"]["histogram"]["counts"])
    assert df["success"].all() and df["arrival_s"].isna().all() and df["itl_s"].isna().all()
    assert run.load == "rate" and run.request_rate == 8.0 and run.max_concurrency is None
    assert run.duration_s == pytest.approx(2.613, abs=1e-9)
    assert (run.tool, run.model, run.backend, run.engine) == ("mlcommons_endpoints", None, None, None)
    assert run.notes[0].startswith("rows rebuilt from histograms: 20 rows")
    # rows in ascending latency; every series rebuilt at its bins' midpoints, paired by rank
    e2e = df["e2e_s"].to_numpy()
    assert (np.diff(e2e) >= 0).all()
    np.testing.assert_allclose(e2e, np.array(_rebuilt(summary["latency"])) / 1e9, rtol=1e-12)
    np.testing.assert_allclose(df["ttft_s"], np.array(_rebuilt(summary["ttft"])) / 1e9, rtol=1e-12)
    np.testing.assert_allclose(df["tpot_s"], np.array(_rebuilt(summary["tpot"])) / 1e9, rtol=1e-12)
    assert df["prompt_tokens"].tolist() == [round(v) for v in _rebuilt(summary["input_sequence_lengths"])]
    assert df["output_tokens"].tolist() == [round(v) for v in _rebuilt(summary["output_sequence_lengths"])]
    assert (df["e2e_s"] >= df["ttft_s"]).all()
    # the means, by hand from the fixture's non-empty bins (midpoint of each bin cut to [min, max])
    assert df["e2e_s"].mean() == pytest.approx(1.6285058, abs=1e-6)
    assert df["ttft_s"].mean() == pytest.approx(0.2337518, abs=1e-6)
    assert df["prompt_tokens"].sum() == 20089 and df["output_tokens"].sum() == 2416
    # ... which are near the exact means the file gives (within the bins' widths)
    assert df["e2e_s"].mean() == pytest.approx(summary["latency"]["avg"] / 1e9, rel=0.03)
    assert df["prompt_tokens"].mean() == pytest.approx(summary["input_sequence_lengths"]["avg"], rel=0.03)
    assert run.summary["qps"] == summary["qps"]


@pytest.mark.parametrize("key", ["latency", "ttft", "tpot"])
@pytest.mark.parametrize("p", ["50.0", "90.0", "99.0", "25.0"])
def test_mlcommons_percentiles_of_the_rows_fall_in_the_files_percentile_bin(key, p):
    """Binning keeps rank order, so the rows' percentile (method "lower", as endpoints computes it) is the midpoint
    of the bin that holds the file's exact percentile."""
    summary = json.loads(MLCOMMONS.read_text())
    stat = summary[key]
    column = {"latency": "e2e_s", "ttft": "ttft_s", "tpot": "tpot_s"}[key]
    rows = read_mlcommons_result_summary(MLCOMMONS).requests[column].to_numpy() * 1e9
    exact = stat["percentiles"][p]
    buckets = stat["histogram"]["buckets"]
    j = next(i for i, (lo, hi) in enumerate(buckets) if lo <= exact < hi or (i == len(buckets) - 1 and exact <= hi))
    lo = stat["min"] if j == 0 else max(buckets[j][0], stat["min"])
    hi = min(buckets[j][1], stat["max"])
    assert np.percentile(rows, float(p), method="lower") == pytest.approx((lo + hi) / 2, rel=1e-12)


def test_mlcommons_without_lengths_is_refused(tmp_path):
    summary = json.loads(MLCOMMONS.read_text())
    summary["input_sequence_lengths"] = {}
    summary["output_sequence_lengths"] = {}
    path = tmp_path / "result_summary.json"
    path.write_text(json.dumps(summary))
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_measured(path)
    assert _one_line(excinfo) == (
        f"{path}: an MLCommons endpoints result_summary.json: no token lengths: 'input_sequence_lengths' and "
        "'output_sequence_lengths' missing or empty (written since endpoints #442, with a tokenizer); refusing to "
        "rebuild requests without them"
    )
    del summary["output_sequence_lengths"]
    summary["input_sequence_lengths"] = json.loads(MLCOMMONS.read_text())["input_sequence_lengths"]
    path.write_text(json.dumps(summary))
    with pytest.raises(MeasuredFormatError, match=r"no token lengths: 'output_sequence_lengths' missing or empty"):
        read_measured(path)


def test_mlcommons_series_with_fewer_samples_fill_the_lowest_latency_rows(tmp_path):
    rng = np.random.default_rng(5)
    latency = sorted(rng.integers(200_000_000, 2_000_000_000, size=12).tolist())
    ttft = rng.integers(20_000_000, 150_000_000, size=9).tolist()  # 3 samples never streamed a token
    osl = rng.integers(10, 200, size=10).tolist()  # 2 empty outputs (endpoints skips those)
    isl = rng.integers(100, 900, size=14).tolist()  # issued but not completed: more than rows
    path = write_result_summary(
        tmp_path / "r.json", latency, isl, osl, ttft_ns=ttft, failed=3, load_pattern={"type": "max_throughput"}
    )
    run = read_measured(path)
    df = run.requests
    assert len(df) == 12
    assert df["ttft_s"].iloc[:3].isna().all() and df["ttft_s"].iloc[3:].notna().all()
    assert df["output_tokens"].iloc[:2].tolist() == [0, 0] and (df["output_tokens"].iloc[2:] > 0).all()
    assert df["tpot_s"].isna().all()  # no tpot series in this file
    notes = " | ".join(run.notes)
    assert "'ttft' has 9 samples for 12 rows: the 3 lowest-latency rows get nan" in notes
    assert "'output_sequence_lengths' has 10 samples for 12 rows" in notes
    assert "'input_sequence_lengths' has 14 samples for 12 rows: resampled by quantile" in notes
    assert "3 failed sample(s)" in notes
    assert math.isinf(run.request_rate) and run.max_concurrency is None and run.load == "all_at_once"


# ---------------------------------------------------------------------------------------------------------------
# MLCommons endpoints: bad input


def _ml_edit(summary: dict[str, Any], dotted: str, value: Any) -> None:
    *head, last = dotted.split(".")
    obj = summary
    for part in head:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    if value is _DELETE:
        del obj[last]
    elif isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("latency.histogram", _DELETE, r"not an MLCommons endpoints result_summary\.json: missing 'latency\.hist"),
        ("n_samples_completed", _DELETE, r"missing 'n_samples_completed'"),
        ("latency.min", -5, r"field 'latency\.min': negative time -5; expected >= 0 nanoseconds"),
        ("ttft.max", 9.9e9, r"field 'ttft\.max': 9900000000\.0 ns exceeds 'latency\.max' \d+ ns; expected"),
        ("latency.max", None, r"field 'latency\.max': expected a finite number >= 0 of nanoseconds, got None"),
        ("tpot.histogram.buckets.3.1", float("nan"), r"field 'tpot\.histogram\.buckets\[3\]\[1\]': expected a finite"),
        ("latency.histogram.counts.0", -1, r"field 'latency\.histogram\.counts' index 0: expected a non-negative int"),
        ("latency.histogram.counts.29", 4, r"'latency\.histogram\.counts' index 29: 4 sample\(s\) in bin .* outside"),
        ("input_sequence_lengths.total", 1, r"'input_sequence_lengths\.histogram\.counts': the counts sum to 20 but"),
        ("run_config.load_pattern.target_qps", -2, r"'run_config\.load_pattern\.target_qps': expected a positive"),
    ],
)
def test_mlcommons_bad_values_are_one_line_errors_naming_the_field(tmp_path, dotted, value, expected):
    import re

    summary = json.loads(MLCOMMONS.read_text())
    _ml_edit(summary, dotted, value)
    path = tmp_path / "result_summary.json"
    path.write_text(json.dumps(summary))
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_mlcommons_result_summary(path)
    message = _one_line(excinfo)
    assert message.startswith(f"{path}: "), message
    assert re.search(expected, message), message


# ---------------------------------------------------------------------------------------------------------------
# MLCommons endpoints: write -> read


def test_mlcommons_round_trip_from_a_known_table(tmp_path):
    """Write the histograms of known per-request values as endpoints does, read them back: the same row count and,
    rank by rank, every value within half its bin of the original (the format keeps no more)."""
    rng = np.random.default_rng(23)
    n = 25
    ttft = rng.integers(30_000_000, 400_000_000, size=n)
    osl = rng.integers(2, 400, size=n)
    per_token = rng.uniform(8e6, 30e6, size=n)
    latency = (ttft + (osl - 1) * per_token).astype(np.int64)
    tpot = ((latency - ttft) / (osl - 1)).tolist()
    isl = rng.integers(64, 8000, size=n)
    path = write_result_summary(
        tmp_path / "result_summary.json",
        latency.tolist(),
        isl.tolist(),
        osl.tolist(),
        ttft_ns=ttft.tolist(),
        tpot_ns=tpot,
        load_pattern={"type": "poisson", "target_qps": 3.5, "target_concurrency": None},
    )
    assert detect_measured_format(path) == "mlcommons_endpoints"
    back = read_measured(path)
    assert len(back.requests) == n and back.request_rate == 3.5 and back.max_concurrency is None
    summary = json.loads(path.read_text())
    originals = {
        "latency": ("e2e_s", 1e9, latency),
        "ttft": ("ttft_s", 1e9, ttft),
        "tpot": ("tpot_s", 1e9, np.asarray(tpot)),
        "input_sequence_lengths": ("prompt_tokens", 1, isl),
        "output_sequence_lengths": ("output_tokens", 1, osl),
    }
    for key, (column, scale, values) in originals.items():
        stat = summary[key]
        want = np.sort(np.asarray(values, dtype=float))
        got = back.requests[column].to_numpy(dtype=float) * scale
        edges = np.array([lo for lo, _ in stat["histogram"]["buckets"]] + [stat["histogram"]["buckets"][-1][1]])
        bins = np.clip(np.searchsorted(edges, np.clip(want, edges[0], edges[-1]), side="right") - 1, 0, len(edges) - 2)
        half = (np.minimum(edges[bins + 1], stat["max"]) - np.where(bins == 0, stat["min"], edges[bins])) / 2
        rounding = 0.5 if scale == 1 else 0.0
        assert (np.abs(got - want) <= half + rounding + 1e-9 * want).all(), key
        assert got.min() == pytest.approx(_rebuilt(stat)[0] if scale != 1 else round(_rebuilt(stat)[0]))
    # the exact sums the file gives survive in `summary`
    assert back.summary["latency"]["total"] == int(latency.sum())


# ---------------------------------------------------------------------------------------------------------------
# Detection and registration


@pytest.mark.parametrize(("path", "fmt"), [(AIPERF, "aiperf_profile_export"), (MLCOMMONS, "mlcommons_endpoints")])
def test_detection_reads_content_not_names(path, fmt, tmp_path):
    assert fmt in MEASURED_FORMATS
    assert detect_measured_format(path) == fmt
    renamed = tmp_path / "results.txt"
    renamed.write_bytes(path.read_bytes())
    assert detect_measured_format(renamed) == fmt
    assert read_measured(renamed).tool == fmt


def test_no_other_fixture_is_taken_for_ours():
    mine = {AIPERF: "aiperf_profile_export", MLCOMMONS: "mlcommons_endpoints"}
    checked = 0
    for path in sorted(p for p in FIXTURES.rglob("*") if p.is_file()):
        if path in mine:
            continue
        try:
            fmt = detect_measured_format(path)
        except MeasuredFormatError:
            fmt = None
        assert fmt not in OURS, f"{path.name} detected as {fmt}"
        checked += 1
    assert checked >= 8
    with pytest.raises(MeasuredFormatError, match="not a known measured-run format"):
        detect_measured_format(AIPERF_AGG)  # the aggregate alone is no per-request run


def test_package_exports_both_readers():
    import traces.measured as measured

    assert measured.read_aiperf_profile_export is read_aiperf_profile_export
    assert measured.read_mlcommons_result_summary is read_mlcommons_result_summary
    assert {"read_aiperf_profile_export", "read_mlcommons_result_summary"} <= set(measured.__all__)
