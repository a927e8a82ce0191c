"""Reader for Mooncake JSON Lines traces (kvcache-ai/Mooncake `FAST25-release/traces/*.jsonl`).

Format: one JSON object per line, e.g.
`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}` with

- `timestamp`: number >= 0, milliseconds since the trace start (quantised to ~3 s steps in the Kimi traces),
- `input_length`: integer >= 1, prompt tokens,
- `output_length`: integer >= 0, output tokens,
- `hash_ids` (optional): list of int, remapped prefix-block hashes (512 tokens per block in Mooncake), kept
  as the `hash_ids` column; `df.attrs["hash_block_tokens"]` = 512 says how many tokens each id covers (the
  simulator's prefix cache, sim/serving/prefix.py, reads it).

Other keys are ignored. Blank lines are skipped and counted. Every other malformed line raises `TraceError`
naming the file, the 1-based line number and the field; no row is dropped or repaired silently.

Hot path: the whole file is read once in binary mode, each line goes through `json.loads`, the columns are
built as python lists and turned into one DataFrame at the end (the shipped 5,719 lines load in ~0.1 s,
mostly `json.loads` of the `hash_ids` lists).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.schema import REQUEST_COLUMNS, TraceError

HASH_BLOCK_TOKENS = 512  # tokens per hash block in Mooncake's traces (FAST'25 release README)

_MS_PER_S = 1000.0
_MAX_SHOWN_CHARS = 60  # longest repr of an offending value quoted in an error message
_INT64_LIMIT = 2**63  # token counts must fit the int64 columns


def read_mooncake(path: str | Path) -> pd.DataFrame:
    """Read a Mooncake JSONL trace into a request table (see `traces.schema`).

    Args:
        path: the `.jsonl` file.

    Returns:
        DataFrame with `REQUEST_COLUMNS`, one row per non-blank line, sorted stably by `arrival_s`:
        `request_id` int64 = 0-based position in the file (so it still names the source row after sorting),
        `arrival_s` float64 = `timestamp` / 1000, `prompt_tokens` int64 = `input_length`, `output_tokens`
        int64 = `output_length`, `hash_ids` list of int per row (`[]` where the key is absent).
        `df.attrs`: `source` (str(path)), `num_blank_lines` (skipped blank lines), `num_resorted` (rows whose
        timestamp was earlier than some row above them in the file, i.e. rows that sorting moved; 0 for the
        shipped traces).

    Raises:
        TraceError: if the file cannot be read, holds no request, or a line is not valid JSON, is not an
            object, lacks `timestamp`/`input_length`/`output_length`, has a negative, non-numeric, bool or
            (for token counts) fractional value, or has a `hash_ids` that is not a list of int.
    """
    source = str(path)
    lines = _read_lines(path)
    arrival_s: list[float] = []
    prompt_tokens: list[int] = []
    output_tokens: list[int] = []
    hash_ids: list[list[int]] = []
    num_blank_lines = 0
    for line_no, raw in enumerate(lines, start=1):
        if not raw.strip():
            num_blank_lines += 1
            continue
        timestamp_ms, num_prompt, num_output, ids = _parse_line(raw, source, line_no)
        arrival_s.append(timestamp_ms / _MS_PER_S)
        prompt_tokens.append(num_prompt)
        output_tokens.append(num_output)
        hash_ids.append(ids)
    if not arrival_s:
        raise TraceError(f"{source}: no requests ({len(lines)} lines, all blank); expected one JSON object per line")
    return _build_frame(arrival_s, prompt_tokens, output_tokens, hash_ids, source, num_blank_lines)


def _read_lines(path: str | Path) -> list[bytes]:
    """All lines of `path` as bytes (json.loads decodes UTF-8 itself, so line numbers stay exact)."""
    try:
        with open(path, "rb") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read trace file ({e.strerror or e})") from None


def _parse_line(raw: bytes, source: str, line_no: int) -> tuple[float, int, int, list[int]]:
    """Parse one non-blank line into (timestamp_ms, prompt_tokens, output_tokens, hash_ids)."""
    where = f"{source} line {line_no}"
    try:
        row = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
        raise TraceError(f"{where}: invalid JSON ({e}); expected one JSON object per line") from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(row).__name__} {_show(row)}")
    timestamp_ms = _timestamp_ms(_field(row, "timestamp", where), where)
    num_prompt = _count(_field(row, "input_length", where), "input_length", 1, "an integer >= 1", where)
    num_output = _count(_field(row, "output_length", where), "output_length", 0, "a non-negative integer", where)
    ids = row.get("hash_ids", [])
    if type(ids) is not list or not all(type(h) is int for h in ids):
        raise TraceError(f"{where}: field 'hash_ids': expected a list of integers, got {_show(ids)}")
    return timestamp_ms, num_prompt, num_output, ids


def _field(row: dict[str, Any], name: str, where: str) -> Any:
    """`row[name]`, or a TraceError naming the missing field."""
    try:
        return row[name]
    except KeyError:
        raise TraceError(f"{where}: field '{name}': missing; keys present: {sorted(row)}") from None


def _timestamp_ms(value: Any, where: str) -> float:
    """Validate a `timestamp` (ms since trace start): finite int or float >= 0."""
    if type(value) in (int, float) and math.isfinite(value) and value >= 0:
        return float(value)
    raise TraceError(f"{where}: field 'timestamp': expected a non-negative number (milliseconds), got {_show(value)}")


def _count(value: Any, name: str, minimum: int, expected: str, where: str) -> int:
    """Validate a token count: an int (or an integral float such as 12.0) >= `minimum`; bool is rejected."""
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and minimum <= value < _INT64_LIMIT:
        return value
    raise TraceError(f"{where}: field '{name}': expected {expected}, got {_show(value)}")


def _show(value: Any) -> str:
    """Short repr of an offending value for an error message."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN_CHARS else text[: _MAX_SHOWN_CHARS - 3] + "..."


def _build_frame(
    arrival_s: list[float],
    prompt_tokens: list[int],
    output_tokens: list[int],
    hash_ids: list[list[int]],
    source: str,
    num_blank_lines: int,
) -> pd.DataFrame:
    """Assemble the request table, sorting stably by arrival and recording what sorting moved."""
    arrivals = np.asarray(arrival_s, dtype=np.float64)
    n = len(arrivals)
    running_max = np.maximum.accumulate(arrivals)
    num_resorted = int(np.count_nonzero(arrivals[1:] < running_max[:-1]))
    columns: dict[str, Any] = {
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": arrivals,
        "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
        "output_tokens": np.asarray(output_tokens, dtype=np.int64),
        "hash_ids": pd.Series(hash_ids, dtype=object),
    }
    df = pd.DataFrame(columns, columns=REQUEST_COLUMNS)
    if num_resorted:
        order = np.argsort(arrivals, kind="stable")
        df = df.iloc[order].reset_index(drop=True)
    df.attrs["source"] = source
    df.attrs["num_blank_lines"] = num_blank_lines
    df.attrs["num_resorted"] = num_resorted
    df.attrs["hash_block_tokens"] = HASH_BLOCK_TOKENS
    return df
