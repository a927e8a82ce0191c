"""Reader for per-iteration ``ForwardPassMetrics`` (one record per scheduler iteration) into an :class:`IterationRun`.

Source of the format: the ``ForwardPassMetrics`` msgspec struct, defined identically (field for field) by NVIDIA
Dynamo for vLLM, ai-dynamo/dynamo ``components/src/dynamo/common/forward_pass_metrics.py`` (published per iteration
by its ``InstrumentedScheduler``; consumer ``components/src/dynamo/common/recv_forward_pass_metrics.py``), and by
SGLang, sgl-project/sglang ``python/sglang/srt/observability/forward_pass_metrics.py`` (``_FpmPublisherThread``,
filled by ``SchedulerMetricsMixin._emit_forward_pass_metrics``, enabled with ``--forward-pass-metrics-port``). Read at
sglang e861116ea4051e42983d13ce255111cd2c059fc1 and 48ccb9a4b9e8864b6d8e69363b2094e36b7e204f, dynamo
327e70f4b436ac6ff9c038d9e0e513c259b5fe86 and 16487d648608ca2ab7eaa71e852cf57ca24393ed. Fields::

    version         int    schema version, 1 (absent in the first release of the struct)
    worker_id       str    the engine instance
    dp_rank         int    data-parallel rank (each has its own scheduler)
    counter_id      int    sequence number per (worker_id, dp_rank) (absent in the first release)
    wall_time       float  seconds of this iteration (Dynamo vLLM: schedule() to update_from_output(); SGLang: the
                           forward's GPU time where its DeviceTimer is on, else the monotonic clock); 0.0 for an
                           idle heartbeat
    scheduled_requests:    the batch of this iteration
      num_prefill_requests   int    prefill requests (new and chunked-prefill continuations)
      sum_prefill_tokens     int    tokens computed for them this iteration (a chunk's size; cached tokens excluded)
      var_prefill_length     float  population variance of their whole prompt lengths (not chunk sizes), tokens²
      sum_prefill_kv_tokens  int    KV tokens they read without computing (prefix-cache hits, earlier chunks)
      num_decode_requests    int    decode requests (one new token each)
      sum_decode_kv_tokens   int    KV context of the decode requests, summed (prompt + tokens generated so far)
      var_decode_kv_tokens   float  population variance of that context over the decode requests, tokens²
    queued_requests:       the waiting queue (num_prefill_requests, sum_prefill_tokens, var_prefill_length,
                           num_decode_requests = preempted requests, sum_decode_kv_tokens, var_decode_kv_tokens)

The emitters send msgpack over ZMQ PUB (multipart: topic, 8-byte sequence, payload) and say nothing about files, so
a file holds the records as a consumer writes them. Accepted, one shape per file:

- JSON lines, one record a line — msgspec's JSON encoding of the struct (``msgspec.json.encode(metrics)``: every
  field, nested objects as above); a whole-file JSON list of records also works;
- the same with each record under ``"metrics"`` in a receiver's envelope (``{"metrics": {...}, ...}``, its other
  keys — a receive time, a transport sequence — ignored);
- the console output of Dynamo's consumer ``python -m dynamo.common.recv_forward_pass_metrics``: per record a line
  ``[worker=W dp=D counter=C] `` followed by the record as indented JSON.

The records do not name the engine; pass ``engine`` (``"sglang"``, ``"vllm"``, with a version where known).

Read: idle heartbeats (wall_time 0 and nothing scheduled) and iterations that scheduled no request are skipped and
counted in ``notes``; records missing ``sum_prefill_kv_tokens`` or a variance (older or third-party writers) read
them as 0 / NaN, with a note. Checks (each a one-line :class:`MeasuredFormatError` naming file, line, field and
record index): ``wall_time`` and ``scheduled_requests`` present, wall_time finite and ≥ 0 and > 0 for an iteration
that scheduled requests; counts non-negative integers; variances finite and ≥ 0; a side with no requests has no
tokens and a side with requests has at least one token per request; ``version`` 1 where given.

A leaf module: standard library, numpy and pandas only.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.measured.parse import as_count, as_seconds, fail, field_at, read_text, show, source_name
from traces.measured.schema import MeasuredFormatError

TOOL = "forward_pass_metrics"
FMT_DESC = "a ForwardPassMetrics file (one record per scheduler iteration)"
HINT = "expected SGLang's or Dynamo's ForwardPassMetrics: wall_time and scheduled_requests"
FPM_VERSION = 1
# Dynamo's recv_forward_pass_metrics prints `[worker=<id> dp=<rank> counter=<n>] ` before each record's JSON.
RECV_HEADER = re.compile(r"^\[worker=(?P<worker>.*?) dp=(?P<dp>-?\d+) counter=(?P<counter>-?\d+)\] ?(?P<rest>.*)$")
KINDS = ("decode_only", "mixed", "prefill_only")

ITERATION_COLUMNS: list[str] = [
    "iteration",
    "kind",
    "worker_id",
    "dp_rank",
    "counter_id",
    "wall_time_s",
    "num_prefill_requests",
    "num_prefill_tokens",
    "sum_prefill_kv_tokens",
    "var_prefill_length",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
    "queued_prefill_requests",
    "queued_prefill_tokens",
    "queued_decode_requests",
]


@dataclass
class IterationRun:
    """Per-iteration records of a real serving engine's scheduler (one forward pass each).

    ``iterations``, one row per iteration that scheduled work, columns :data:`ITERATION_COLUMNS`:

    | column | dtype | unit / meaning |
    |---|---|---|
    | ``iteration`` | int64 | 0..n-1 in the file's order (heartbeats and empty iterations left out) |
    | ``kind`` | object | "decode_only", "mixed" (prefill chunks and decodes in one forward) or "prefill_only" |
    | ``worker_id`` | object | the engine instance (str) |
    | ``dp_rank`` | int64 | data-parallel rank |
    | ``counter_id`` | Int64 | the emitter's sequence number per (worker, rank); <NA> where the record has none |
    | ``wall_time_s`` | float64 | seconds the iteration took (source's ``wall_time``) |
    | ``num_prefill_requests`` | int64 | prefill requests in the forward |
    | ``num_prefill_tokens`` | int64 | tokens computed for them (``sum_prefill_tokens``) |
    | ``sum_prefill_kv_tokens`` | int64 | KV tokens they read without computing (prefix hits, earlier chunks) |
    | ``var_prefill_length`` | float64 | variance of their whole prompt lengths, tokens²; NaN where not recorded |
    | ``num_decode_requests`` | int64 | decode requests (one token each) |
    | ``sum_decode_kv_tokens`` | int64 | context tokens the decode requests attend over, summed |
    | ``var_decode_kv_tokens`` | float64 | variance of that context per decode request, tokens²; NaN where absent |
    | ``queued_prefill_requests`` | int64 | requests waiting for prefill after the iteration was scheduled |
    | ``queued_prefill_tokens`` | int64 | their prompt tokens |
    | ``queued_decode_requests`` | int64 | preempted requests waiting to resume |

    ``source_path``: the file; ``tool``: :data:`TOOL`; ``notes``: what reading chose or skipped; ``engine``: the
    engine as the caller named it (``sglang``, ``vllm-0.11.0``), None when not given — the records do not say.
    """

    iterations: pd.DataFrame
    source_path: str
    tool: str = TOOL
    notes: list[str] = field(default_factory=list)
    engine: str | None = None


def read_forward_pass_metrics(path: str | Path, engine: str | None = None) -> IterationRun:
    """Read ForwardPassMetrics records (module docstring for the accepted shapes) into an :class:`IterationRun`.

    Args:
        path: the file.
        engine: the engine that emitted them, as ``NAME`` or ``NAME-VERSION`` (kept in ``IterationRun.engine``).

    Raises:
        MeasuredFormatError: unreadable file, invalid JSON, a record missing ``wall_time`` or
            ``scheduled_requests`` or a request count, a bad value (module docstring), no record at all.
    """
    source = source_name(path)
    text = read_text(path, FMT_DESC)
    records = _records(text, source)
    rows: list[dict[str, Any]] = []
    heartbeats = empty = 0
    defaulted: set[str] = set()
    for index, (where, obj) in enumerate(records):
        row = _parse_record(obj, index, where, defaulted)
        if row["num_prefill_requests"] or row["num_decode_requests"]:
            rows.append(row)
        elif row["wall_time_s"] == 0:
            heartbeats += 1
        else:
            empty += 1
    if not records:
        raise MeasuredFormatError(f"{source}: not {FMT_DESC}: no record found ({HINT})")
    table = _table(rows)
    notes = [f"read {len(rows)} iteration(s) of {len(records)} record(s)"]
    if heartbeats:
        notes.append(f"skipped {heartbeats} idle heartbeat(s) (wall_time 0, nothing scheduled)")
    if empty:
        notes.append(f"skipped {empty} iteration(s) that scheduled no request")
    if defaulted:
        notes.append(f"not recorded, read as 0 (counts) or NaN (variances): {', '.join(sorted(defaulted))}")
    if len(table) and table["counter_id"].isna().all():
        notes.append("no counter_id (the struct's first release): iteration order is the file's")
    return IterationRun(iterations=table, source_path=source, notes=notes, engine=engine)


def _records(text: str, source: str) -> list[tuple[str, Any]]:
    """(where, record object) per record: JSON lines, a JSON list, or Dynamo's recv console output."""
    lines = text.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if RECV_HEADER.match(first.strip()):
        return _recv_records(lines, source)
    stripped = text.strip()
    if not stripped:
        raise MeasuredFormatError(f"{source}: {FMT_DESC}: empty file")
    try:
        whole = json.loads(stripped)
    except ValueError:
        pass
    else:
        if isinstance(whole, list):
            return [(f"{source} item {i}", _unwrap(obj)) for i, obj in enumerate(whole)]
        filled = [n for n, line in enumerate(lines, start=1) if line.strip()]
        return [(f"{source} line {filled[0]}" if len(filled) == 1 else source, _unwrap(whole))]
    out = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise MeasuredFormatError(f"{source} line {line_no}: {FMT_DESC}: invalid JSON ({e})") from None
        out.append((f"{source} line {line_no}", _unwrap(obj)))
    return out


def _recv_records(lines: list[str], source: str) -> list[tuple[str, Any]]:
    """Records of ``recv_forward_pass_metrics``'s output: a ``[worker=.. dp=.. counter=..]`` line opens each."""
    out: list[tuple[str, Any]] = []
    start, chunk = 0, []

    def flush() -> None:
        if not chunk:
            return
        where = f"{source} line {start}"
        try:
            out.append((where, json.loads("\n".join(chunk))))
        except ValueError as e:
            raise MeasuredFormatError(
                f"{where}: {FMT_DESC}: invalid JSON after the [worker=...] header ({e})"
            ) from None

    for line_no, line in enumerate(lines, start=1):
        header = RECV_HEADER.match(line.strip())
        if header:
            flush()
            start, chunk = line_no, [header["rest"]]
        elif line.strip():
            chunk.append(line)
    flush()
    return out


def _unwrap(obj: Any) -> Any:
    """The record inside a receiver's envelope ``{"metrics": {...}}``, else the object itself."""
    if isinstance(obj, dict) and "wall_time" not in obj and isinstance(obj.get("metrics"), dict):
        return obj["metrics"]
    return obj


def _parse_record(obj: Any, index: int, where: str, defaulted: set[str]) -> dict[str, Any]:
    """One record's row (its checks: module docstring); ``defaulted`` collects the optional fields it lacked."""
    if not isinstance(obj, dict):
        raise MeasuredFormatError(f"{where}: not {FMT_DESC}: expected a JSON object, got {type(obj).__name__}")
    for key in ("wall_time", "scheduled_requests"):
        if key not in obj:
            raise MeasuredFormatError(f"{where}: not {FMT_DESC}: missing '{key}' at index {index} ({HINT})")
    version = obj.get("version", FPM_VERSION)
    if version != FPM_VERSION or type(version) is not int:
        raise fail(where, FMT_DESC, f"{field_at('version', index)}: unsupported version {show(version)}; expected 1")
    wall = as_seconds(obj["wall_time"], "wall_time", index, where, FMT_DESC)
    scheduled = _section(obj, "scheduled_requests", index, where)
    queued = _section(obj, "queued_requests", index, where, required=False)

    def count(section: dict[str, Any], name: str, prefix: str, required: bool = True) -> int:
        label = f"{prefix}.{name}"
        if name not in section:
            if required:
                raise MeasuredFormatError(f"{where}: not {FMT_DESC}: missing '{label}' at index {index} ({HINT})")
            if section:
                defaulted.add(label)
            return 0
        return as_count(section[name], label, index, where, FMT_DESC)

    def variance(section: dict[str, Any], name: str, prefix: str) -> float:
        label = f"{prefix}.{name}"
        if name not in section:
            defaulted.add(label)
            return math.nan
        value = section[name]
        if type(value) in (int, float) and math.isfinite(value) and value >= 0:
            return float(value)
        raise fail(where, FMT_DESC, f"{field_at(label, index)}: expected a non-negative variance, got {show(value)}")

    s = "scheduled_requests"
    counter = as_count(obj["counter_id"], "counter_id", index, where, FMT_DESC) if "counter_id" in obj else None
    row = {
        "worker_id": str(obj.get("worker_id", "")),
        "dp_rank": as_count(obj.get("dp_rank", 0), "dp_rank", index, where, FMT_DESC),
        "counter_id": counter,
        "wall_time_s": wall,
        "num_prefill_requests": count(scheduled, "num_prefill_requests", s),
        "num_prefill_tokens": count(scheduled, "sum_prefill_tokens", s),
        "sum_prefill_kv_tokens": count(scheduled, "sum_prefill_kv_tokens", s, required=False),
        "var_prefill_length": variance(scheduled, "var_prefill_length", s),
        "num_decode_requests": count(scheduled, "num_decode_requests", s),
        "sum_decode_kv_tokens": count(scheduled, "sum_decode_kv_tokens", s),
        "var_decode_kv_tokens": variance(scheduled, "var_decode_kv_tokens", s),
        "queued_prefill_requests": count(queued, "num_prefill_requests", "queued_requests", required=False),
        "queued_prefill_tokens": count(queued, "sum_prefill_tokens", "queued_requests", required=False),
        "queued_decode_requests": count(queued, "num_decode_requests", "queued_requests", required=False),
    }  # fmt: skip
    for side, tokens, key in (
        ("prefill", "num_prefill_tokens", "sum_prefill_tokens"),
        ("decode", "sum_decode_kv_tokens", "sum_decode_kv_tokens"),
    ):
        requests, label = row[f"num_{side}_requests"], f"{s}.{key}"
        if requests == 0 and row[tokens]:
            raise fail(where, FMT_DESC, f"{field_at(label, index)}: {row[tokens]} token(s) for 0 {side} requests")
        if row[tokens] < requests:
            raise fail(
                where, FMT_DESC, f"{field_at(label, index)}: {row[tokens]} token(s) for {requests} {side} request(s); "
                "expected at least one per request",
            )  # fmt: skip
    if row["num_prefill_requests"] == 0 and row["sum_prefill_kv_tokens"]:
        label = f"{s}.sum_prefill_kv_tokens"
        raise fail(
            where, FMT_DESC, f"{field_at(label, index)}: {row['sum_prefill_kv_tokens']} token(s) for 0 prefill requests"
        )
    busy = row["num_prefill_requests"] + row["num_decode_requests"]
    if busy and wall == 0:
        raise fail(
            where, FMT_DESC, f"{field_at('wall_time', index)}: 0 seconds for an iteration that scheduled {busy} "
            "request(s); expected > 0",
        )  # fmt: skip
    return row


def _section(obj: dict[str, Any], key: str, index: int, where: str, required: bool = True) -> dict[str, Any]:
    value = obj.get(key, None if required else {})
    if isinstance(value, dict):
        return value
    raise fail(where, FMT_DESC, f"{field_at(key, index)}: expected an object of request metrics, got {show(value)}")


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The iteration table (:data:`ITERATION_COLUMNS`) from parsed rows."""
    n = len(rows)
    ints = [c for c in ITERATION_COLUMNS if c.startswith(("num_", "sum_", "queued_")) or c == "dp_rank"]
    columns: dict[str, Any] = {c: np.array([r[c] for r in rows], dtype=np.int64) for c in ints}
    for c in ("wall_time_s", "var_prefill_length", "var_decode_kv_tokens"):
        columns[c] = np.array([r[c] for r in rows], dtype=np.float64)
    columns["iteration"] = np.arange(n, dtype=np.int64)
    columns["worker_id"] = pd.Series([r["worker_id"] for r in rows], dtype=object)
    columns["counter_id"] = pd.array([r["counter_id"] for r in rows], dtype="Int64")
    prefill, decode = columns["num_prefill_requests"] > 0, columns["num_decode_requests"] > 0
    columns["kind"] = pd.Series(
        np.where(prefill & decode, "mixed", np.where(prefill, "prefill_only", "decode_only")), dtype=object
    )
    return pd.DataFrame(columns, columns=ITERATION_COLUMNS)


def looks_like(obj: Any) -> bool:
    """True for a ForwardPassMetrics record (or a list of them, or one under ``"metrics"``): ``wall_time`` and a
    ``scheduled_requests`` object."""
    if isinstance(obj, list):
        return bool(obj) and looks_like(obj[0])
    obj = _unwrap(obj)
    return isinstance(obj, dict) and "wall_time" in obj and isinstance(obj.get("scheduled_requests"), dict)


def looks_like_text(text: str) -> bool:
    """True for a file of ForwardPassMetrics in any accepted shape, judged by its first record (never raises)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if RECV_HEADER.match(first):
        return True
    for candidate in (text.strip(), first):
        try:
            return looks_like(json.loads(candidate))
        except (ValueError, RecursionError):  # not JSON, or nested past the parser (the run readers say which)
            continue
    return False


__all__ = [
    "FMT_DESC",
    "ITERATION_COLUMNS",
    "KINDS",
    "TOOL",
    "IterationRun",
    "looks_like",
    "looks_like_text",
    "read_forward_pass_metrics",
]
