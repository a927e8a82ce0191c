"""Reader for guidellm's benchmarks report JSON (`guidellm benchmark ... --output-path benchmarks.json`).

Sources read (vllm-project/guidellm):

- current schema (report `metadata.version` 2, guidellm >= 0.4), HEAD ee7a77457ba668b4b5ccb40f110518829893b36a:
  `src/guidellm/benchmark/schemas/report.py` (`GenerativeBenchmarksReport`: `metadata`, `config`, `benchmarks`),
  `src/guidellm/benchmark/schemas/benchmark.py` (`GenerativeBenchmark`: `config`, `scheduler_state`,
  `scheduler_metrics`, `metrics`, `requests`, computed `start_time`/`end_time`/`duration`),
  `src/guidellm/schemas/request_stats.py` (`GenerativeRequestStats`: `request_id`, `info`, `input_metrics`,
  `output_metrics`, computed `prompt_tokens`, `output_tokens`, `request_start_time`, `request_end_time`,
  `request_latency`, `time_to_first_token_ms`, ...), `src/guidellm/schemas/info.py` (`RequestTimings`:
  `request_start`, `first_token_iteration`, `last_token_iteration`, `token_iterations`, `request_end`, ... as Unix
  time stamps), `src/guidellm/scheduler/strategies.py` (strategy `type_` synchronous / concurrent (`streams`) /
  throughput (`max_concurrency`) / constant, poisson (`rate`, `max_concurrency`) / trace);
- legacy schema (guidellm 0.1-0.3), tag v0.3.1 = 121dcdc454e57c98ae26f86db2ed984f3c6d14a7:
  `src/guidellm/benchmark/benchmark.py` (`GenerativeTextResponseStats`: `prompt_tokens`, `output_tokens`,
  `start_time`, `end_time`, `first_token_time`, `last_token_time`, computed `request_latency`, ...;
  `GenerativeBenchmark`: `args.strategy`, `worker.backend_type`/`backend_model`, `start_time`, `end_time`,
  `duration`, `metrics`, `requests`).

Both dump `benchmarks[i].requests` as `{"successful": [...], "incomplete": [...], "errored": [...]}`. Read (per
request, either schema): `prompt_tokens`, `output_tokens`, the prompt text where the stats keep it (legacy `prompt`:
shared prefixes for the replay's prefix cache); start = `info.timings.request_start` (legacy
`start_time`), first token = `info.timings.first_token_iteration` (legacy `first_token_time`), end =
`info.timings.request_end` (legacy `end_time`). Derived: ttft_s = first token - start, e2e_s = end - start,
tpot_s from them, arrival_s = start - earliest start; `success` = the request is in `successful`. guidellm keeps
no per-token times, so itl_s is None. Rows are ordered by start time. A failed request without token counts gets
0. Run level: the strategy above -> request_rate (inf for synchronous/concurrent/throughput, NaN for trace) and
max_concurrency (1 for synchronous, `streams` for concurrent); `duration`; `summary` = the benchmark's `metrics`
as the file gives them. guidellm may sample requests (`request_samples`, `--output-sampling`): `num_prompts` is
then the number of rows, not of requests sent, and `notes` says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from traces.measured.parse import (
    as_count,
    as_timestamp,
    fail,
    parse_json_documents,
    read_text,
    require,
    show,
    source_name,
)
from traces.measured.schema import MeasuredFormatError, MeasuredRun, build_requests

TOOL = "guidellm"
FMT_DESC = "a guidellm benchmarks report"
HINT = "expected guidellm's report JSON with per-request stats"
STATUSES = ("successful", "incomplete", "errored")


def read_guidellm(path: str | Path, benchmark_index: int = 0) -> MeasuredRun:
    """Read one benchmark of a guidellm report into a MeasuredRun.

    Args:
        path: the report `.json`.
        benchmark_index: which entry of `benchmarks` (one per strategy/rate of a sweep), Python-style; default 0.

    Raises:
        MeasuredFormatError: unreadable file or JSON, no `benchmarks`, index out of range, a request without the
            timing or token fields, negative latencies.
    """
    source = source_name(path)
    documents = parse_json_documents(read_text(path, FMT_DESC), source, FMT_DESC)
    report = documents[0][1]
    if len(documents) != 1 or not isinstance(report, dict):
        raise MeasuredFormatError(f"{source}: not {FMT_DESC}: expected one JSON object with 'benchmarks'")
    benchmarks = require(report, "benchmarks", source, FMT_DESC, HINT)
    if not isinstance(benchmarks, list) or not benchmarks:
        raise fail(source, FMT_DESC, f"field 'benchmarks': expected a non-empty list, got {show(benchmarks)}")
    if not -len(benchmarks) <= benchmark_index < len(benchmarks):
        raise MeasuredFormatError(
            f"{source}: {FMT_DESC}: benchmark_index {benchmark_index} out of range; "
            f"the report holds {len(benchmarks)} benchmark(s)"
        )
    bench = benchmarks[benchmark_index]
    b_name = f"benchmarks[{benchmark_index}]"
    if not isinstance(bench, dict):
        raise fail(source, FMT_DESC, f"field '{b_name}': expected an object, got {show(bench)}")
    groups = require(bench, "requests", source, FMT_DESC, f"{b_name} has no per-request stats")
    if not isinstance(groups, dict):
        raise fail(source, FMT_DESC, f"field '{b_name}.requests': expected an object, got {show(groups)}")
    rows = []
    for status in STATUSES:
        items = groups.get(status) or []
        if not isinstance(items, list):
            raise fail(source, FMT_DESC, f"field '{b_name}.requests.{status}': expected a list, got {show(items)}")
        for i, item in enumerate(items):
            rows.append(_parse_request(item, f"{b_name}.requests.{status}", i, status == "successful", source))
    if not rows:
        raise fail(source, FMT_DESC, f"field '{b_name}.requests': no requests recorded")
    rows.sort(key=lambda r: r["start"])
    requests = build_requests(
        [r["prompt"] for r in rows],
        [r["output"] for r in rows],
        [r["start"] for r in rows],
        [r["ttft"] for r in rows],
        [r["e2e"] for r in rows],
        [None] * len(rows),
        [r["success"] for r in rows],
        prompt_texts=[r["text"] for r in rows] if any(r["text"] is not None for r in rows) else None,
    )
    strategy = (bench.get("config") or {}).get("strategy") or (bench.get("args") or {}).get("strategy") or {}
    rate, concurrency, kind = _strategy(strategy)
    notes = [f"read benchmark {benchmark_index % len(benchmarks)} of {len(benchmarks)} (strategy {kind})"]
    notes.append("itl_s: guidellm records no per-token times (None); ttft/e2e from request time stamps")
    samples = bench.get("request_samples")
    if isinstance(samples, dict) and any(samples.get(s) is not None for s in STATUSES):
        notes.append(f"guidellm sampled the requests ({samples}); totals: {bench.get('request_totals')}")
    backend, model = _backend_and_model(bench, report)
    duration = bench.get("duration")
    if not isinstance(duration, (int, float)) or not math.isfinite(duration):
        duration = max(r["start"] + (r["e2e"] if math.isfinite(r["e2e"]) else 0.0) for r in rows) - rows[0]["start"]
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=rate,
        max_concurrency=concurrency,
        duration_s=float(duration),
        model=model,
        backend=backend,
        num_prompts=len(rows),
        summary=dict(bench.get("metrics") or {}),
        source_path=source,
        notes=notes,
    )


def _parse_request(item: Any, name: str, index: int, success: bool, source: str) -> dict[str, Any]:
    """Token counts and times of one request stats object (current or legacy schema)."""
    if not isinstance(item, dict):
        raise fail(source, FMT_DESC, f"field '{name}' index {index}: expected an object, got {show(item)}")
    timings = (item.get("info") or {}).get("timings") if isinstance(item.get("info"), dict) else None
    if isinstance(timings, dict):  # guidellm >= 0.4
        start_key, first_key, end_key = "request_start", "first_token_iteration", "request_end"
        start, first, end = timings.get(start_key), timings.get(first_key), timings.get(end_key)
        if start is None:
            start_key, start = "request_start_time", item.get("request_start_time")
        if end is None:
            end_key, end = "request_end_time", item.get("request_end_time")
    else:  # guidellm 0.1-0.3
        start_key, first_key, end_key = "start_time", "first_token_time", "end_time"
        start, first, end = item.get(start_key), item.get(first_key), item.get(end_key)
    if start is None:
        raise MeasuredFormatError(
            f"{source}: not {FMT_DESC}: missing '{start_key}' in '{name}' index {index} "
            "(expected info.timings.request_start or legacy start_time)"
        )
    start = as_timestamp(start, f"{name}.{start_key}", index, source, FMT_DESC)
    prompt, output = item.get("prompt_tokens"), item.get("output_tokens")
    if success or prompt is not None:
        prompt = as_count(prompt, f"{name}.prompt_tokens", index, source, FMT_DESC)
    if success or output is not None:
        output = as_count(output, f"{name}.output_tokens", index, source, FMT_DESC)
    ttft = e2e = math.nan
    if first is not None:
        ttft = _latency(first, start, f"{name}.{first_key}", index, source)
    if end is not None:
        e2e = _latency(end, start, f"{name}.{end_key}", index, source)
    if success and (math.isnan(ttft) or math.isnan(e2e)):
        missing = first_key if math.isnan(ttft) else end_key
        raise MeasuredFormatError(f"{source}: not {FMT_DESC}: missing '{missing}' in '{name}' index {index}")
    return {
        "start": start,
        "prompt": prompt or 0,
        "output": output or 0,
        "ttft": ttft,
        "e2e": e2e,
        "success": success,
        "text": item["prompt"] if isinstance(item.get("prompt"), str) else None,  # legacy stats keep the prompt
    }


def _latency(stamp: Any, start: float, name: str, index: int, source: str) -> float:
    """`stamp - start` in seconds, which must be >= 0."""
    value = as_timestamp(stamp, name, index, source, FMT_DESC) - start
    if value < 0:
        raise fail(
            source, FMT_DESC, f"field '{name}' index {index}: negative time {value:.6g} s after the request start"
        )
    return value


def _strategy(strategy: dict[str, Any]) -> tuple[float, int | None, str]:
    """(request_rate, max_concurrency, type) from a guidellm strategy object."""
    kind = str(strategy.get("type_", "unknown"))
    concurrency = strategy.get("max_concurrency")
    concurrency = concurrency if isinstance(concurrency, int) and not isinstance(concurrency, bool) else None
    if kind == "synchronous":
        return math.inf, 1, kind
    if kind == "concurrent":
        streams = strategy.get("streams")
        return math.inf, streams if isinstance(streams, int) else concurrency, kind
    if kind in ("constant", "poisson"):
        rate = strategy.get("rate")
        return (float(rate) if isinstance(rate, (int, float)) else math.nan), concurrency, kind
    if kind == "throughput":
        return math.inf, concurrency, kind
    return math.nan, concurrency, kind


def _backend_and_model(bench: dict[str, Any], report: dict[str, Any]) -> tuple[str | None, str | None]:
    """Best-effort backend and model names (legacy `worker`, else the benchmark's / report's backend config)."""
    worker = bench.get("worker") if isinstance(bench.get("worker"), dict) else {}
    config_backend = (bench.get("config") or {}).get("backend") if isinstance(bench.get("config"), dict) else None
    report_backend = (report.get("config") or {}).get("backend") if isinstance(report.get("config"), dict) else None
    candidates = [c for c in (config_backend, report_backend) if isinstance(c, dict)]
    backend = worker.get("backend_type") or next(
        (c.get(k) for c in candidates for k in ("type_", "kind") if c.get(k)), None
    )
    model = worker.get("backend_model") or next((c.get("model") for c in candidates if c.get("model")), None)
    if model == "None":
        model = None
    return (None if backend is None else str(backend)), (None if model is None else str(model))


def looks_like(obj: Any) -> bool:
    """True for a JSON object whose `benchmarks` list holds objects with `requests`."""
    benchmarks = obj.get("benchmarks") if isinstance(obj, dict) else None
    return isinstance(benchmarks, list) and bool(benchmarks) and isinstance(benchmarks[0], dict)


__all__ = ["FMT_DESC", "TOOL", "read_guidellm"]
