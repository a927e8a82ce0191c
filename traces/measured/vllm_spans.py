"""Reader for vLLM's per-request OpenTelemetry spans (`vllm serve --otlp-traces-endpoint ...`), one span a line.

Sources read (vllm-project/vllm): `vllm/tracing.py` at 91310096deedb007defd3f019a7058ac4e8587d9 (`SpanAttributes`:
the attribute names) and `vllm/v1/engine/output_processor.py` at d07822605346f767b672503c9aae85aa23ef2d82
(`OutputProcessor.do_tracing`: when a request finishes vLLM emits one span named "llm_request", kind SERVER,
starting at the request's arrival time (Unix ns), with attributes `gen_ai.latency.time_to_first_token` (s, from
arrival), `gen_ai.latency.e2e` (s, arrival to finish), `gen_ai.latency.time_in_queue`,
`gen_ai.latency.time_in_model_prefill`, `gen_ai.latency.time_in_model_decode`,
`gen_ai.latency.time_in_model_inference` (s), `gen_ai.usage.prompt_tokens`, `gen_ai.usage.completion_tokens`,
`gen_ai.request.id`, optional `gen_ai.request.top_p` / `max_tokens` / `temperature` / `n`; aborted requests get an
error status). These spans carry **no per-token time stamps**, so itl_s is None and tpot_s is derived as
(e2e - ttft) / (completion - 1). (A tree at 03b8a674ec7e654ab285df6f013a53a24381f941 also defines "journey
event" attributes such as `ts.monotonic` and `decode.done_tokens`; they are not read here.)

Accepted line shapes (the span JSON an exporter writes; several may be mixed):

- OpenTelemetry SDK `ReadableSpan.to_json()` (ConsoleSpanExporter), compacted to one line: `name`,
  `start_time` (ISO 8601 UTC string), `status.status_code`, `attributes` as an object;
- an OTLP/JSON span: `name`, `startTimeUnixNano` (string or int), `status.code`, `attributes` as a list of
  `{"key": ..., "value": {"intValue"|"doubleValue"|"stringValue": ...}}`;
- an OTLP/JSON export request (what the OpenTelemetry Collector's file exporter writes per line):
  `{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}`; a whole-file JSON list of spans also works.

Spans without `gen_ai.latency.e2e` (e.g. HTTP server spans in the same file) are skipped and counted in `notes`.
Read: prompt_tokens = `gen_ai.usage.prompt_tokens`, output_tokens = `gen_ai.usage.completion_tokens`,
ttft_s = `gen_ai.latency.time_to_first_token`, e2e_s = `gen_ai.latency.e2e`, queue_s =
`gen_ai.latency.time_in_queue` where present (so prefill = TTFT - queue), arrival_s = span start - earliest
span start (server-side arrival), success = status is not ERROR; rows sorted by arrival. Run level: request_rate
NaN (not recorded), max_concurrency None, duration_s = last (start + e2e) - first start, model =
`gen_ai.response.model` where present.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from traces.measured.parse import as_count, as_seconds, fail, parse_json_documents, read_text, show, source_name
from traces.measured.schema import MeasuredFormatError, MeasuredRun, build_requests

TOOL = "vllm_otel_spans"
FMT_DESC = "a JSONL of vLLM llm_request OpenTelemetry spans"
HINT = "expected vLLM's gen_ai.* span attributes"
ATTR_PROMPT = "gen_ai.usage.prompt_tokens"
ATTR_COMPLETION = "gen_ai.usage.completion_tokens"
ATTR_TTFT = "gen_ai.latency.time_to_first_token"
ATTR_E2E = "gen_ai.latency.e2e"
ATTR_MODEL = "gen_ai.response.model"
ATTR_REQUEST_ID = "gen_ai.request.id"
ATTR_QUEUE = "gen_ai.latency.time_in_queue"  # arrival to first scheduled (s): the replay's queue time is compared
_OTLP_VALUE_KEYS = ("stringValue", "intValue", "doubleValue", "boolValue")


def read_vllm_otel_spans(path: str | Path) -> MeasuredRun:
    """Read vLLM "llm_request" spans exported as JSON lines into a MeasuredRun.

    Raises:
        MeasuredFormatError: unreadable file or JSON, no span with `gen_ai.latency.e2e`, a request span missing
            a token count, time to first token or start time, negative latencies.
    """
    source = source_name(path)
    documents = parse_json_documents(read_text(path, FMT_DESC), source, FMT_DESC)
    spans: list[tuple[str, dict[str, Any]]] = []
    for line_no, doc in documents:
        for span in _spans_in(doc):
            spans.append((f"line {line_no}", span))
    rows = []
    skipped = 0
    for where, span in spans:
        attributes = _attributes(span)
        if ATTR_E2E not in attributes:
            skipped += 1
            continue
        rows.append(_parse_span(span, attributes, f"{source} {where}" if len(documents) > 1 else source))
    if not rows:
        raise MeasuredFormatError(
            f"{source}: not {FMT_DESC}: missing '{ATTR_E2E}' in every span ({len(spans)} span(s) seen; {HINT})"
        )
    rows.sort(key=lambda r: r["start"])
    first = rows[0]["start"]
    requests = build_requests(
        [r["prompt"] for r in rows],
        [r["output"] for r in rows],
        [r["start"] for r in rows],
        [r["ttft"] for r in rows],
        [r["e2e"] for r in rows],
        [None] * len(rows),
        [r["success"] for r in rows],
        queue_s=[r["queue"] for r in rows],
    )
    notes = ["itl_s: vLLM's spans carry no per-token time stamps (None); request_rate not recorded (NaN)"]
    if skipped:
        notes.append(f"skipped {skipped} span(s) without '{ATTR_E2E}'")
    model = next((r["model"] for r in rows if r["model"] is not None), None)
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=math.nan,
        max_concurrency=None,
        duration_s=max(r["start"] + r["e2e"] for r in rows) - first,
        model=model,
        backend="vllm",
        num_prompts=len(rows),
        summary={},
        source_path=source,
        notes=notes,
    )


def _spans_in(doc: Any) -> list[dict[str, Any]]:
    """The span objects in one JSON document (a span, a list of spans, or an OTLP export request)."""
    if isinstance(doc, list):
        return [s for item in doc for s in _spans_in(item)]
    if not isinstance(doc, dict):
        return []
    if "resourceSpans" in doc:
        out = []
        for resource in doc.get("resourceSpans") or []:
            scopes = (resource or {}).get("scopeSpans") or (resource or {}).get("instrumentationLibrarySpans") or []
            for scope in scopes:
                out.extend(s for s in (scope or {}).get("spans") or [] if isinstance(s, dict))
        return out
    return [doc]


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    """Span attributes as a flat dict, from either the SDK object form or the OTLP key/value list."""
    raw = span.get("attributes")
    if isinstance(raw, dict):
        return raw
    out: dict[str, Any] = {}
    if isinstance(raw, list):
        for kv in raw:
            if not isinstance(kv, dict) or "key" not in kv or not isinstance(kv.get("value"), dict):
                continue
            value = kv["value"]
            for key in _OTLP_VALUE_KEYS:
                if key in value:
                    v = value[key]
                    out[kv["key"]] = int(v) if key == "intValue" and isinstance(v, str) and _is_int(v) else v
                    break
    return out


def _parse_span(span: dict[str, Any], attributes: dict[str, Any], where: str) -> dict[str, Any]:
    """Token counts, latencies, start time and status of one llm_request span."""
    name = span.get("name", "?")
    for key in (ATTR_PROMPT, ATTR_COMPLETION, ATTR_TTFT):
        if key not in attributes:
            raise MeasuredFormatError(f"{where}: not {FMT_DESC}: missing '{key}' in span {show(name)}")
    ttft = as_seconds(attributes[ATTR_TTFT], ATTR_TTFT, None, where, FMT_DESC)
    e2e = as_seconds(attributes[ATTR_E2E], ATTR_E2E, None, where, FMT_DESC)
    if e2e < ttft:
        raise fail(where, FMT_DESC, f"field '{ATTR_E2E}': {e2e!r} s is shorter than {ATTR_TTFT} {ttft!r} s")
    status = span.get("status") if isinstance(span.get("status"), dict) else {}
    code = status.get("status_code", status.get("code"))
    success = str(code).upper() not in ("ERROR", "STATUS_CODE_ERROR", "STATUSCODE.ERROR", "2")
    model = attributes.get(ATTR_MODEL)
    queue = math.nan
    if ATTR_QUEUE in attributes:
        queue = as_seconds(attributes[ATTR_QUEUE], ATTR_QUEUE, None, where, FMT_DESC)
        if queue > ttft:
            raise fail(where, FMT_DESC, f"field '{ATTR_QUEUE}': {queue!r} s is longer than {ATTR_TTFT} {ttft!r} s")
    return {
        "queue": queue,
        "start": _start_seconds(span, where),
        "prompt": as_count(_int_like(attributes[ATTR_PROMPT]), ATTR_PROMPT, None, where, FMT_DESC),
        "output": as_count(_int_like(attributes[ATTR_COMPLETION]), ATTR_COMPLETION, None, where, FMT_DESC),
        "ttft": ttft,
        "e2e": e2e,
        "success": success,
        "model": None if model is None else str(model),
    }


def _start_seconds(span: dict[str, Any], where: str) -> float:
    """The span start in Unix seconds: `startTimeUnixNano` (OTLP) or `start_time` (SDK, ISO 8601)."""
    if "startTimeUnixNano" in span:
        value = span["startTimeUnixNano"]
        if isinstance(value, (int, str)) and not isinstance(value, bool) and _is_int(str(value)):
            return int(value) / 1e9
        raise fail(where, FMT_DESC, f"field 'startTimeUnixNano': expected integer nanoseconds, got {show(value)}")
    value = span.get("start_time")
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            stamp = None
        if stamp is not None:
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=timezone.utc)
            return stamp.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value) / 1e9 if value > 1e14 else float(value)
    raise MeasuredFormatError(
        f"{where}: not {FMT_DESC}: missing 'start_time' (ISO 8601) or 'startTimeUnixNano' in span "
        f"{show(span.get('name', '?'))}, got {show(value)}"
    )


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _int_like(value: Any) -> Any:
    """OTLP writes int64 as strings; turn "123" into 123, leave anything else for the check to reject."""
    return int(value) if isinstance(value, str) and _is_int(value) else value


def looks_like(obj: Any) -> bool:
    """True for a span (SDK or OTLP form) with a gen_ai.latency attribute, or an OTLP export request."""
    if isinstance(obj, list):
        return bool(obj) and looks_like(obj[0])
    if not isinstance(obj, dict):
        return False
    if "resourceSpans" in obj:
        return True
    return ("attributes" in obj and any(k.startswith("gen_ai.") for k in _attributes(obj))) or obj.get(
        "name"
    ) == "llm_request"


__all__ = ["FMT_DESC", "TOOL", "read_vllm_otel_spans"]
