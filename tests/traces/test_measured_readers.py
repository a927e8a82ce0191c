"""traces.measured: readers of real serving-benchmark outputs, format detection, one-line errors, write -> read."""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from traces.measured import (
    MEASURED_COLUMNS,
    MEASURED_FORMATS,
    MeasuredFormatError,
    MeasuredRun,
    build_requests,
    detect_measured_format,
    read_guidellm,
    read_inference_perf,
    read_measured,
    read_sglang_bench_serving,
    read_vllm_bench_serve,
    read_vllm_otel_spans,
    write_measured,
)

FIXTURES = Path(__file__).parent / "fixtures" / "measured"
SGLANG = FIXTURES / "sglang_bench_serving.jsonl"
VLLM = FIXTURES / "vllm_bench_serve.json"
GUIDELLM = FIXTURES / "guidellm_report.json"
INFERENCE_PERF = FIXTURES / "inference_perf_per_request.json"
SPANS = FIXTURES / "vllm_otel_spans.jsonl"


def _check_schema(run: MeasuredRun) -> None:
    df = run.requests
    assert list(df.columns) == MEASURED_COLUMNS
    assert [str(df[c].dtype) for c in MEASURED_COLUMNS] == [
        "int64",
        "int64",
        "int64",
        "float64",
        "float64",
        "float64",
        "object",
        "float64",
        "bool",
        "float64",
        "object",
        "float64",
    ]
    assert df["request_id"].tolist() == list(range(len(df)))
    assert run.num_prompts == len(df)


# ---------------------------------------------------------------------------------------------------------------
# Each fixture reads to the expected table


def test_sglang_reads_the_last_run_by_default_and_says_so():
    run = read_sglang_bench_serving(SGLANG)
    _check_schema(run)
    df = run.requests
    assert (run.tool, run.backend, run.model) == ("sglang_bench_serving", "sglang", None)
    assert math.isinf(run.request_rate) and run.max_concurrency == 4 and run.load == "concurrency"
    assert run.duration_s == 0.874113
    assert run.notes[0].startswith("read run 2 of 2 (line 2")
    assert df["prompt_tokens"].tolist() == [1187, 542, 901, 1024, 766, 615]
    assert df["output_tokens"].tolist() == [12, 5, 16, 9, 11, 0]
    assert df["success"].tolist() == [True] * 5 + [False]
    assert df["arrival_s"].isna().all()
    assert df["ttft_s"].iloc[1] == 0.083310
    gaps = df["itl_s"].iloc[1]
    assert gaps.tolist() == [0.012977, 0.014884, 0.01148, 0.013375]
    # e2e = ttft + sum(itls); tpot = (e2e - ttft) / (output - 1) = sum(itls) / 4
    assert df["e2e_s"].iloc[1] == pytest.approx(0.083310 + 0.052716)
    assert df["tpot_s"].iloc[1] == pytest.approx(0.052716 / 4)
    failed = df.iloc[5]
    assert math.isnan(failed["ttft_s"]) and math.isnan(failed["e2e_s"]) and failed["itl_s"] is None
    assert run.summary["completed"] == 5 and "input_lens" not in run.summary and "mean_tpot_ms" in run.summary


def test_sglang_run_index_picks_an_earlier_line():
    run = read_measured(SGLANG, run_index=0)
    assert run.request_rate == 4.0 and run.max_concurrency is None and run.load == "rate"
    assert run.requests["prompt_tokens"].tolist() == [812, 1020, 633, 958, 704]
    assert run.requests["success"].all()
    with pytest.raises(MeasuredFormatError, match=r"run_index 2 out of range; the file holds 2 run\(s\)$"):
        read_sglang_bench_serving(SGLANG, run_index=2)


def test_vllm_reads_arrivals_latencies_and_failures():
    run = read_vllm_bench_serve(VLLM)
    _check_schema(run)
    df = run.requests
    assert (run.tool, run.backend, run.model) == ("vllm_bench_serve", "vllm", "meta-llama/Llama-3.1-8B-Instruct")
    assert run.request_rate == 2.0 and run.max_concurrency is None and run.load == "trace"
    assert df["prompt_tokens"].tolist() == [1402, 877, 1125, 930, 1311, 688, 1024]
    assert df["output_tokens"].tolist() == [10, 6, 13, 8, 11, 9, 0]
    # arrival = start_times - queue_times, rebased to the first send (84512.337104)
    assert df["arrival_s"].iloc[0] == 0.0
    assert df["arrival_s"].iloc[1] == pytest.approx(84512.635284 - 84512.337104)
    assert df["ttft_s"].iloc[0] == 0.052314
    assert df["e2e_s"].iloc[0] == 0.187146  # the file's `latencies`, not ttft + sum(itls)
    assert df["tpot_s"].iloc[0] == pytest.approx((0.187146 - 0.052314) / 9)
    assert len(df["itl_s"].iloc[2]) == 12
    assert df["success"].tolist() == [True] * 6 + [False]
    assert df["itl_s"].iloc[6] is None and math.isnan(df["tpot_s"].iloc[6])
    assert run.summary["failed"] == 1 and "p99_itl_ms" in run.summary and "ttfts" not in run.summary


def test_guidellm_reads_request_timings_and_strategy():
    run = read_guidellm(GUIDELLM)
    _check_schema(run)
    df = run.requests
    assert (run.tool, run.model, run.backend) == ("guidellm", "Qwen/Qwen3-8B", "openai_http")
    assert run.request_rate == 2.0 and run.max_concurrency == 64 and run.duration_s == 3.31 and run.load == "trace"
    assert df["arrival_s"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert df["prompt_tokens"].tolist() == [256, 512, 384, 300, 640]
    assert df["output_tokens"].tolist() == [128, 96, 64, 120, 0]
    assert df["ttft_s"].iloc[1] == pytest.approx(0.0515, abs=1e-6)
    assert df["e2e_s"].iloc[1] == pytest.approx(1.4210, abs=1e-6)
    assert df["tpot_s"].iloc[1] == pytest.approx((1.4210 - 0.0515) / 95, rel=1e-5)
    assert df["itl_s"].isna().all()
    assert df["success"].tolist() == [True, True, True, True, False]
    assert "time_to_first_token_ms" in run.summary

    sync = read_measured(GUIDELLM, benchmark_index=1)
    assert math.isinf(sync.request_rate) and sync.max_concurrency == 1 and len(sync.requests) == 2


def test_inference_perf_derives_ttft_and_itl_from_token_times():
    run = read_inference_perf(INFERENCE_PERF)
    _check_schema(run)
    df = run.requests
    assert run.tool == "inference_perf" and run.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert math.isnan(run.request_rate) and run.max_concurrency is None and run.load == "trace"
    assert df["arrival_s"].tolist() == pytest.approx([0.0, 0.31, 0.52, 0.95, 1.20])
    assert df["prompt_tokens"].tolist() == [211, 187, 240, 199, 225]
    assert df["output_tokens"].tolist() == [5, 4, 6, 3, 0]
    assert df["ttft_s"].iloc[0] == pytest.approx(0.0512)
    assert df["itl_s"].iloc[0] == pytest.approx([0.0181] * 4)
    assert df["e2e_s"].iloc[0] == pytest.approx(0.0512 + 4 * 0.0181 + 0.0009)
    assert df["success"].tolist() == [True] * 4 + [False]
    assert df["itl_s"].iloc[4] is None
    served = read_inference_perf(INFERENCE_PERF, use_server_usage=True)
    assert served.requests["prompt_tokens"].tolist()[:4] == [218, 194, 247, 206]


def test_vllm_spans_read_every_span_shape_and_skip_other_spans():
    run = read_vllm_otel_spans(SPANS)
    _check_schema(run)
    df = run.requests
    assert run.tool == "vllm_otel_spans" and run.model == "Qwen/Qwen3-8B" and run.load == "trace"
    assert df["prompt_tokens"].tolist() == [1532, 880, 2048, 512, 700]
    assert df["output_tokens"].tolist() == [128, 64, 200, 32, 1]
    assert df["arrival_s"].tolist() == pytest.approx([0.0, 0.25, 0.6, 1.0, 1.4])
    assert df["ttft_s"].iloc[2] == 0.1450 and df["e2e_s"].iloc[2] == 3.1002
    assert df["tpot_s"].iloc[0] == pytest.approx((1.9034 - 0.0912) / 127)
    assert df["itl_s"].isna().all() and math.isnan(df["tpot_s"].iloc[4])
    assert df["success"].tolist() == [True, True, True, True, False]
    assert any("skipped 1 span" in note for note in run.notes)
    assert run.duration_s == pytest.approx(3.7002, abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Detection and dispatch


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        (SGLANG, "sglang_bench_serving"),
        (VLLM, "vllm_bench_serve"),
        (GUIDELLM, "guidellm"),
        (INFERENCE_PERF, "inference_perf"),
        (SPANS, "vllm_otel_spans"),
    ],
)
def test_detection_picks_the_format_from_content_not_the_name(path, fmt, tmp_path):
    assert detect_measured_format(path) == fmt
    renamed = tmp_path / "results.txt"
    renamed.write_bytes(path.read_bytes())
    assert detect_measured_format(renamed) == fmt
    assert read_measured(renamed).tool == fmt
    assert fmt in MEASURED_FORMATS


def test_unknown_content_and_unknown_fmt_are_one_line_errors(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"foo": 1}\n')
    with pytest.raises(MeasuredFormatError, match=r"x\.json: not a known measured-run format \(found \['foo'\]\)"):
        read_measured(path)
    with pytest.raises(MeasuredFormatError, match="unknown measured format 'nope'"):
        read_measured(path, fmt="nope")


# ---------------------------------------------------------------------------------------------------------------
# Broken files: one-line messages naming file, format, field, index


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_broken_sglang_without_output_details():
    path = FIXTURES / "broken_sglang_no_details.jsonl"
    assert detect_measured_format(path) == "sglang_bench_serving"
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_measured(path)
    assert _one_line(excinfo) == (
        f"{path}: not an SGLang bench_serving --output-details line: "
        "missing 'input_lens', 'output_lens', 'ttfts', 'itls' (run with --output-details)"
    )


def test_broken_vllm_lists_of_different_lengths():
    path = FIXTURES / "broken_vllm_lengths.json"
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_measured(path)
    assert _one_line(excinfo) == (
        f"{path}: a vllm bench serve --save-detailed result: field 'ttfts' has 6 entries, expected 7 "
        "(one per request, as 'input_lens')"
    )


def _sglang_line(**overrides) -> str:
    line = json.loads(SGLANG.read_text().splitlines()[1])
    line.update(overrides)
    return json.dumps(line)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"itls": None}, r"field 'itls': expected a list \(one entry per request\), got None$"),
        ({"ttfts": [0.06, -0.2, 0.1, 0.1, 0.1, 0.0]}, r"field 'ttfts' index 1: negative time -0\.2; expected >= 0"),
        ({"input_lens": [1187, 542, float("nan"), 1024, 766, 615]}, r"field 'input_lens' index 2: .* got nan$"),
        ({"output_lens": [12, 5, 16, 9, -1, 0]}, r"field 'output_lens' index 4: expected a non-negative integer"),
        ({"itls": [[0.01, -0.5], [], [], [], [], []]}, r"field 'itls' index 0 item 1: negative time -0\.5"),
        ({"errors": ["", ""]}, r"field 'errors' has 2 entries, expected 6"),
        ({"request_rate": -3}, r"field 'request_rate': expected a positive number"),
    ],
)
def test_bad_values_name_the_field_and_index(tmp_path, overrides, expected):
    path = tmp_path / "run.jsonl"
    path.write_text(_sglang_line(**overrides) + "\n")
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_sglang_bench_serving(path)
    message = _one_line(excinfo)
    assert message.startswith(f"{path}: an SGLang bench_serving --output-details line: ")
    assert re.search(expected, message), message


def test_wrong_reader_for_a_file_says_what_is_missing():
    with pytest.raises(MeasuredFormatError, match=r"not a guidellm benchmarks report: missing 'benchmarks'"):
        read_guidellm(VLLM)
    with pytest.raises(MeasuredFormatError, match=r"not an inference-perf .*: expected one JSON list"):
        read_inference_perf(GUIDELLM)
    with pytest.raises(MeasuredFormatError, match=r"not a JSONL of vLLM llm_request .*: missing 'gen_ai.latency.e2e'"):
        read_vllm_otel_spans(INFERENCE_PERF)


def test_guidellm_negative_latency_and_inference_perf_end_before_start(tmp_path):
    report = json.loads(GUIDELLM.read_text())
    report["benchmarks"][0]["requests"]["successful"][2]["info"]["timings"]["request_end"] -= 5.0
    path = tmp_path / "g.json"
    path.write_text(json.dumps(report))
    with pytest.raises(MeasuredFormatError, match=r"requests\.successful\.request_end' index 2: negative time"):
        read_guidellm(path)
    items = json.loads(INFERENCE_PERF.read_text())
    items[3]["end_time"] = items[3]["start_time"] - 1.0
    path = tmp_path / "p.json"
    path.write_text(json.dumps(items))
    with pytest.raises(MeasuredFormatError, match=r"field 'end_time' index 3: negative time"):
        read_inference_perf(path)


# ---------------------------------------------------------------------------------------------------------------
# Load classification and write -> read round trips


def _simulated_run(with_arrivals: bool) -> MeasuredRun:
    rng = np.random.default_rng(3)
    n = 12
    outputs = rng.integers(1, 40, size=n)
    gaps = [rng.uniform(0.008, 0.02, size=max(int(o) - 1, 0)) for o in outputs]
    ttft = rng.uniform(0.03, 0.3, size=n)
    success = [i != 7 for i in range(n)]
    requests = build_requests(
        prompt_tokens=rng.integers(100, 4000, size=n).tolist(),
        output_tokens=outputs.tolist(),
        arrival_s=np.cumsum(rng.exponential(0.25, size=n)).tolist() if with_arrivals else None,
        ttft_s=[t if ok else math.nan for t, ok in zip(ttft, success)],
        e2e_s=[t + g.sum() if ok else math.nan for t, g, ok in zip(ttft, gaps, success)],
        itl_s=[g if ok else None for g, ok in zip(gaps, success)],
        success=success,
    )
    return MeasuredRun(
        requests=requests,
        tool="pulseinfer_sim",
        request_rate=4.0,
        max_concurrency=None,
        duration_s=5.25,
        model="Qwen/Qwen3-14B",
        backend="pulseinfer",
        num_prompts=n,
        summary={},
        source_path="<simulated>",
    )


@pytest.mark.parametrize("fmt", ["sglang_bench_serving", "vllm_bench_serve"])
def test_write_then_read_returns_identical_lengths_ttfts_and_itls(tmp_path, fmt):
    run = _simulated_run(with_arrivals=True)
    path = write_measured(run, tmp_path / "out.json", fmt)
    assert detect_measured_format(path) == fmt
    back = read_measured(path)
    a, b = run.requests, back.requests
    ok = a["success"].to_numpy()
    assert back.tool == fmt and back.request_rate == 4.0 and back.duration_s == 5.25
    assert b["prompt_tokens"].tolist() == a["prompt_tokens"].tolist()
    assert b["output_tokens"][ok].tolist() == a["output_tokens"][ok].tolist()
    assert b["success"].tolist() == a["success"].tolist()
    pd.testing.assert_series_equal(b["ttft_s"], a["ttft_s"])
    for got, want in zip(b["itl_s"], a["itl_s"]):
        assert (got is None and want is None) or got.tolist() == want.tolist()
    np.testing.assert_allclose(b["e2e_s"], a["e2e_s"], rtol=1e-12)
    assert back.summary["completed"] == 11
    assert back.summary["mean_ttft_ms"] == pytest.approx(np.nanmean(a["ttft_s"]) * 1000)
    if fmt == "vllm_bench_serve":
        pd.testing.assert_series_equal(b["arrival_s"], a["arrival_s"])
        assert back.model == "Qwen/Qwen3-14B" and back.load == "trace"
    else:
        assert b["arrival_s"].isna().all() and back.load == "rate"


def test_load_classification_and_write_rejects_other_formats(tmp_path):
    run = _simulated_run(with_arrivals=False)
    assert run.load == "rate"
    run.request_rate = math.inf
    assert run.load == "all_at_once"
    run.max_concurrency = 16
    assert run.load == "concurrency"
    path = write_measured(run, tmp_path / "v.json", "vllm_bench_serve")
    back = read_measured(path)
    assert math.isinf(back.request_rate) and back.max_concurrency == 16 and back.load == "concurrency"
    assert "start_times" not in json.loads(path.read_text())
    with pytest.raises(ValueError, match="fmt must be one of"):
        write_measured(run, tmp_path / "g.json", "guidellm")


def test_package_is_a_leaf():
    allowed = {"numpy", "pandas", "traces"} | set(sys.stdlib_module_names)
    package = Path(__file__).resolve().parents[2] / "traces" / "measured"
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] in allowed, f"{module.name} imports {name}"
                assert not name.startswith("traces.") or name.startswith("traces.measured"), f"{module.name}: {name}"


def test_a_near_miss_is_read_as_its_tool_and_names_the_field(tmp_path):
    """A guidellm report with no benchmarks and an inference-perf file whose first request lacks `info` are told
    apart by their shape, so the reader names the field instead of "unknown format"."""
    import json

    from traces.measured import read_measured

    guide = json.loads((FIXTURES / "guidellm_report.json").read_text())
    guide["benchmarks"] = []
    (tmp_path / "g.json").write_text(json.dumps(guide))
    with pytest.raises(ValueError, match="'benchmarks': expected a non-empty list"):
        read_measured(tmp_path / "g.json")
    perf = json.loads((FIXTURES / "inference_perf_per_request.json").read_text())
    del perf[0]["info"]
    (tmp_path / "ip.json").write_text(json.dumps(perf))
    with pytest.raises(ValueError, match="missing 'info' at index 0"):
        read_measured(tmp_path / "ip.json")
