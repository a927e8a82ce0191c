"""Readers for real serving-benchmark outputs, so a simulated run can be compared with a measured one.

Every reader returns a `MeasuredRun` (`traces.measured.schema`): a per-request table (`request_id`,
`prompt_tokens`, `output_tokens`, `arrival_s`, `ttft_s`, `e2e_s`, `itl_s`, `tpot_s`, `success`) plus the run's
settings (`tool`, `request_rate`, `max_concurrency`, `duration_s`, `model`, `backend`, `num_prompts`, `summary`,
`source_path`, `notes`) and the derived `load`.

Formats (`fmt`), each a module with its reader:

- `sglang_bench_serving`: `python -m sglang.bench_serving --output-file F --output-details` (JSONL, one line per
  run) -> `read_sglang_bench_serving(path, run_index=-1)` (`sglang.py`);
- `vllm_bench_serve`: `vllm bench serve --save-result --save-detailed` (JSON) ->
  `read_vllm_bench_serve(path, run_index=-1)` (`vllm_bench.py`);
- `guidellm`: guidellm's benchmarks report JSON -> `read_guidellm(path, benchmark_index=0)` (`guidellm.py`);
- `inference_perf`: inference-perf's `per_request_lifecycle_metrics.json` -> `read_inference_perf(path)`
  (`inference_perf.py`);
- `vllm_otel_spans`: vLLM "llm_request" OpenTelemetry spans, one JSON per line -> `read_vllm_otel_spans(path)`
  (`vllm_spans.py`);
- `vllm_requests_jsonl`: per-request vLLM server timestamps (`requests.jsonl`, with the run's resolved engine config
  in `meta.json` beside it; LLMServingSim's `bench run`) -> `read_vllm_requests(path)` (`vllm_requests.py`);
- `aiperf_profile_export`: NVIDIA AIPerf's per-request `profile_export.jsonl` (run settings from the
  `profile_export_aiperf.json` beside it) -> `read_aiperf_profile_export(path, aggregate_path=None)` (`aiperf.py`);
- `mlcommons_endpoints`: the MLCommons endpoints client's `result_summary.json`, histograms only: the rows are
  rebuilt from them (no send times, TTFT and lengths paired by rank) -> `read_mlcommons_result_summary(path)`
  (`mlcommons.py`).

Not a per-request run: per-iteration `ForwardPassMetrics` (SGLang `--forward-pass-metrics-port`, vLLM through NVIDIA
Dynamo) -> `read_forward_pass_metrics(path, engine=None)`, an `IterationRun` (`forward_pass.py`); tell such a file
apart with `detect_iteration_file(path)`.

`read_measured(path, fmt="auto", **kw)` dispatches (`detect_measured_format` looks at the content's keys, never
the file name); `write_measured(run, path, fmt)` writes formats `sglang_bench_serving` and `vllm_bench_serve`.
Errors are `MeasuredFormatError` (a `ValueError`), one line naming file, format, field and expectation.

A leaf package: standard library, numpy and pandas only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from traces.measured import (
    aiperf,
    forward_pass,
    guidellm,
    inference_perf,
    mlcommons,
    sglang,
    vllm_bench,
    vllm_requests,
    vllm_spans,
)
from traces.measured.aiperf import read_aiperf_profile_export
from traces.measured.forward_pass import IterationRun, read_forward_pass_metrics
from traces.measured.guidellm import read_guidellm
from traces.measured.inference_perf import read_inference_perf
from traces.measured.mlcommons import read_mlcommons_result_summary
from traces.measured.parse import parse_json_documents, read_text
from traces.measured.schema import LOADS, MEASURED_COLUMNS, MeasuredFormatError, MeasuredRun, build_requests
from traces.measured.sglang import read_sglang_bench_serving, write_sglang_bench_serving
from traces.measured.vllm_bench import read_vllm_bench_serve, write_vllm_bench_serve
from traces.measured.vllm_requests import read_vllm_requests
from traces.measured.vllm_spans import read_vllm_otel_spans

MEASURED_FORMATS: tuple[str, ...] = (
    sglang.TOOL,
    vllm_bench.TOOL,
    guidellm.TOOL,
    inference_perf.TOOL,
    vllm_spans.TOOL,
    vllm_requests.TOOL,
    aiperf.TOOL,
    mlcommons.TOOL,
)
WRITABLE_FORMATS: tuple[str, ...] = (sglang.TOOL, vllm_bench.TOOL)

_READERS = {
    sglang.TOOL: read_sglang_bench_serving,
    vllm_bench.TOOL: read_vllm_bench_serve,
    guidellm.TOOL: read_guidellm,
    inference_perf.TOOL: read_inference_perf,
    vllm_spans.TOOL: read_vllm_otel_spans,
    vllm_requests.TOOL: read_vllm_requests,
    aiperf.TOOL: read_aiperf_profile_export,
    mlcommons.TOOL: read_mlcommons_result_summary,
}


def detect_measured_format(path: str | Path) -> str:
    """Name the format of a measured-run file from its content (keys of its first JSON document or line).

    Rules, in order: a list of objects with `start_time`/`end_time`/`info` -> "inference_perf"; an object with a
    `benchmarks` list -> "guidellm"; a bench result object (`input_lens`, or `duration` and `completed`) with an
    SGLang-only key (`total_output_tokens_retokenized`, `mean_e2e_latency_ms`; or `input_throughput`, `dataset_name`
    without any of vLLM's `model_id`, `tokenizer_id`, `best_of`, `mean_e2el_ms`) -> "sglang_bench_serving"; with a
    vLLM-only key (`model_id`, `endpoint_type`, `failed`, `burstiness`, `mean_e2el_ms`, `max_concurrent_requests`)
    -> "vllm_bench_serve"; a span with `gen_ai.*`
    attributes or an OTLP `resourceSpans` object -> "vllm_otel_spans"; a record with `input_toks`, `output_toks` and
    vLLM's engine timestamps (`queued_ts`, `scheduled_ts`, `first_token_ts`, `last_token_ts`), or a folder holding
    a `requests.jsonl` -> "vllm_requests_jsonl"; a record with `metadata` and `metrics` (objects) ->
    "aiperf_profile_export"; an object with `n_samples_issued`, `n_samples_completed` and `latency` ->
    "mlcommons_endpoints".

    Raises:
        MeasuredFormatError: unreadable or non-JSON file, or content matching no rule (the message lists the
            keys found and the formats known).
    """
    desc = "a measured-run file"
    source = str(path)
    if Path(path).is_dir() and (Path(path) / vllm_requests.REQUESTS_FILE).is_file():
        return vllm_requests.TOOL
    documents = parse_json_documents(read_text(path, desc), source, desc, [])  # the reader notes a cut-off last line
    first = documents[0][1]
    for module in (inference_perf, guidellm, sglang, vllm_bench, vllm_spans, vllm_requests, aiperf, mlcommons):
        if module.looks_like(first):  # in this order: the rules above
            return module.TOOL
    # near misses: the shape of one tool with a field missing or empty -> that tool's reader names the field
    if isinstance(first, dict) and isinstance(first.get("benchmarks"), list):
        return guidellm.TOOL
    if isinstance(first, list) and first and isinstance(first[0], dict) and {"start_time", "end_time"} <= set(first[0]):
        return inference_perf.TOOL
    if isinstance(first, dict) and "input_lens" in first:
        raise MeasuredFormatError(
            f"{source}: cannot tell SGLang bench_serving from vllm bench serve output (neither tool's marker keys "
            f"present); pass fmt='{sglang.TOOL}' or fmt='{vllm_bench.TOOL}'"
        )
    keys = sorted(first)[:12] if isinstance(first, dict) else type(first).__name__
    raise MeasuredFormatError(
        f"{source}: not a known measured-run format (found {keys}); expected one of {list(MEASURED_FORMATS)}"
    )


def detect_iteration_file(path: str | Path) -> bool:
    """Whether ``path`` holds per-iteration ForwardPassMetrics records (read with :func:`read_forward_pass_metrics`)
    rather than a per-request run (:func:`read_measured`): judged by its first record's content, in any shape
    ``forward_pass.py`` reads, never by the name.

    Raises:
        MeasuredFormatError: the file cannot be read (a file that is not JSON is not an iteration file: False).
    """
    if Path(path).is_dir():
        return False
    return forward_pass.looks_like_text(read_text(path, forward_pass.FMT_DESC))


def read_measured(path: str | Path, fmt: str = "auto", **kwargs: Any) -> MeasuredRun:
    """Read a serving-benchmark output into a MeasuredRun.

    Args:
        path: the file.
        fmt: one of `MEASURED_FORMATS`, or "auto" (`detect_measured_format`).
        **kwargs: passed to the reader (`run_index` for sglang_bench_serving / vllm_bench_serve,
            `benchmark_index` for guidellm, `use_server_usage` for inference_perf).

    Raises:
        MeasuredFormatError: see the readers; also an unknown `fmt`.
        TypeError: a keyword the chosen reader does not take.
    """
    name = detect_measured_format(path) if fmt == "auto" else fmt
    if name not in _READERS:
        raise MeasuredFormatError(
            f"{path}: unknown measured format {fmt!r}; expected 'auto' or one of {list(MEASURED_FORMATS)}"
        )
    try:
        run = _READERS[name](path, **kwargs)
    except OverflowError as exc:  # a sum of gaps past float64 (math.fsum raises where the plain sum gives inf)
        detail = f"a sum of its times overflows ({exc}); expected finite seconds"
        raise MeasuredFormatError(f"{path}: {name}: {detail}") from None
    _check_gap_counts(run, path, name)
    check_physics(run, path, name)
    return run


RUN_KEYWORDS = {sglang.TOOL: "run_index", vllm_bench.TOOL: "run_index", guidellm.TOOL: "benchmark_index"}


def count_runs(path: str | Path, fmt: str = "auto") -> int:
    """How many runs a file holds: lines of an SGLang bench_serving or ``vllm bench serve`` results file (one per
    run appended), benchmarks of a guidellm report (one per rate of a sweep); 1 for the other formats.

    Raises:
        MeasuredFormatError: as :func:`detect_measured_format`.
    """
    name = detect_measured_format(path) if fmt == "auto" else fmt
    if name not in RUN_KEYWORDS:
        return 1
    desc = "a measured-run file"
    documents = parse_json_documents(read_text(path, desc), str(path), desc, [])  # a cut-off last line is no run
    if name == guidellm.TOOL:
        benchmarks = documents[0][1].get("benchmarks") if isinstance(documents[0][1], dict) else None
        return len(benchmarks) if isinstance(benchmarks, list) else 1
    return len(documents)


def read_measured_runs(path: str | Path, fmt: str = "auto", run: int | str | None = None) -> list[MeasuredRun]:
    """The runs of a file to compare: ``run`` None, the reader's default (the last run appended; guidellm's first
    benchmark); an int, that run (0 the first, -1 the last); ``"all"``, every run in file order. A run read out of
    several has ``#N`` (0-based) after its ``source_path``.

    Raises:
        MeasuredFormatError: a bad file or run (out of range, naming how many the file holds), or ``run`` not an
            int, None or "all".
    """
    name = detect_measured_format(path) if fmt == "auto" else fmt
    if run is None:
        return [read_measured(path, name)]
    count = count_runs(path, name)
    if run == "all":
        indices = list(range(count))
    elif isinstance(run, int) and not isinstance(run, bool) and -count <= run < count:
        indices = [run % count]
    elif isinstance(run, int) and not isinstance(run, bool):
        raise MeasuredFormatError(f"{path}: run {run} out of range; the file holds {count} run(s) (0 to {count - 1})")
    else:
        raise MeasuredFormatError(f"{path}: run {run!r}: expected a run number or 'all'")
    if name not in RUN_KEYWORDS:
        return [read_measured(path, name)]
    runs = []
    for index in indices:
        one = read_measured(path, name, **{RUN_KEYWORDS[name]: index})
        if count > 1:
            one.source_path = f"{one.source_path}#{index}"
        runs.append(one)
    return runs


MAX_REQUEST_S = 7 * 86400.0  # one request lasting more than a week is not a measurement


def check_physics(run: MeasuredRun, path: str | Path, name: str) -> None:
    """What no server can have measured, for every completed request: a TTFT below 0, an E2E below its TTFT (a
    negative TPOT), an E2E past a week, a non-finite time, a negative gap, gaps summing past E2E − TTFT.

    Raises:
        MeasuredFormatError: one line naming the request's index, the field and both values.
    """
    req = run.requests
    ok = req["success"].to_numpy(bool)
    ttft, e2e = req["ttft_s"].to_numpy(float), req["e2e_s"].to_numpy(float)
    for label, bad in (
        ("ttft_s: expected a finite time >= 0", ok & ~(np.isfinite(ttft) | np.isnan(ttft)) | ok & (ttft < 0)),
        ("e2e_s: expected a finite time >= 0", ok & (np.isinf(e2e) | (e2e < 0))),
        ("e2e_s: shorter than its ttft_s (a negative TPOT)", ok & (e2e < ttft - 1e-9)),
        (f"e2e_s: longer than {MAX_REQUEST_S:.0f} s, not one request of a benchmark", ok & (e2e > MAX_REQUEST_S)),
    ):
        if bad.any():
            i = int(np.argmax(bad))
            got = f"got ttft {float(ttft[i])!r} s, e2e {float(e2e[i])!r} s"
            raise MeasuredFormatError(f"{path}: {name}: request {i}: {label}, {got}")
    for i, gaps in enumerate(req["itl_s"]):
        if gaps is None or not len(gaps):
            continue
        if not (np.isfinite(gaps).all() and (gaps >= 0).all()):
            raise MeasuredFormatError(f"{path}: {name}: request {i}: itl_s: expected finite gaps >= 0")
        stream_s = e2e[i] - ttft[i]  # the gaps come after the first token and before the end
        if ok[i] and np.isfinite(stream_s) and float(np.sum(gaps)) > 1.05 * stream_s + 0.05:
            raise MeasuredFormatError(
                f"{path}: {name}: request {i}: itl_s: its gaps sum to {float(np.sum(gaps)):.6g} s, more than its "
                f"e2e_s - ttft_s {float(stream_s):.6g} s; expected the token gaps inside the request"
            )


def _check_gap_counts(run: MeasuredRun, path: str | Path, name: str) -> None:
    """A request cannot have more inter-token gaps than output tokens − 1 (a stream may merge tokens, never split).

    Raises:
        MeasuredFormatError: naming the request's index and both counts.
    """
    req = run.requests
    for i, (gaps, out) in enumerate(zip(req["itl_s"], req["output_tokens"], strict=True)):
        if gaps is not None and len(gaps) > max(int(out) - 1, 0):
            raise MeasuredFormatError(
                f"{path}: {name}: request {i}: {len(gaps)} inter-token gaps for {int(out)} output tokens; expected at "
                "most output - 1 (the output length and the token times disagree)"
            )


def write_measured(run: MeasuredRun, path: str | Path, fmt: str) -> Path:
    """Write `run` in a real tool's format ("sglang_bench_serving" or "vllm_bench_serve") so it reads back.

    Returns:
        The path written.

    Raises:
        ValueError: `fmt` is not one of `WRITABLE_FORMATS`, or `run.requests` lacks a column.
    """
    if fmt == sglang.TOOL:
        return write_sglang_bench_serving(run, path)
    if fmt == vllm_bench.TOOL:
        return write_vllm_bench_serve(run, path)
    raise ValueError(f"write_measured: fmt must be one of {list(WRITABLE_FORMATS)}, got {fmt!r}")


__all__ = [
    "IterationRun",
    "LOADS",
    "MEASURED_COLUMNS",
    "MEASURED_FORMATS",
    "WRITABLE_FORMATS",
    "MeasuredFormatError",
    "MeasuredRun",
    "build_requests",
    "count_runs",
    "detect_iteration_file",
    "detect_measured_format",
    "read_aiperf_profile_export",
    "read_guidellm",
    "read_forward_pass_metrics",
    "read_inference_perf",
    "read_measured",
    "read_measured_runs",
    "read_mlcommons_result_summary",
    "read_sglang_bench_serving",
    "read_vllm_bench_serve",
    "read_vllm_otel_spans",
    "read_vllm_requests",
    "write_measured",
    "write_sglang_bench_serving",
    "write_vllm_bench_serve",
]
