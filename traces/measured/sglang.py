"""Reader and writer for SGLang `bench_serving` JSONL output written with `--output-details`.

Source read: sgl-project/sglang `python/sglang/bench_serving.py` at commit
0033168f0f58b2bc05aa0273bd475d9c01bafb1c (function `benchmark`: the `result` and `result_details` dicts, and
`calculate_metrics`), checked against the older 50a613687fe1ffc6f1bb630c684a24c428a54a74 and
`docs/developer_guide/bench_serving.md` at 0229689b6730cccb5b7f0d4eeef06d7de423b6e1.

Format: every run *appends* one JSON object as one line to `--output-file`, so a file may hold several runs.
With `--output-details` the line is `result | result_details`:

- run settings: `backend`, `dataset_name`, `request_rate` (float; `Infinity` for the default inf),
  `max_concurrency` (int or null), `duration` (s), plus `sharegpt_output_len`, `random_*` arguments;
- aggregates: `completed`, `total_input_tokens`, `total_output_tokens`, `total_output_tokens_retokenized`,
  `request_throughput`, `input_throughput`, `output_throughput`, `{mean,median,std,p99}_{ttft,tpot,itl}_ms`,
  `p95_itl_ms`, `{mean,median,std,p99}_e2e_latency_ms`, `concurrency`, `accept_length`;
- per request, in send order (`result_details`): `input_lens` (prompt tokens), `output_lens` (output tokens; 0 for
  a failed request), `ttfts` (s; 0.0 for a failed request), `itls` (list of s per request: gaps between streamed
  chunks after the first), `generated_texts`, `errors` ("" when none).

Read: `input_lens` -> prompt_tokens, `output_lens` -> output_tokens, `ttfts` -> ttft_s, `itls` -> itl_s,
`errors` -> success (empty error and ttft > 0). The file records neither send times nor per-request latency:
`arrival_s` is NaN and `e2e_s` is derived as ttft + sum(itls) (the time of the last streamed chunk; SGLang's own
`latency`, used in its TPOT, also counts the wait for the closing `[DONE]`, so its TPOTs can be slightly larger);
failed requests get NaN ttft/e2e/tpot and itl None. `summary` holds every other key of the line except the
per-request lists. `model` is read from `model_id`/`model` if a version writes one (the commits read do not).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from traces.measured.parse import (
    as_seconds,
    concurrency_value,
    parse_bench_lists,
    pick_run,
    rate_value,
    require,
    source_name,
)
from traces.measured.schema import MeasuredRun, build_requests, check_requests_table, latency_summary

TOOL = "sglang_bench_serving"
FMT_DESC = "an SGLang bench_serving --output-details line"
HINT = "run with --output-details"
PER_REQUEST_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
# Keys only SGLang's result line has (vLLM's uses e2el, total_token_throughput, no retokenized counts).
MARKER_KEYS = ("total_output_tokens_retokenized", "mean_e2e_latency_ms", "input_throughput", "dataset_name")
STRONG_MARKER_KEYS = ("total_output_tokens_retokenized", "mean_e2e_latency_ms")  # never in a vLLM result
# keys of vLLM's benchmark_serving results that SGLang's never writes: with one of them, the weak markers above
# (vLLM's older results also have input_throughput) do not make the file SGLang's
VLLM_KEYS = ("model_id", "tokenizer_id", "best_of", "mean_e2el_ms")


def read_sglang_bench_serving(path: str | Path, run_index: int = -1) -> MeasuredRun:
    """Read one run (line) of an SGLang bench_serving `--output-file` written with `--output-details`.

    Args:
        path: the JSONL file.
        run_index: which line (run) to read, Python-style (default -1: the last run, the one appended most
            recently); `notes` says which was read when the file holds several.

    Returns:
        MeasuredRun with tool "sglang_bench_serving" (see the module docstring for the mapping).

    Raises:
        MeasuredFormatError: unreadable file, invalid JSON, `run_index` out of range, a missing per-request list
            (e.g. 'itls' when the run lacked --output-details), lists of different lengths, negative or NaN values.
    """
    cut_off: list[str] = []
    obj, where, line_no, num_runs = pick_run(path, run_index, FMT_DESC, cut_off)
    prompts, outputs, ttft, gaps, success = parse_bench_lists(obj, where, FMT_DESC, HINT)
    ttft_s = [t if ok else math.nan for t, ok in zip(ttft, success)]
    e2e_s = [t + math.fsum(g) if ok else math.nan for t, g, ok in zip(ttft, gaps, success)]
    itl_s = [g if ok else None for g, ok in zip(gaps, success)]
    requests = build_requests(prompts, outputs, None, ttft_s, e2e_s, itl_s, success)
    rate = rate_value(require(obj, "request_rate", where, FMT_DESC, HINT), "request_rate", where, FMT_DESC)
    concurrency = concurrency_value(obj.get("max_concurrency"), "max_concurrency", where, FMT_DESC)
    duration = as_seconds(require(obj, "duration", where, FMT_DESC, HINT), "duration", None, where, FMT_DESC)
    notes = list(cut_off)
    if num_runs > 1:
        notes.append(f"read run {run_index % num_runs + 1} of {num_runs} (line {line_no}, run_index={run_index})")
    notes.append("arrival_s: not recorded by bench_serving (NaN); e2e_s derived as ttft + sum(itls)")
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=rate,
        max_concurrency=concurrency,
        duration_s=duration,
        model=_optional_str(obj.get("model_id", obj.get("model"))),
        backend=_optional_str(obj.get("backend")),
        num_prompts=len(prompts),
        summary={k: v for k, v in obj.items() if k not in PER_REQUEST_KEYS},
        source_path=source_name(path),
        notes=notes,
    )


def write_sglang_bench_serving(run: MeasuredRun, path: str | Path, append: bool = False) -> Path:
    """Write `run` as one SGLang bench_serving `--output-details` line that `read_sglang_bench_serving` reads back.

    Writes the fields SGLang writes that the reader needs (`backend`, `request_rate` (`Infinity` for inf, as
    SGLang's json.dumps does), `max_concurrency`, `duration`, `input_lens`, `output_lens`, `ttfts`, `itls`, `errors`)
    plus the aggregates computable from the table under SGLang's names (`completed`, totals, throughputs,
    `{mean,median,std,p99}_{ttft,tpot,e2e_latency}_ms`, `{mean,median,std,p95,p99}_itl_ms`, `concurrency`).
    Failed requests are written as SGLang writes them: output 0, ttft 0.0, no gaps, error "failed". Send times are
    not part of the format and are lost.

    Args:
        run: the run (e.g. a simulated one) to write.
        path: the output file.
        append: append a line (as SGLang does) instead of overwriting the file.

    Returns:
        The path written.
    """
    check_requests_table(run.requests)
    req = run.requests
    success = req["success"].to_numpy(dtype=bool)
    summary = latency_summary(req, run.duration_s, "e2e_latency", itl_percentiles=(95, 99))
    e2e = req["e2e_s"].to_numpy(dtype=np.float64)
    summary["input_throughput"] = summary["total_input_tokens"] / run.duration_s if run.duration_s > 0 else math.nan
    summary["total_throughput"] = (
        (summary["total_input_tokens"] + summary["total_output_tokens"]) / run.duration_s
        if run.duration_s > 0
        else math.nan
    )
    summary["concurrency"] = float(np.nansum(e2e[success]) / run.duration_s) if run.duration_s > 0 else math.nan
    line: dict[str, Any] = {
        "backend": run.backend or "sglang",
        "request_rate": float(run.request_rate) if not math.isnan(run.request_rate) else math.inf,
        "max_concurrency": run.max_concurrency,
        "duration": float(run.duration_s),
        **summary,
        **_per_request_lists(req),
    }
    if run.model is not None:
        line["model_id"] = run.model
    out = Path(path)
    with open(out, "a" if append else "w", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return out


def _per_request_lists(req: Any) -> dict[str, list]:
    """`input_lens`, `output_lens`, `ttfts`, `itls`, `errors` as SGLang writes them (failed: 0 / 0.0 / [] / error)."""
    success = req["success"].to_numpy(dtype=bool)
    ttft = req["ttft_s"].to_numpy(dtype=np.float64)
    return {
        "input_lens": [int(v) for v in req["prompt_tokens"]],
        "output_lens": [int(v) if ok else 0 for v, ok in zip(req["output_tokens"], success)],
        "ttfts": [float(t) if ok and math.isfinite(t) else 0.0 for t, ok in zip(ttft, success)],
        "itls": [[float(x) for x in g] if ok and g is not None else [] for g, ok in zip(req["itl_s"], success)],
        "errors": ["" if ok else "failed" for ok in success],
    }


def looks_like(obj: Any) -> bool:
    """True for a bench_serving result object (`input_lens`, or `duration` + `completed`) with an SGLang-only key:
    one of :data:`STRONG_MARKER_KEYS`, or another of :data:`MARKER_KEYS` and none of vLLM's :data:`VLLM_KEYS`."""
    is_bench = isinstance(obj, dict) and ("input_lens" in obj or ("duration" in obj and "completed" in obj))
    if not is_bench:
        return False
    return any(k in obj for k in STRONG_MARKER_KEYS) or (
        any(k in obj for k in MARKER_KEYS) and not any(k in obj for k in VLLM_KEYS)
    )


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


__all__ = ["FMT_DESC", "TOOL", "read_sglang_bench_serving", "write_sglang_bench_serving"]
