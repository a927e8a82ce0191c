"""Shipped traces, name/path resolution, format dispatch and the summary statistics of a request table.

A scenario names its trace as either a shipped name (a key of `SHIPPED_TRACES`, a file or folder under
`DATA_DIR`) or a path to a trace file (or, for session traces, a folder of session files). `load_trace`
resolves it and picks the reader from `fmt`, or for "auto" from the shipped entry, the file's extension and a
look at its first line (`detect_format`). `trace_stats` computes the numbers of `traces/data/README.md` (numpy
linear-interpolation percentiles over requests; rate = rows / (last - first arrival); 8K = 8,192, 32K = 32,768
and 128K = 131,072 prompt tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.azure import read_azure
from traces.burstgpt import read_burstgpt
from traces.generic import ColumnMap, read_csv_trace, read_jsonl_trace
from traces.kvcache_tester import read_kvcache_tester
from traces.mooncake import read_mooncake
from traces.ragpulse import read_ragpulse
from traces.schema import TraceError, is_session_table, require_request_columns

DATA_DIR: Path = Path(__file__).parent / "data"

SHIPPED_TRACES: dict[str, str] = {  # name -> file (or folder) under DATA_DIR
    "mooncake_conversation": "mooncake_conversation.jsonl",
    "azure_code_2023": "azure_code_2023.csv",
    "azure_conv_2023": "azure_conv_2023.csv",
    "ragpulse_week1": "ragpulse/0_trace.jsonl",
    "claude_code_sessions": "kvcache_tester_claude_code",
}
SHIPPED_FORMATS: dict[str, str] = {
    "mooncake_conversation": "mooncake",
    "azure_code_2023": "azure",
    "azure_conv_2023": "azure",
    "ragpulse_week1": "ragpulse",
    "claude_code_sessions": "kvcache_tester",
}

FORMATS: tuple[str, ...] = ("mooncake", "azure", "ragpulse", "kvcache_tester", "burstgpt", "csv", "jsonl")
GENERIC_FORMATS: tuple[str, ...] = ("csv", "jsonl")  # need a column mapping
_AZURE_HEADER = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
_BURSTGPT_HEADER = {"Timestamp", "Request tokens", "Response tokens"}

_PROMPT_8K_TOKENS = 8192
_PROMPT_32K_TOKENS = 32768
_PROMPT_128K_TOKENS = 131072
_PERCENTILES = (50, 90, 99)


def resolve_trace(name_or_path: str) -> Path:
    """Turn a shipped trace name or a path into the path of an existing trace file or session folder.

    A shipped name wins over a file of the same name in the working directory.

    Args:
        name_or_path: a key of `SHIPPED_TRACES` (e.g. "mooncake_conversation") or a path to a trace file (or a
            folder of session files).

    Returns:
        Path of the trace file or folder.

    Raises:
        TraceError: if it is neither a shipped name nor an existing file or folder (the message lists the shipped
            names), or a shipped file is missing from the installation.
    """
    if name_or_path in SHIPPED_TRACES:
        path = DATA_DIR / SHIPPED_TRACES[name_or_path]
        if not path.exists():
            raise TraceError(f"shipped trace '{name_or_path}' is missing its file {path}; reinstall pulseinfer")
        return path
    path = Path(name_or_path)
    if path.is_file() or path.is_dir():
        return path
    raise TraceError(
        f"no such trace file or shipped trace name {str(name_or_path)!r} (shipped: {', '.join(SHIPPED_TRACES)})"
    )


def load_trace(
    name_or_path: str,
    fmt: str = "auto",
    *,
    columns: ColumnMap | Mapping[str, str] | None = None,
    week: int | None = None,
) -> pd.DataFrame:
    """Resolve a trace and read it into a request table (`traces.schema`).

    Args:
        name_or_path: shipped trace name or path (see `resolve_trace`).
        fmt: "auto" or one of `FORMATS`: "mooncake", "azure", "ragpulse", "kvcache_tester" (agentic sessions),
            "burstgpt", or the generic "csv" / "jsonl" (these need `columns`). "auto" uses the shipped entry's
            format, else `detect_format` (with `columns`: csv for `.csv`, jsonl for `.jsonl` / `.json`).
        columns: column mapping for the generic readers, a `ColumnMap` or a mapping with its fields (`arrival`,
            `arrival_unit`, `prompt_tokens`, `output_tokens`).
        week: RAGPulse only: which week of a multi-week file.

    Returns:
        The request table from the reader, with its `df.attrs` (`format` among them).

    Raises:
        TraceError: unknown `fmt`; `columns` with a non-generic format or a bad mapping; csv/jsonl without
            `columns`; `week` with a format other than ragpulse; "auto" cannot tell the format; the trace cannot
            be resolved; or the reader rejects the file.
    """
    mapping = _check_format_options(fmt, columns)
    path = resolve_trace(name_or_path)
    if fmt == "auto":
        fmt = _auto_format(name_or_path, path, mapping)
    if week is not None and fmt != "ragpulse":
        raise TraceError(f"week applies to RAGPulse traces (format ragpulse), not to format {fmt!r}")
    return _read_trace(path, fmt, mapping, week)


def _check_format_options(fmt: str, columns: ColumnMap | Mapping[str, Any] | None) -> ColumnMap | None:
    """The column mapping as a `ColumnMap` (or None), after checking `fmt` and that the two go together."""
    if fmt != "auto" and fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(['auto', *FORMATS])}")
    mapping = _column_map(columns)
    if mapping is not None and fmt not in ("auto", *GENERIC_FORMATS):
        raise TraceError(f"a column mapping applies to the generic formats csv and jsonl, not to format {fmt!r}")
    return mapping


def _auto_format(name_or_path: str, path: Path, mapping: ColumnMap | None) -> str:
    """The format "auto" stands for: generic by extension with a mapping, else the shipped entry's, else detected."""
    if mapping is not None:
        return _generic_format(path)
    if name_or_path in SHIPPED_FORMATS:
        return SHIPPED_FORMATS[name_or_path]
    return detect_format(path)


def _read_trace(path: Path, fmt: str, mapping: ColumnMap | None, week: int | None) -> pd.DataFrame:
    """Run the reader of `fmt` (not "auto") on `path`; `attrs["format"]` set where the reader does not set it."""
    if fmt in GENERIC_FORMATS:
        if mapping is None:
            raise TraceError(
                f"format {fmt} needs a column mapping: arrival, arrival_unit (s, ms, us, datetime), prompt_tokens, "
                "output_tokens (scenario workload.columns, or trace stats --columns)"
            )
        reader = read_csv_trace if fmt == "csv" else read_jsonl_trace
        return reader(path, mapping)
    if fmt == "ragpulse":
        return read_ragpulse(path, week)
    if path.is_dir() and fmt != "kvcache_tester":
        raise TraceError(f"{path}: is a folder; format {fmt} reads one file (a folder holds kvcache_tester sessions)")
    readers = {
        "mooncake": read_mooncake,
        "azure": read_azure,
        "burstgpt": read_burstgpt,
        "kvcache_tester": read_kvcache_tester,
    }
    df = readers[fmt](path)
    df.attrs.setdefault("format", fmt)
    return df


def detect_format(path: Path) -> str:
    """Guess the format of a trace file or folder.

    A folder or a `.json` file is kvcache_tester sessions; a `.jsonl` file is ragpulse when its first object has a
    string `timestamp` or an object `hash_ids`, else mooncake; a `.csv` file is azure or burstgpt by its header.

    Raises:
        TraceError: if the extension or the CSV header fits no known format (the message says how to choose).
    """
    if path.is_dir():
        return "kvcache_tester"
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "kvcache_tester"
    if suffix == ".jsonl":
        first = _first_line(path)
        try:
            obj = json.loads(first) if first else None
        except ValueError:
            return "mooncake"  # let the reader report the bad line
        if isinstance(obj, dict) and (isinstance(obj.get("timestamp"), str) or isinstance(obj.get("hash_ids"), dict)):
            return "ragpulse"
        return "mooncake"
    if suffix == ".csv":
        header = {cell.strip().strip('"') for cell in _first_line(path).decode("utf-8-sig", "replace").split(",")}
        if _AZURE_HEADER <= header:
            return "azure"
        if _BURSTGPT_HEADER <= header:
            return "burstgpt"
        raise TraceError(
            f"{path}: cannot tell the CSV format from its header {sorted(header)} (azure: "
            f"{', '.join(sorted(_AZURE_HEADER))}; burstgpt: {', '.join(sorted(_BURSTGPT_HEADER))}); give a column "
            "mapping (format csv) or the format"
        )
    raise TraceError(
        f"{path}: cannot tell the trace format from extension {suffix!r} (known: .jsonl -> mooncake or ragpulse, "
        f".csv -> azure or burstgpt, .json or a folder -> kvcache_tester); pass fmt= one of {', '.join(FORMATS)}"
    )


def _first_line(path: Path) -> bytes:
    """The first non-blank line of a file (b"" if none or unreadable: the reader then reports the problem)."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    return line.strip()
    except OSError:
        pass
    return b""


def _generic_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    raise TraceError(
        f"{path}: cannot tell csv from jsonl by extension {suffix!r}; pass the format (csv or jsonl) with the columns"
    )


def _column_map(columns: ColumnMap | Mapping[str, Any] | None) -> ColumnMap | None:
    if columns is None or isinstance(columns, ColumnMap):
        return columns
    known = ("arrival", "arrival_unit", "prompt_tokens", "output_tokens")
    unknown = sorted(set(columns) - set(known))
    missing = [k for k in ("arrival", "prompt_tokens", "output_tokens") if k not in columns]
    if unknown or missing:
        problem = f"unknown keys {unknown}" if unknown else f"missing keys {missing}"
        raise TraceError(f"column mapping: {problem}; expected {', '.join(known)} (arrival_unit defaults to s)")
    try:
        return ColumnMap(**dict(columns))
    except ValueError as e:
        raise TraceError(f"column mapping: {e}") from None


def trace_stats(df: pd.DataFrame) -> dict[str, float]:
    """Summary statistics of a request table, as in `traces/data/README.md`.

    Args:
        df: request table (`traces.schema`), non-empty.

    Returns:
        Plain python numbers: `rows`; `span_s` (last - first arrival, s); `rate_per_s` (rows / span_s, NaN
        when the span is 0); `prompt_tokens_{mean,p50,p90,p99,max}` and `output_tokens_{mean,p50,p90,p99,max}`
        (numpy linear-interpolation percentiles); `share_prompt_over_8k`, `share_prompt_over_32k` and
        `share_prompt_over_128k` (fractions in [0, 1] of rows with prompt_tokens > 8,192, > 32,768 and > 131,072).
        A session table (`is_session_table`) has no shared clock: `span_s` and `rate_per_s` are NaN and it adds
        `num_sessions`, `requests_per_session_p50`, `session_span_s_p50` (median of last - first request time
        per session) and, with an `agent_id` column, `num_subagent_requests`.

    Raises:
        TypeError: if `df` is not a DataFrame.
        ValueError: if `df` lacks request columns or has no rows.
    """
    require_request_columns(df)
    if df.empty:
        raise ValueError("df has no rows; trace_stats needs a non-empty request table")
    arrivals = df["arrival_s"].to_numpy(dtype=np.float64)
    sessions = is_session_table(df)
    span_s = float("nan") if sessions else float(arrivals.max() - arrivals.min())
    prompt = df["prompt_tokens"].to_numpy(dtype=np.float64)
    stats: dict[str, float] = {
        "rows": len(df),
        "span_s": span_s,
        "rate_per_s": len(df) / span_s if span_s > 0 else float("nan"),
    }
    for column in ("prompt_tokens", "output_tokens"):
        values = df[column].to_numpy(dtype=np.float64)
        stats[f"{column}_mean"] = float(values.mean())
        for q in _PERCENTILES:
            stats[f"{column}_p{q}"] = float(np.percentile(values, q))
        stats[f"{column}_max"] = int(values.max())
    stats["share_prompt_over_8k"] = float(np.mean(prompt > _PROMPT_8K_TOKENS))
    stats["share_prompt_over_32k"] = float(np.mean(prompt > _PROMPT_32K_TOKENS))
    stats["share_prompt_over_128k"] = float(np.mean(prompt > _PROMPT_128K_TOKENS))
    if sessions:
        groups = df.groupby("session_id", sort=False)["arrival_s"]
        stats["num_sessions"] = int(groups.ngroups)
        stats["requests_per_session_p50"] = float(np.median(groups.size().to_numpy()))
        stats["session_span_s_p50"] = float(np.median((groups.max() - groups.min()).to_numpy()))
        if "agent_id" in df.columns:
            stats["num_subagent_requests"] = int((df["agent_id"] != "").sum())
    return stats


def trace_notes(df: pd.DataFrame) -> list[str]:
    """One-line notes on what reading and shaping did to a request table (from `df.attrs`): rows sorted,
    blank lines, failed or skipped rows, weeks, clock origin, rows dropped or capped by shaping. Empty when there
    is nothing to say."""
    a = df.attrs
    notes: list[str] = []
    if a.get("clock_origin"):
        notes.append(f"arrival_s counts from {a['clock_origin']} (the earliest timestamp)")
    if a.get("clock") == "per_session":
        notes.append(
            f"{a.get('num_sessions', '?')} sessions on their own clocks (no shared clock: replayed closed loop); "
            f"{a.get('num_subagent_requests', 0)} requests inside sub-agents, flattened into their session in "
            "time order"
        )
    if a.get("num_weeks", 1) > 1 or "week" in a:
        notes.append(f"week {a.get('week', 1)} of {a.get('num_weeks', 1)} in the file (each week has its own clock)")
    counts = [
        ("num_resorted", "rows out of time order in the file, sorted"),
        ("num_blank_lines", "blank lines skipped"),
        ("num_failed", "failed requests (0 response tokens) kept as zero-output requests, flagged in 'failed'"),
        ("num_skipped_zero_prompt", "rows with 0 prompt tokens skipped (nothing to prefill)"),
        ("num_dropped_window", "rows outside the time window dropped"),
        ("num_dropped_prompt_filter", "rows outside the prompt-length filter dropped"),
        ("num_dropped_max_requests", "rows beyond max_requests dropped"),
        ("num_dropped_sessions", "requests of sessions beyond max_sessions dropped"),
        ("num_repeated_sessions", "sessions replayed a second (or later) time to reach max_sessions"),
        ("num_think_capped", "think times capped at max_think_time_s"),
    ]
    if a.get("clock") == "per_session":
        counts[0] = ("num_resorted", "requests moved when ordering each session by time (sub-agents interleave)")
    notes.extend(f"{a[key]:,} {text}" for key, text in counts if a.get(key))
    return notes
