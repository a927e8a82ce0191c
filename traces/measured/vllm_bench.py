"""Reader and writer for `vllm bench serve --save-result --save-detailed` result JSON.

Source read: vllm-project/vllm `vllm/benchmarks/serve.py` at commit 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1
(functions `benchmark`, `calculate_metrics`, `main_async`) and `vllm/benchmarks/lib/endpoint_request_func.py` at
02cfb534df5674737558730b10f23d1b7aef9b7c (`RequestFuncOutput`: `start_time` = `time.perf_counter()` at send,
`latency` = last token - send, `itl` = gaps between streamed chunks); checked against the older
def9ce85ba1079af970a58ed3d42dd861ae35d58, whose files lack `start_times`, `latencies` and `queue_times`.

Format: one JSON object (`--append-result` appends further lines; read with `run_index`):

- setup: `date`, `endpoint_type`, `backend`, `label`, `model_id`, `tokenizer_id`, `num_prompts`, `--metadata`
  keys, `request_rate` (float, or the string "inf"), `burstiness`, `max_concurrency` (int or null), ramp-up keys;
- aggregates: `duration` (s), `completed`, `failed`, `total_input_tokens`, `total_output_tokens`,
  `request_throughput`, `request_goodput`, `output_throughput`, `total_token_throughput`,
  `max_output_tokens_per_s`, `max_concurrent_requests`, `{mean,median,std}_{ttft,tpot,itl,e2el}_ms` and
  `p{N}_{...}_ms` for `--metric-percentiles` (default 99);
- per request, in send order (only with `--save-detailed`): `input_lens`, `output_lens` (0 for a failed request),
  `ttfts` (s), `itls` (list of s), `generated_texts`, `errors`, and in newer versions `latencies` (s, per request
  end-to-end), `start_times` (perf_counter s at send, after the client's concurrency semaphore) and
  `queue_times` (s spent waiting for that semaphore).

Read: `input_lens` -> prompt_tokens, `output_lens` -> output_tokens, `ttfts` -> ttft_s, `itls` -> itl_s,
`latencies` -> e2e_s (else derived as ttft + sum(itls)), `errors` -> success (empty error and ttft > 0).
`arrival_s` = `start_times` - `queue_times` (the time the tool's arrival process issued the request, before any
`--max-concurrency` wait), rebased to the earliest; NaN when `start_times` is absent. Failed requests get NaN
ttft/e2e/tpot and itl None. `model` = `model_id`, `backend` = `backend` (else `endpoint_type`); `summary` holds
every other key except the per-request lists.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from traces.measured.parse import (
    as_seconds,
    as_timestamp,
    concurrency_value,
    parse_bench_lists,
    pick_run,
    rate_value,
    require,
    require_list,
    source_name,
)
from traces.measured.schema import MeasuredRun, build_requests, check_requests_table, latency_summary

TOOL = "vllm_bench_serve"
FMT_DESC = "a vllm bench serve --save-detailed result"
HINT = "run with --save-result --save-detailed"
PER_REQUEST_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "queue_times",
    "generated_texts",
    "errors",
)
# Keys only vLLM's result has (SGLang's uses e2e_latency, input_throughput, retokenized counts).
MARKER_KEYS = ("model_id", "endpoint_type", "failed", "burstiness", "mean_e2el_ms", "max_concurrent_requests")


def read_vllm_bench_serve(path: str | Path, run_index: int = -1) -> MeasuredRun:
    """Read a `vllm bench serve --save-result --save-detailed` result file.

    Args:
        path: the `.json` file (one object; or several lines written with `--append-result`).
        run_index: which object (line) to read when there are several, Python-style (default -1: the last).

    Returns:
        MeasuredRun with tool "vllm_bench_serve" (see the module docstring for the mapping).

    Raises:
        MeasuredFormatError: unreadable file, invalid JSON, a missing per-request list ('itls' etc. when the run
            lacked --save-detailed), lists of different lengths, negative or NaN values.
    """
    cut_off: list[str] = []
    obj, where, line_no, num_runs = pick_run(path, run_index, FMT_DESC, cut_off)
    prompts, outputs, ttft, gaps, success = parse_bench_lists(obj, where, FMT_DESC, HINT)
    n = len(prompts)
    notes = list(cut_off)
    if "latencies" in obj:
        raw = require_list(obj, "latencies", n, "input_lens", where, FMT_DESC, HINT)
        latencies = [as_seconds(v, "latencies", i, where, FMT_DESC) for i, v in enumerate(raw)]
    else:
        latencies = [t + math.fsum(g) for t, g in zip(ttft, gaps)]
        notes.append("e2e_s derived as ttft + sum(itls) (no 'latencies' in this vLLM version)")
    arrivals: list[float] | None = None
    if "start_times" in obj:
        raw = require_list(obj, "start_times", n, "input_lens", where, FMT_DESC, HINT)
        arrivals = [as_timestamp(v, "start_times", i, where, FMT_DESC) for i, v in enumerate(raw)]
        if "queue_times" in obj:
            raw = require_list(obj, "queue_times", n, "input_lens", where, FMT_DESC, HINT)
            queued = [as_seconds(v, "queue_times", i, where, FMT_DESC) for i, v in enumerate(raw)]
            arrivals = [a - q for a, q in zip(arrivals, queued)]
            notes.append("arrival_s = start_times - queue_times (issue time before the client's concurrency wait)")
        else:
            notes.append("arrival_s = start_times (send time)")
    else:
        notes.append("arrival_s: no 'start_times' in this vLLM version (NaN)")
    ttft_s = [t if ok else math.nan for t, ok in zip(ttft, success)]
    e2e_s = [e if ok else math.nan for e, ok in zip(latencies, success)]
    itl_s = [g if ok else None for g, ok in zip(gaps, success)]
    requests = build_requests(prompts, outputs, arrivals, ttft_s, e2e_s, itl_s, success)
    if num_runs > 1:
        notes.insert(0, f"read run {run_index % num_runs + 1} of {num_runs} (line {line_no}, run_index={run_index})")
    rate = rate_value(require(obj, "request_rate", where, FMT_DESC, HINT), "request_rate", where, FMT_DESC)
    backend = obj.get("backend", obj.get("endpoint_type"))
    model = obj.get("model_id")
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=rate,
        max_concurrency=concurrency_value(obj.get("max_concurrency"), "max_concurrency", where, FMT_DESC),
        duration_s=as_seconds(require(obj, "duration", where, FMT_DESC, HINT), "duration", None, where, FMT_DESC),
        model=None if model is None else str(model),
        backend=None if backend is None else str(backend),
        num_prompts=n,
        summary={k: v for k, v in obj.items() if k not in PER_REQUEST_KEYS},
        source_path=source_name(path),
        notes=notes,
    )


def write_vllm_bench_serve(run: MeasuredRun, path: str | Path) -> Path:
    """Write `run` as a `vllm bench serve --save-result --save-detailed` result that `read_vllm_bench_serve` reads.

    Writes the fields vLLM writes that the reader needs (`backend`, `model_id`, `num_prompts`, `request_rate`
    ("inf" for inf, as vLLM does), `max_concurrency`, `duration`, `input_lens`, `output_lens`, `ttfts`, `itls`,
    `latencies`, `errors`, and `start_times` when the run has send times) plus the aggregates computable from the
    table under vLLM's names (`completed`, `failed`, totals, `request_throughput`, `output_throughput`,
    `total_token_throughput`, `{mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms`). Failed requests are written as vLLM
    writes them: output 0, ttft 0.0, no gaps, latency 0.0, error "failed".

    Returns:
        The path written.
    """
    check_requests_table(run.requests)
    req = run.requests
    success = req["success"].to_numpy(dtype=bool)
    summary = latency_summary(req, run.duration_s, "e2el")
    summary["failed"] = int((~success).sum())
    summary["total_token_throughput"] = (
        (summary["total_input_tokens"] + summary["total_output_tokens"]) / run.duration_s
        if run.duration_s > 0
        else math.nan
    )
    rate = run.request_rate
    result: dict[str, Any] = {
        "backend": run.backend or "vllm",
        "model_id": run.model,
        "num_prompts": int(run.num_prompts),
        "request_rate": "inf" if math.isnan(rate) or math.isinf(rate) else float(rate),
        "max_concurrency": run.max_concurrency,
        "duration": float(run.duration_s),
        **summary,
    }
    ttft = req["ttft_s"].to_numpy(dtype=np.float64)
    e2e = req["e2e_s"].to_numpy(dtype=np.float64)
    result["input_lens"] = [int(v) for v in req["prompt_tokens"]]
    result["output_lens"] = [int(v) if ok else 0 for v, ok in zip(req["output_tokens"], success)]
    result["ttfts"] = [float(t) if ok and math.isfinite(t) else 0.0 for t, ok in zip(ttft, success)]
    result["itls"] = [[float(x) for x in g] if ok and g is not None else [] for g, ok in zip(req["itl_s"], success)]
    result["latencies"] = [float(e) if ok and math.isfinite(e) else 0.0 for e, ok in zip(e2e, success)]
    arrivals = req["arrival_s"].to_numpy(dtype=np.float64)
    if len(arrivals) and np.isfinite(arrivals).all():
        result["start_times"] = [float(a) for a in arrivals]
    result["errors"] = ["" if ok else "failed" for ok in success]
    out = Path(path)
    out.write_text(json.dumps(result) + "\n", encoding="utf-8")
    return out


def looks_like(obj: Any) -> bool:
    """True for a bench result object (`input_lens`, or `duration` + `completed`) with a vLLM-only key."""
    is_bench = isinstance(obj, dict) and ("input_lens" in obj or ("duration" in obj and "completed" in obj))
    return is_bench and any(k in obj for k in MARKER_KEYS)


__all__ = ["FMT_DESC", "TOOL", "read_vllm_bench_serve", "write_vllm_bench_serve"]
