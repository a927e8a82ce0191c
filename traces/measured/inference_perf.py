"""Reader for inference-perf's per-request lifecycle report (`per_request_lifecycle_metrics.json`).

Source read: kubernetes-sigs/inference-perf at commit 7de5ef2ed6f7934e0ecbc8297e593f79e68430c0:
`inference_perf/reportgen/base.py` (`ReportGenerator.generate_reports`: with `report.request_lifecycle.per_request:
true` it writes `per_request_lifecycle_metrics.json`, a JSON list with one object per request:
`{"start_time", "end_time", "request", "response", "info", "error"}`; `summarize_requests`: how TTFT, TPOT and ITL
come from `output_token_times`), `inference_perf/apis/base.py` (`InferenceInfo`: `request_metrics`,
`response_metrics`, `extra_info`, `lora_adapter`, `labels`, deprecated top-level `input_tokens`;
`StreamedResponseMetrics`: `output_tokens`, `server_usage`, `response_chunks`, `chunk_times`,
`output_token_times`; `ErrorResponseInfo`: `error_type`, `error_msg`), `inference_perf/payloads/text/metrics.py`
(`Text.input_tokens`), `inference_perf/client/modelserver/openai_client.py` (`start_time`/`end_time` are
`time.perf_counter()` seconds) and `docs/reports.md`.

Read, per request in file order: prompt_tokens = `info.request_metrics.text.input_tokens` (else the deprecated
`info.input_tokens`), output_tokens = `info.response_metrics.output_tokens` (the client-side count inference-perf
uses by default; `use_server_usage=True` prefers the server's `server_usage.prompt_tokens` / `completion_tokens`
when present), success = `error` is null. Derived: arrival_s = `start_time` - earliest `start_time`,
e2e_s = `end_time` - `start_time`, ttft_s = `output_token_times[0]` - `start_time`, itl_s = successive differences
of `output_token_times` (per token when inference-perf re-tokenised the chunks, which gives zero gaps inside a
chunk; per streamed chunk otherwise), tpot_s = (e2e - ttft) / (output - 1). Non-streamed requests have no
`output_token_times`: ttft/itl absent. The file holds no run settings: request_rate is NaN (unknown),
max_concurrency None, duration_s = last end - first start, model from the first request body's "model" field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from traces.measured.parse import as_count, as_timestamp, fail, parse_json_documents, read_text, show, source_name
from traces.measured.schema import MeasuredFormatError, MeasuredRun, build_requests

TOOL = "inference_perf"
FMT_DESC = "an inference-perf per_request_lifecycle_metrics.json"
HINT = "set report.request_lifecycle.per_request: true"
REQUIRED_KEYS = ("start_time", "end_time", "info")


def read_inference_perf(path: str | Path, use_server_usage: bool = False) -> MeasuredRun:
    """Read inference-perf's per-request lifecycle report into a MeasuredRun.

    Args:
        path: `per_request_lifecycle_metrics.json` (a JSON list).
        use_server_usage: take token counts from the server's `usage` where it reported one.

    Raises:
        MeasuredFormatError: not a list of request objects, a missing `start_time`/`end_time`/`info`/token count,
            end before start, token times before the start or out of order.
    """
    source = source_name(path)
    documents = parse_json_documents(read_text(path, FMT_DESC), source, FMT_DESC)
    items = documents[0][1]
    if len(documents) != 1 or not isinstance(items, list):
        raise MeasuredFormatError(f"{source}: not {FMT_DESC}: expected one JSON list of request objects ({HINT})")
    if not items:
        raise fail(source, FMT_DESC, "no requests in the list")
    cols: dict[str, list] = {k: [] for k in ("prompt", "output", "start", "ttft", "e2e", "itl", "success")}
    for i, item in enumerate(items):
        _parse_item(item, i, source, use_server_usage, cols)
    first_start = min(cols["start"])
    last_end = max(s + e for s, e in zip(cols["start"], cols["e2e"]))
    requests = build_requests(
        cols["prompt"], cols["output"], cols["start"], cols["ttft"], cols["e2e"], cols["itl"], cols["success"]
    )
    notes = ["run settings (rate, concurrency) are not in the per-request file: request_rate NaN"]
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=math.nan,
        max_concurrency=None,
        duration_s=last_end - first_start,
        model=_model(items),
        backend=None,
        num_prompts=len(items),
        summary={},
        source_path=source,
        notes=notes,
    )


def _parse_item(item: Any, i: int, source: str, use_server_usage: bool, cols: dict[str, list]) -> None:
    """Append one request's values to `cols`."""
    if not isinstance(item, dict):
        raise fail(source, FMT_DESC, f"index {i}: expected a request object, got {show(item)}")
    for key in REQUIRED_KEYS:
        if key not in item:
            raise MeasuredFormatError(f"{source}: not {FMT_DESC}: missing '{key}' at index {i} ({HINT})")
    start = as_timestamp(item["start_time"], "start_time", i, source, FMT_DESC)
    end = as_timestamp(item["end_time"], "end_time", i, source, FMT_DESC)
    if end < start:
        raise fail(source, FMT_DESC, f"field 'end_time' index {i}: negative time: end {end!r} before start {start!r}")
    info = item["info"]
    if not isinstance(info, dict):
        raise fail(source, FMT_DESC, f"field 'info' index {i}: expected an object, got {show(info)}")
    response = info.get("response_metrics") if isinstance(info.get("response_metrics"), dict) else {}
    usage = response.get("server_usage") if isinstance(response.get("server_usage"), dict) else {}
    text = (
        ((info.get("request_metrics") or {}).get("text") or {}) if isinstance(info.get("request_metrics"), dict) else {}
    )
    prompt = text.get("input_tokens", info.get("input_tokens"))
    output = response.get("output_tokens", 0)
    if use_server_usage:
        prompt = usage.get("prompt_tokens", prompt)
        output = usage.get("completion_tokens", output)
    if prompt is None:
        raise MeasuredFormatError(
            f"{source}: not {FMT_DESC}: missing 'info.request_metrics.text.input_tokens' at index {i}"
        )
    cols["prompt"].append(as_count(prompt, "info.request_metrics.text.input_tokens", i, source, FMT_DESC))
    cols["output"].append(as_count(output, "info.response_metrics.output_tokens", i, source, FMT_DESC))
    times = response.get("output_token_times") or []
    if not isinstance(times, list):
        raise fail(source, FMT_DESC, f"field 'output_token_times' index {i}: expected a list, got {show(times)}")
    stamps = [as_timestamp(t, "info.response_metrics.output_token_times", i, source, FMT_DESC) for t in times]
    for j in range(len(stamps)):
        previous = start if j == 0 else stamps[j - 1]
        if stamps[j] < previous:
            raise fail(
                source,
                FMT_DESC,
                f"field 'info.response_metrics.output_token_times' index {i} item {j}: negative time "
                f"(time stamp {stamps[j]!r} before {'start_time' if j == 0 else 'the previous token'} {previous!r})",
            )
    success = item.get("error") is None
    cols["start"].append(start)
    cols["e2e"].append(end - start)
    cols["ttft"].append(stamps[0] - start if stamps else math.nan)
    cols["itl"].append([b - a for a, b in zip(stamps, stamps[1:])] if stamps else None)
    cols["success"].append(success)


def _model(items: list[Any]) -> str | None:
    """The "model" field of the first request body that is a JSON object with one."""
    for item in items[:16]:
        body = item.get("request") if isinstance(item, dict) else None
        if isinstance(body, str):
            try:
                parsed = json.loads(body)
            except ValueError:
                continue
            if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
                return parsed["model"]
    return None


def looks_like(obj: Any) -> bool:
    """True for a JSON list whose first element is an object with start_time, end_time and info."""
    return isinstance(obj, list) and bool(obj) and isinstance(obj[0], dict) and all(k in obj[0] for k in REQUIRED_KEYS)


__all__ = ["FMT_DESC", "TOOL", "read_inference_perf"]
