"""Reader for per-request vLLM server timestamps, ``requests.jsonl`` with the run's resolved config in ``meta.json``.

Source of the format: LLMServingSim's vLLM bench (casys-kaist/LLMServingSim at
5daddb21a545658d5150b535712d0494584b5278): ``bench/core/recorder.py`` (``write_meta``, ``write_requests``: the
schema), ``bench/core/runner.py`` (``_record_from_metrics``: each record is vLLM's ``RequestOutput.metrics``, a
``RequestStateStats`` of ``vllm/v1/metrics/stats.py``, projected onto flat keys; ``write_meta``'s ``kv_cache`` and
``resolved_config``: the engine's resolved ``VllmConfig``) and ``bench/core/validate.py`` (``_bench_latencies``,
``_bench_arrival_ts``: how the timestamps are read). Runs in this layout are committed in that repository
(``bench/examples/<GPU>/<model>/vllm/``) and in swsok/heteropilot (``outputs/phase0_bench/*/vllm/``,
``outputs/a40_envelope_openloop/*/``, ``python -m bench run``).

``requests.jsonl``, one JSON object per request (the replay's request order, which is its send order)::

    request_id      str    "bench-<index>"
    input_toks      int    prompt tokens (the replayed dataset's token ids)
    output_toks     int    output tokens (pinned: min_tokens = max_tokens, ignore_eos)
    arrival_time    float  vLLM frontend arrival, wall-clock epoch seconds (RequestStateStats.arrival_time)
    queued_ts       float  engine-core time the request was queued, seconds (monotonic clock)
    scheduled_ts    float  engine-core time it was first scheduled, seconds (monotonic)
    first_token_ts  float  engine-core time of its first output token, seconds (monotonic)
    last_token_ts   float  engine-core time of its last output token, seconds (monotonic)

A request whose stream returned no metrics has every timestamp null (the runner's record); vLLM leaves a stage it
never reached at its default 0.0. Optional, read where a record has it: ``num_cached_tokens`` (prompt tokens served
from the prefix cache, vLLM's ``RequestOutput.num_cached_tokens``; the LLMServingSim recorder does not write it).

``meta.json`` (same folder, optional): ``schema_version``, ``model``, ``vllm_version``, ``engine_kwargs`` (what was
asked: tensor/data parallel size, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, dtypes, seed),
``dataset_path``/``dataset_hash``, ``num_requests``, ``started_at``/``finished_at`` (ISO 8601 UTC), ``tick_seconds``
and, in newer runs, ``kv_cache`` (``num_gpu_blocks``, ``block_size``, ``num_kv_tokens``, ``gpu_memory_utilization``,
``enable_prefix_caching``), ``hardware`` (device name and memory, CUDA/torch versions) and ``resolved_config`` (the
whole resolved ``VllmConfig``, one key per sub-config). It is kept whole in ``run.summary["meta"]``;
``vllm_version`` is copied to ``run.summary["vllm_version"]`` so ``MeasuredRun.engine`` reports ``vllm-<version>``.

Read (seconds throughout): the arrival anchor is ``arrival_time`` when it is on the engine-core clock (within a day
of ``first_token_ts`` for every request that has both), else ``queued_ts`` — vLLM records ``arrival_time`` on the
wall clock and the rest on the monotonic one, as ``_bench_arrival_ts`` does; ttft_s = first_token_ts − anchor,
e2e_s = last_token_ts − anchor (queueing included, as ``bench validate`` defines them), itl_s None (no per-token
times), tpot_s = (e2e − ttft) / (output − 1); arrival_s = arrival_time rebased to the earliest (the server's own
arrival), rows sorted by it (stable) when every request has one; success = the request reached its first and last
token; cached_tokens = ``num_cached_tokens`` where given, else NaN. Run level: model = meta's ``model``, backend
"vllm", request_rate NaN and max_concurrency None (an open-loop replay; the file records no offered rate),
duration_s = last ``last_token_ts`` − earliest anchor over completed requests (else meta's ``finished_at`` −
``started_at``, else 0).

Checks (each a one-line :class:`MeasuredFormatError` naming file, line, field and request index): the two token
counts are non-negative integers; every timestamp a finite number or null; a stage after an unreached one is an
error, as is a request that reached its first token without its last; the lifecycle never goes backwards —
arrival (when on the engine clock) ≤ queued_ts ≤ scheduled_ts ≤ first_token_ts ≤ last_token_ts; ``meta.json`` a
JSON object.

A leaf module: standard library, numpy and pandas only.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

from traces.measured.parse import (
    as_count,
    as_timestamp,
    fail,
    field_at,
    parse_json_documents,
    read_text,
    show,
    source_name,
)
from traces.measured.schema import MeasuredFormatError, MeasuredRun, build_requests

TOOL = "vllm_requests_jsonl"
FMT_DESC = "a vLLM per-request timestamps requests.jsonl"
REQUESTS_FILE = "requests.jsonl"
META_FILE = "meta.json"
HINT = "expected LLMServingSim bench's input_toks, output_toks and vLLM RequestStateStats timestamps"
# vLLM's lifecycle in order (RequestStateStats); the anchor (arrival or queued) precedes the rest.
STAGES = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
TIMESTAMP_KEYS = ("arrival_time", *STAGES)
COUNT_KEYS = ("input_toks", "output_toks")
CACHED_KEY = "num_cached_tokens"
# Two readings more than this apart are on different clocks (epoch vs monotonic), as bench/core/validate.py decides.
SAME_CLOCK_S = 100_000.0


def read_vllm_requests(path: str | Path) -> MeasuredRun:
    """Read a ``requests.jsonl`` of per-request vLLM timestamps (and ``meta.json`` beside it) into a MeasuredRun.

    Args:
        path: the ``requests.jsonl`` file, or the run folder holding it.

    Returns:
        The run (module docstring for what is read and how; seconds throughout).

    Raises:
        MeasuredFormatError: unreadable file or invalid JSON (either file), a record that is not an object or
            lacks a token count, a bad count or timestamp, timestamps that go backwards, a stage reached after an
            unreached one, a ``meta.json`` that is not a JSON object.
    """
    path = Path(path)
    if path.is_dir():
        path = path / REQUESTS_FILE
    source = source_name(path)
    cut_off: list[str] = []
    documents = parse_json_documents(read_text(path, FMT_DESC), source, FMT_DESC, cut_off)
    if len(documents) == 1 and isinstance(documents[0][1], list):  # a whole-file JSON list of records
        documents = [(documents[0][0], item) for item in documents[0][1]]
    records = [_parse_record(obj, i, f"{source} line {line_no}") for i, (line_no, obj) in enumerate(documents)]
    meta, meta_note = _read_meta(path.parent / META_FILE)

    complete = [r for r in records if r["first"] is not None]
    epoch_arrivals = any(r["arrival"] is not None and abs(r["arrival"] - r["first"]) >= SAME_CLOCK_S for r in complete)
    anchor_key = "queued_ts" if epoch_arrivals or any(r["arrival"] is None for r in complete) else "arrival_time"
    for r in records:
        _check_order(r, anchor_key == "arrival_time")
        anchor = r["queued"] if anchor_key == "queued_ts" else r["arrival"]
        r["anchor"] = anchor
        ok = r["first"] is not None and anchor is not None
        r["ttft"] = r["first"] - anchor if ok else math.nan
        r["e2e"] = r["last"] - anchor if ok else math.nan
        r["success"] = ok

    if records and all(r["arrival"] is not None for r in records):
        records.sort(key=lambda r: r["arrival"])  # stable: the file's order among equal arrivals
    arrivals = [math.nan if r["arrival"] is None else r["arrival"] for r in records]
    cached = [r["cached"] for r in records]
    requests = build_requests(
        [r["prompt"] for r in records],
        [r["output"] for r in records],
        arrivals,
        [r["ttft"] for r in records],
        [r["e2e"] for r in records],
        [None] * len(records),
        [r["success"] for r in records],
        cached_tokens=[math.nan if c is None else c for c in cached] if any(c is not None for c in cached) else None,
        queue_s=[  # TTFT less first scheduled → first token: the wait before the engine core first ran it
            r["ttft"] - (r["first"] - r["scheduled"])
            if r["first"] is not None and r["scheduled"] is not None
            else math.nan
            for r in records
        ],  # fmt: skip
    )

    done = [r for r in records if r["success"]]
    if done:
        duration = max(r["last"] for r in done) - min(r["anchor"] for r in done)
    else:
        duration = _meta_duration(meta)
    notes = [
        *cut_off,
        f"ttft/e2e from the engine's own timestamps, anchored at {anchor_key}"
        + (" (arrival_time is on the wall clock, the rest on the monotonic one)" if epoch_arrivals else ""),
        "itl_s: requests.jsonl has no per-token times (None); request_rate not recorded (NaN)",
        meta_note,
    ]
    failed = len(records) - len(done)
    if failed:
        notes.append(f"{failed} request(s) without a first and last token (failed)")
    summary: dict[str, Any] = {"meta": meta}
    if meta.get("vllm_version") is not None:
        summary["vllm_version"] = meta["vllm_version"]
    model = meta.get("model")
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=math.nan,
        max_concurrency=None,
        duration_s=float(duration),
        model=model if isinstance(model, str) else None,
        backend="vllm",
        num_prompts=len(records),
        summary=summary,
        source_path=source,
        notes=notes,
    )


def _parse_record(obj: Any, index: int, where: str) -> dict[str, Any]:
    """Token counts and timestamps of one record (None for a stage not reached: null or vLLM's 0.0 default)."""
    if not isinstance(obj, dict):
        raise MeasuredFormatError(f"{where}: not {FMT_DESC}: expected a JSON object, got {type(obj).__name__}")
    for key in COUNT_KEYS:
        if key not in obj:
            raise MeasuredFormatError(f"{where}: not {FMT_DESC}: missing '{key}' at index {index} ({HINT})")
    stamps: dict[str, float | None] = {}
    for key in TIMESTAMP_KEYS:
        if key not in obj and key != "arrival_time":
            raise MeasuredFormatError(f"{where}: not {FMT_DESC}: missing '{key}' at index {index} ({HINT})")
        value = obj.get(key)
        stamps[key] = None if value is None or value == 0 else as_timestamp(value, key, index, where, FMT_DESC)
    cached = obj.get(CACHED_KEY)
    record = {
        "index": index,
        "where": where,
        "prompt": as_count(obj["input_toks"], "input_toks", index, where, FMT_DESC),
        "output": as_count(obj["output_toks"], "output_toks", index, where, FMT_DESC),
        "cached": None if cached is None else as_count(cached, CACHED_KEY, index, where, FMT_DESC),
        "arrival": stamps["arrival_time"],
        "queued": stamps["queued_ts"],
        "scheduled": stamps["scheduled_ts"],
        "first": stamps["first_token_ts"],
        "last": stamps["last_token_ts"],
    }
    if record["cached"] is not None and record["cached"] > record["prompt"]:
        raise fail(
            where, FMT_DESC, f"{field_at(CACHED_KEY, index)}: {record['cached']} cached tokens for a prompt of "
            f"{record['prompt']} ('input_toks'); expected at most the prompt",
        )  # fmt: skip
    reached = [stamps[key] is not None for key in STAGES]
    for k in range(1, len(STAGES)):
        if reached[k] and not reached[k - 1]:
            raise fail(
                where, FMT_DESC, f"{field_at(STAGES[k], index)}: set to {stamps[STAGES[k]]!r} while the earlier "
                f"'{STAGES[k - 1]}' is {show(obj.get(STAGES[k - 1]))}; expected the lifecycle in order",
            )  # fmt: skip
    if reached[2] and not reached[3]:
        raise fail(where, FMT_DESC, f"{field_at('last_token_ts', index)}: missing while 'first_token_ts' is set")
    return record


def _check_order(record: dict[str, Any], arrival_on_engine_clock: bool) -> None:
    """Raise unless the request's timestamps never go backwards (module docstring)."""
    slots = dict(zip(TIMESTAMP_KEYS, ("arrival", "queued", "scheduled", "first", "last"), strict=True))
    keys = TIMESTAMP_KEYS if arrival_on_engine_clock else STAGES
    previous: tuple[str, float] | None = None
    for key in keys:
        value = record[slots[key]]
        if value is None:
            continue
        if previous is not None and value < previous[1]:
            raise fail(
                record["where"], FMT_DESC, f"{field_at(key, record['index'])}: {value!r} is before '{previous[0]}' "
                f"{previous[1]!r} (timestamps go backwards); expected {previous[0]} <= {key}",
            )  # fmt: skip
        previous = (key, value)


def _read_meta(path: Path) -> tuple[dict[str, Any], str]:
    """``meta.json`` as a dict ({} when absent) and the note saying which."""
    if not path.exists():
        return {}, f"no {META_FILE} beside the file: engine version and resolved config unknown"
    desc = f"the {META_FILE} of a vLLM requests.jsonl run"
    documents = parse_json_documents(read_text(path, desc), str(path), desc)
    meta = documents[0][1]
    if len(documents) != 1 or not isinstance(meta, dict):
        raise MeasuredFormatError(f"{path}: {desc}: expected one JSON object, got {type(meta).__name__}")
    return meta, f"read {META_FILE}: vLLM {meta.get('vllm_version', '(version not recorded)')}"


def _meta_duration(meta: dict[str, Any]) -> float:
    """``finished_at`` − ``started_at`` of meta.json in seconds, or 0.0 where either is missing or unreadable."""
    try:
        start = datetime.fromisoformat(str(meta["started_at"]).replace("Z", "+00:00"))
        end = datetime.fromisoformat(str(meta["finished_at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return 0.0
    return max((end - start).total_seconds(), 0.0)


def looks_like(obj: Any) -> bool:
    """True for a requests.jsonl record: both token counts and at least one of vLLM's engine-core timestamps."""
    if isinstance(obj, list):
        return bool(obj) and looks_like(obj[0])
    return isinstance(obj, dict) and all(k in obj for k in COUNT_KEYS) and any(k in obj for k in STAGES)


__all__ = ["FMT_DESC", "META_FILE", "REQUESTS_FILE", "TOOL", "looks_like", "read_vllm_requests"]
