"""Reader for NVIDIA AIPerf's per-request export `profile_export.jsonl` (`aiperf profile ...`, written with the
default `--export-level records`), with the run's settings from the aggregate `profile_export_aiperf.json` beside it.

Source read: ai-dynamo/aiperf at commit db4f6397d11ee2d4cfbb41f70b2327315163dcf0 (2025-10-10):

- `aiperf/post_processors/record_export_results_processor.py` (`RecordExportResultsProcessor`: one
  `MetricRecordInfo.model_dump_json()` per line, only records with at least one exportable metric, time metrics
  converted to their display unit by `MetricRecordDict.to_display_dict` in `aiperf/metrics/metric_dicts.py`);
- `aiperf/common/models/record_models.py` (`MetricRecordInfo`: `metadata`, `metrics`, `error`; `MetricValue`:
  `value`, `unit`; `MetricRecordMetadata`: `session_num`, `x_request_id`, `x_correlation_id`, `conversation_id`,
  `turn_index`, `request_start_ns`, `request_ack_ns`, `request_end_ns` (wall clock, `time.time_ns()`), `worker_id`,
  `record_processor_id`, `benchmark_phase` ("warmup" / "profiling"), `was_cancelled`, `cancellation_time_ns`);
  `aiperf/common/models/error_models.py` (`ErrorDetails`: `code`, `type`, `message`);
- the metrics, `aiperf/metrics/types/`: `request_latency_metric.py` (last response - request start, ns, shown in
  ms), `ttft_metric.py` (`time_to_first_token`: first response - start), `inter_chunk_latency_metric.py`
  (`inter_chunk_latency`: list of gaps between consecutive responses), `inter_token_latency_metric.py`
  (`inter_token_latency`: (request_latency - ttft) / (osl - 1), one mean per request),
  `input_sequence_length_metric.py` (`input_sequence_length`, and `error_isl` for failed requests, tokens),
  `output_sequence_length_metric.py` (`output_sequence_length` = output + reasoning tokens, client-side
  tokenizer); the units are `MetricTimeUnit` tags "ns", "us", "ms", "sec" and "tokens"
  (`aiperf/common/enums/metric_enums.py`);
- the aggregate: `aiperf/exporters/json_exporter.py` and `aiperf/common/models/export_models.py`
  (`JsonExportData`: one `{unit, avg, min, max, p1..p99, std}` object per metric, `input_config` (the
  `UserConfig`, fields the user set only: `endpoint.model_names`, `endpoint.type`, `endpoint.streaming`,
  `loadgen.concurrency`, `loadgen.request_rate`, `loadgen.request_rate_mode`, `input.fixed_schedule`, ...),
  `was_cancelled`, `error_summary`, `start_time`, `end_time`); `aiperf/common/config/config_defaults.py`
  (`PROFILE_EXPORT_FILE` = profile_export.jsonl, `PROFILE_EXPORT_AIPERF_JSON_FILE` = profile_export_aiperf.json);
  docs/tutorials/working-with-profile-exports.md.

Read, per record (rows in send order, i.e. sorted by `request_start_ns`): arrival_s = `request_start_ns`
rebased to the earliest (seconds); e2e_s = `metrics.request_latency`; ttft_s = `metrics.time_to_first_token`
(streaming only, NaN otherwise); itl_s = `metrics.inter_chunk_latency` (gaps between streamed chunks; a chunk may
hold several tokens); prompt_tokens = `input_sequence_length` (failed requests: `error_isl`, else 0);
output_tokens = `output_sequence_length` (0 for failed requests and for a record without one: aiperf leaves it
out when the response had no text); success = `error` is null and not `was_cancelled`. Every time value is
converted from the unit the record states (ns, us, ms, sec) to seconds; another unit string is an error.
Records of the warmup phase are skipped (aiperf's records manager drops them before export; notes count any).
tpot_s is (e2e - ttft) / (output - 1), which is aiperf's own per-request `inter_token_latency`.

Not mapped: the other per-record metrics (`output_token_count`, `reasoning_token_count`, `time_to_second_token`,
`output_token_throughput_per_user`, `inter_token_latency` (a mean; when a record has it but no
`inter_chunk_latency`, itl_s stays None and notes say so), ...; their names are listed in notes) and the request
ids. The per-request file records neither the server's cached-token counts nor the prompt texts (the prompts are
in the separate `inputs.json`), so `cached_tokens` is NaN and `prefix_ids` None.

Run settings come from the aggregate when it is there (`aggregate_path`, by default `profile_export_aiperf.json`
next to the JSONL): model = `endpoint.model_names[0]`, backend = `endpoint.type`
(e.g. "chat"; aiperf does not record the serving engine, so `engine` is None), request_rate =
`loadgen.request_rate` (else inf with a `loadgen.concurrency`; NaN for a fixed schedule), max_concurrency =
`loadgen.concurrency`, duration_s = `benchmark_duration`; `summary` = the aggregate object. Without it:
request_rate NaN, max_concurrency None, model None, duration_s = last end - first start, and notes say so.

Errors: `MeasuredFormatError`, one line naming the file and line, the field and the record's index (its 0-based
position in the file): unreadable file or JSON; a record that is not an object or lacks
`metadata`, `metrics`, `metadata.request_start_ns` / `request_end_ns`, or (successful requests)
`metrics.request_latency` / `input_sequence_length`; a metric that is not `{value, unit}`, has a unit it cannot
have, or a negative, non-finite or non-numeric value; ttft > request_latency; end before start; no profiling
records; an aggregate file that is not a JSON object.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from traces.measured.parse import (
    as_count,
    as_seconds,
    concurrency_value,
    fail,
    parse_json_documents,
    rate_value,
    read_text,
    show,
    source_name,
)
from traces.measured.schema import MeasuredFormatError, MeasuredRun, build_requests

TOOL = "aiperf_profile_export"
FMT_DESC = "an AIPerf profile_export.jsonl"
AGGREGATE_DESC = "an AIPerf profile_export_aiperf.json"
HINT = "expected AIPerf's per-request records, one MetricRecordInfo JSON per line"
AGGREGATE_NAME = "profile_export_aiperf.json"
TIME_UNITS: dict[str, float] = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0}
TOKEN_UNIT = "tokens"
_READ_METRICS = {
    "request_latency",
    "time_to_first_token",
    "inter_chunk_latency",
    "input_sequence_length",
    "error_isl",
    "output_sequence_length",
}


def read_aiperf_profile_export(path: str | Path, aggregate_path: str | Path | None = None) -> MeasuredRun:
    """Read AIPerf's `profile_export.jsonl` (and its aggregate, for the run's settings) into a MeasuredRun.

    Args:
        path: the per-request JSONL.
        aggregate_path: the run's `profile_export_aiperf.json`; None takes the one next to `path` (aiperf writes
            both into its artifact directory) and reads the records alone when there is none.

    Raises:
        MeasuredFormatError: see the module docstring.
    """
    source = source_name(path)
    documents = parse_json_documents(read_text(path, FMT_DESC), source, FMT_DESC)
    rows: list[dict[str, Any]] = []
    skipped_phases: dict[str, int] = {}
    unmapped: set[str] = set()
    mean_itl_only = 0
    for index, (line_no, record) in enumerate(documents):
        where = source if len(documents) == 1 else f"{source} line {line_no}"
        row = _parse_record(record, index, where, unmapped)
        if row["phase"] != "profiling":
            skipped_phases[row["phase"]] = skipped_phases.get(row["phase"], 0) + 1
            continue
        mean_itl_only += row["mean_itl_only"]
        rows.append(row)
    if not rows:
        raise fail(source, FMT_DESC, f"no profiling-phase records (skipped {skipped_phases or 'none'})")
    rows.sort(key=lambda r: r["start_ns"])  # stable: file order breaks ties
    first_ns = rows[0]["start_ns"]
    n = len(rows)
    notes = [f"read {n} profiling record(s); rows in send order (request_start_ns)"]
    if skipped_phases:
        notes.append(f"skipped records of other benchmark phases: {skipped_phases}")
    too_many = [i for i, r in enumerate(rows) if r["itl"] is not None and len(r["itl"]) > max(r["output"] - 1, 0)]
    for i in too_many:
        rows[i]["itl"] = None
    if too_many:
        notes.append(
            f"itl_s None for {len(too_many)} request(s) (first: {too_many[:5]}) whose inter_chunk_latency has more "
            "gaps than output_sequence_length - 1 (aiperf re-tokenises the text, which can count fewer tokens than "
            "chunks)"
        )
    if mean_itl_only:
        notes.append(
            f"{mean_itl_only} record(s) give only a mean inter_token_latency, no inter_chunk_latency: itl_s None "
            "there (no per-token gaps invented)"
        )
    if unmapped:
        notes.append(f"per-record metrics not mapped: {sorted(unmapped)}")
    notes.append("itl_s: aiperf's inter_chunk_latency, one gap per streamed chunk (a chunk may hold several tokens)")
    notes.append("no cached-token counts or prompt texts in the per-request file (prompts are in inputs.json)")
    requests = build_requests(
        [r["prompt"] for r in rows],
        [r["output"] for r in rows],
        [(r["start_ns"] - first_ns) * 1e-9 for r in rows],
        [r["ttft"] for r in rows],
        [r["e2e"] for r in rows],
        [r["itl"] for r in rows],
        [r["success"] for r in rows],
    )
    span_s = (max(r["end_ns"] for r in rows) - first_ns) * 1e-9
    settings = _read_aggregate(Path(path), aggregate_path, span_s, notes)
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=settings["rate"],
        max_concurrency=settings["concurrency"],
        duration_s=settings["duration"],
        model=settings["model"],
        backend=settings["backend"],
        num_prompts=n,
        summary=settings["summary"],
        source_path=source,
        notes=notes,
    )


def _parse_record(record: Any, i: int, where: str, unmapped: set[str]) -> dict[str, Any]:
    """One MetricRecordInfo line -> its row values (seconds, tokens)."""
    if not isinstance(record, dict):
        raise fail(where, FMT_DESC, f"record index {i}: expected a JSON object, got {show(record)}")
    for key in ("metadata", "metrics"):
        if key not in record:
            raise MeasuredFormatError(f"{where}: not {FMT_DESC}: missing '{key}' in record index {i} ({HINT})")
    meta = record["metadata"]
    if not isinstance(meta, dict):
        raise fail(where, FMT_DESC, f"field 'metadata' index {i}: expected an object, got {show(meta)}")
    metrics = record["metrics"] if record["metrics"] is not None else {}
    if not isinstance(metrics, dict):
        raise fail(where, FMT_DESC, f"field 'metrics' index {i}: expected an object, got {show(metrics)}")
    start_ns = _stamp_ns(meta, "request_start_ns", i, where)
    end_ns = _stamp_ns(meta, "request_end_ns", i, where)
    if end_ns < start_ns:
        raise fail(
            where,
            FMT_DESC,
            f"field 'metadata.request_end_ns' index {i}: negative time: end {end_ns} before start {start_ns} (ns)",
        )
    phase = meta.get("benchmark_phase", "profiling")
    if not isinstance(phase, str):
        raise fail(where, FMT_DESC, f"field 'metadata.benchmark_phase' index {i}: expected a string, got {show(phase)}")
    error = record.get("error")
    if error is not None and not isinstance(error, dict):
        raise fail(where, FMT_DESC, f"field 'error' index {i}: expected null or an object, got {show(error)}")
    success = error is None and meta.get("was_cancelled") is not True
    unmapped.update(k for k in metrics if k not in _READ_METRICS)

    e2e = _time_metric(metrics, "request_latency", i, where, required=success)
    ttft = _time_metric(metrics, "time_to_first_token", i, where, required=False)
    if not math.isnan(ttft) and not math.isnan(e2e) and ttft > e2e:
        raise fail(
            where,
            FMT_DESC,
            f"field 'metrics.time_to_first_token' index {i}: {ttft:.9g} s exceeds request_latency {e2e:.9g} s; "
            "expected request_latency >= time_to_first_token",
        )
    gaps = _gaps_metric(metrics, "inter_chunk_latency", i, where)
    prompt = _token_metric(metrics, "input_sequence_length", i, where, required=success)
    if prompt is None:
        prompt = _token_metric(metrics, "error_isl", i, where, required=False)
    output = _token_metric(metrics, "output_sequence_length", i, where, required=False)
    if not success:
        ttft, e2e, gaps = math.nan, math.nan, None
    return {
        "phase": phase,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "prompt": prompt or 0,
        "output": (output or 0) if success else 0,
        "ttft": ttft,
        "e2e": e2e,
        "itl": gaps,
        "success": success,
        "mean_itl_only": int(success and gaps is None and "inter_token_latency" in metrics),
    }


def _stamp_ns(meta: dict[str, Any], key: str, i: int, where: str) -> int:
    """A wall-clock time stamp in integer nanoseconds (`time.time_ns()`)."""
    if key not in meta:
        raise MeasuredFormatError(f"{where}: not {FMT_DESC}: missing 'metadata.{key}' in record index {i} ({HINT})")
    value = meta[key]
    if type(value) is int and value >= 0:
        return value
    raise fail(
        where, FMT_DESC, f"field 'metadata.{key}' index {i}: expected a non-negative integer of ns, got {show(value)}"
    )


def _entry(metrics: dict[str, Any], name: str, i: int, where: str, required: bool) -> tuple[Any, str] | None:
    """(value, unit) of `metrics[name]`, None when absent and not required."""
    if name not in metrics or metrics[name] is None:
        if required:
            raise MeasuredFormatError(
                f"{where}: not {FMT_DESC}: missing 'metrics.{name}' in record index {i} (a successful request has it)"
            )
        return None
    entry = metrics[name]
    if not isinstance(entry, dict) or "value" not in entry or "unit" not in entry:
        raise fail(where, FMT_DESC, f"field 'metrics.{name}' index {i}: expected {{value, unit}}, got {show(entry)}")
    return entry["value"], entry["unit"]


def _time_factor(unit: Any, name: str, i: int, where: str) -> float:
    """Seconds per `unit`, for aiperf's time-unit tags."""
    if isinstance(unit, str) and unit in TIME_UNITS:
        return TIME_UNITS[unit]
    raise fail(
        where,
        FMT_DESC,
        f"field 'metrics.{name}.unit' index {i}: {show(unit)} is not a time unit; expected one of {list(TIME_UNITS)}",
    )


def _time_metric(metrics: dict[str, Any], name: str, i: int, where: str, required: bool) -> float:
    """A duration metric in seconds, NaN when absent."""
    entry = _entry(metrics, name, i, where, required)
    if entry is None:
        return math.nan
    value, unit = entry
    factor = _time_factor(unit, name, i, where)
    return as_seconds(value, f"metrics.{name}", i, where, FMT_DESC, unit=unit) * factor


def _gaps_metric(metrics: dict[str, Any], name: str, i: int, where: str) -> list[float] | None:
    """A list-valued duration metric in seconds, None when absent."""
    entry = _entry(metrics, name, i, where, required=False)
    if entry is None:
        return None
    value, unit = entry
    factor = _time_factor(unit, name, i, where)
    if not isinstance(value, list):
        raise fail(where, FMT_DESC, f"field 'metrics.{name}' index {i}: expected a list of {unit}, got {show(value)}")
    return [as_seconds(v, f"metrics.{name}", i, where, FMT_DESC, unit=unit) * factor for v in value]


def _token_metric(metrics: dict[str, Any], name: str, i: int, where: str, required: bool) -> int | None:
    """A token-count metric, None when absent."""
    entry = _entry(metrics, name, i, where, required)
    if entry is None:
        return None
    value, unit = entry
    if unit != TOKEN_UNIT:
        raise fail(where, FMT_DESC, f"field 'metrics.{name}.unit' index {i}: expected 'tokens', got {show(unit)}")
    return as_count(value, f"metrics.{name}", i, where, FMT_DESC)


# ---------------------------------------------------------------------------------------------------------------
# The aggregate profile_export_aiperf.json: run settings


def _aggregate_file(path: Path, aggregate_path: str | Path | None) -> Path | None:
    if aggregate_path is not None:
        return Path(aggregate_path)
    candidate = path.with_name(AGGREGATE_NAME)
    return candidate if candidate.is_file() else None


def _read_aggregate(path: Path, aggregate_path: str | Path | None, span_s: float, notes: list[str]) -> dict[str, Any]:
    """request_rate, max_concurrency, duration, model, backend and summary from the aggregate (or defaults)."""
    settings: dict[str, Any] = {
        "rate": math.nan,
        "concurrency": None,
        "duration": span_s,
        "model": None,
        "backend": None,
        "summary": {},
    }
    agg_path = _aggregate_file(path, aggregate_path)
    if agg_path is None:
        notes.append(
            f"no {AGGREGATE_NAME} next to the records: request_rate NaN, max_concurrency None, model unknown, "
            "duration_s = last end - first start"
        )
        return settings
    agg_source = source_name(agg_path)
    documents = parse_json_documents(read_text(agg_path, AGGREGATE_DESC), agg_source, AGGREGATE_DESC)
    agg = documents[0][1]
    if len(documents) != 1 or not isinstance(agg, dict):
        raise MeasuredFormatError(f"{agg_source}: not {AGGREGATE_DESC}: expected one JSON object")
    notes.append(f"run settings from {agg_source}")
    settings["summary"] = agg
    config = _object(agg, "input_config", agg_source)
    endpoint = _object(config, "endpoint", agg_source, "input_config.")
    loadgen = _object(config, "loadgen", agg_source, "input_config.")
    models = endpoint.get("model_names")
    if isinstance(models, str):
        settings["model"] = models
    elif isinstance(models, list) and models and isinstance(models[0], str):
        settings["model"] = models[0]
    if isinstance(endpoint.get("type"), str):
        settings["backend"] = endpoint["type"]
    concurrency = concurrency_value(
        loadgen.get("concurrency"), "input_config.loadgen.concurrency", agg_source, AGGREGATE_DESC
    )
    settings["concurrency"] = concurrency
    fixed = _object(config, "input", agg_source, "input_config.").get("fixed_schedule") is True
    if loadgen.get("request_rate") is not None:
        settings["rate"] = rate_value(
            loadgen["request_rate"], "input_config.loadgen.request_rate", agg_source, AGGREGATE_DESC
        )
    elif fixed:
        notes.append("fixed-schedule run: request_rate NaN (the send times are the schedule)")
    elif concurrency is not None:
        settings["rate"] = math.inf
    else:
        notes.append("the aggregate's input_config sets neither request_rate nor concurrency: request_rate NaN")
    duration = agg.get("benchmark_duration")
    if duration is not None:
        if not isinstance(duration, dict) or "avg" not in duration or "unit" not in duration:
            raise fail(
                agg_source, AGGREGATE_DESC, f"field 'benchmark_duration': expected {{unit, avg}}, got {show(duration)}"
            )
        unit = duration["unit"]
        if unit not in TIME_UNITS:
            raise fail(
                agg_source,
                AGGREGATE_DESC,
                f"field 'benchmark_duration.unit': {show(unit)} is not a time unit; expected one of {list(TIME_UNITS)}",
            )
        avg = as_seconds(duration["avg"], "benchmark_duration.avg", None, agg_source, AGGREGATE_DESC, unit=unit)
        settings["duration"] = avg * TIME_UNITS[unit]
    else:
        notes.append("the aggregate has no benchmark_duration: duration_s = last end - first start")
    return settings


def _object(obj: dict[str, Any], key: str, source: str, prefix: str = "") -> dict[str, Any]:
    """`obj[key]` as an object ({} when absent: aiperf writes only the settings the user set)."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(source, AGGREGATE_DESC, f"field '{prefix}{key}': expected an object, got {show(value)}")
    return value


def looks_like(obj: Any) -> bool:
    """True for an AIPerf MetricRecordInfo line: an object with `metadata` and `metrics`, both objects (`error` is
    written only for failed requests by current AIPerf, so it is not required)."""
    return isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and isinstance(obj.get("metrics"), dict)


__all__ = ["FMT_DESC", "TOOL", "looks_like", "read_aiperf_profile_export"]
