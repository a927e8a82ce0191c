"""Reader for RAGPulse traces (flashserve/RAGPulse `data/0_trace.jsonl`; technical report arXiv 2511.12979).

Format: JSON Lines, one request per line, e.g.
`{"timestamp": "82", "input_length": 3112, "output_length": 192, "hash_ids": {"sys_prompt": [8302], ...},
"session_id": "1757476916095-afhwfadnh5ew"}` with

- `timestamp`: seconds since 12:00:00 on the week's first day, written as a string (numbers are accepted too),
- `input_length` (integer >= 1) and `output_length` (integer >= 0): tokens,
- `hash_ids` (optional): an object of id lists (`sys_prompt`, `passages_ids`, `history`, `web_search`,
  `user_input`) pointing into the source's lookup tables (`1_sys_prompt.jsonl`, ...). They are not prefix-block
  hashes: they are kept unchanged in the extra column `rag_hash_ids` and the `hash_ids` column is `[]`,
- `session_id` (optional): the user session, kept in the extra column `session_id`.

Weeks: the published file holds two consecutive weeks, each sorted on its own clock (line 3,801 resets
`timestamp` to 0). A row whose timestamp lies more than half a week (3.5 days) below the largest one so far starts
a new week; smaller steps back are unsorted rows, sorted and counted in `num_resorted`. Weeks are never mixed on
one clock: every row carries its `week` (1, 2, ...), and a file with several weeks must be read with `week=`
(else `TraceError`, naming the line where each week starts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces._table import build_table, count, read_bytes, seconds, show
from traces.generic import field, parse_json_object
from traces.schema import TraceError

WEEK_RESET_S = 3.5 * 86400.0  # a step back larger than this starts a new week's clock


def read_ragpulse(path: str | Path, week: int | None = None) -> pd.DataFrame:
    """Read a RAGPulse JSONL trace (one week of it) into a request table (`traces.schema`).

    Args:
        path: the `0_trace.jsonl` file (or a slice of it).
        week: which week to return (1-based) when the file holds several; None is fine for a one-week file.

    Returns:
        Request table of the chosen week, sorted stably by `arrival_s` (= `timestamp`, that week's clock), plus
        the extra columns `week` (int64), `session_id` (str, "" where absent) and `rag_hash_ids` (the source's
        `hash_ids` object, `{}` where absent). `request_id` = 0-based position among that week's rows.
        `attrs`: `source`, `format` ("ragpulse"), `week`, `num_weeks`, `week_first_lines` (1-based line where
        each week starts), `num_blank_lines`, `num_resorted`.

    Raises:
        TraceError: unreadable file, a line that is not a JSON object, a missing or bad `timestamp`,
            `input_length` or `output_length`, a `hash_ids` that is not an object of integer lists, a
            `session_id` that is not a string (file, line and field named); several weeks and `week` None; a
            `week` the file does not hold; no requests.
    """
    source = str(path)
    lines = read_bytes(path).splitlines()
    rows = _parse_rows(lines, source)
    if not rows.arrival:
        raise TraceError(f"{source}: no requests ({len(lines)} lines, all blank); expected one JSON object per line")
    week = _choose_week(week, rows.week_first_lines, source)
    return _week_table(rows, week, source)


@dataclass(slots=True)
class _Rows:
    """The fields of every non-blank line, in file order, and the week each line belongs to."""

    arrival: list[float] = dataclasses.field(default_factory=list)  # s, on its week's clock
    prompt: list[int] = dataclasses.field(default_factory=list)  # tokens
    output: list[int] = dataclasses.field(default_factory=list)  # tokens
    weeks: list[int] = dataclasses.field(default_factory=list)  # 1-based week of each row
    sessions: list[str] = dataclasses.field(default_factory=list)
    rag_ids: list[dict[str, list[int]]] = dataclasses.field(default_factory=list)
    week_first_lines: list[int] = dataclasses.field(default_factory=list)  # 1-based line where each week starts
    num_blank_lines: int = 0


def _parse_rows(lines: list[bytes], source: str) -> _Rows:
    """Check and collect every line; a timestamp more than `WEEK_RESET_S` below the running maximum starts a week."""
    rows = _Rows()
    running_max = -np.inf
    for line_no, raw in enumerate(lines, start=1):
        if not raw.strip():
            rows.num_blank_lines += 1
            continue
        obj = parse_json_object(raw, source, line_no)
        where = f"{source} line {line_no}"
        timestamp = seconds(field(obj, "timestamp", where), "timestamp", where)
        if not rows.week_first_lines or timestamp < running_max - WEEK_RESET_S:
            rows.week_first_lines.append(line_no)
            running_max = timestamp
        running_max = max(running_max, timestamp)
        rows.arrival.append(timestamp)
        rows.prompt.append(count(field(obj, "input_length", where), "input_length", 1, where))
        rows.output.append(count(field(obj, "output_length", where), "output_length", 0, where))
        rows.weeks.append(len(rows.week_first_lines))
        rows.sessions.append(_session_id(obj.get("session_id", ""), where))
        rows.rag_ids.append(_rag_hash_ids(obj.get("hash_ids", {}), where))
    return rows


def _choose_week(week: int | None, week_first_lines: list[int], source: str) -> int:
    """The 1-based week to return: `week` checked against the file's weeks; None only for a one-week file."""
    num_weeks = len(week_first_lines)
    if week is None:
        if num_weeks > 1:
            starts = ", ".join(f"week {i} from line {n}" for i, n in enumerate(week_first_lines, start=1))
            raise TraceError(
                f"{source} line {week_first_lines[1]}: field 'timestamp': the clock starts again, so the file holds "
                f"{num_weeks} weeks with their own clocks ({starts}); read one week at a time (workload.week, "
                "trace stats --week)"
            )
        week = 1
    if isinstance(week, bool) or not isinstance(week, int) or not 1 <= week <= num_weeks:
        raise TraceError(f"{source}: week must be an integer in [1, {num_weeks}] (weeks in the file), got {week!r}")
    return week


def _week_table(rows: _Rows, week: int, source: str) -> pd.DataFrame:
    """The request table of one week's rows, with the extra columns and `attrs` of `read_ragpulse`."""
    pick = np.flatnonzero(np.asarray(rows.weeks) == week)
    extra: dict[str, Any] = {
        "week": np.full(len(pick), week, dtype=np.int64),
        "session_id": pd.Series([rows.sessions[i] for i in pick], dtype=object),
        "rag_hash_ids": pd.Series([rows.rag_ids[i] for i in pick], dtype=object),
    }
    attrs = {
        "source": source,
        "format": "ragpulse",
        "week": week,
        "num_weeks": len(rows.week_first_lines),
        "week_first_lines": rows.week_first_lines,
        "num_blank_lines": rows.num_blank_lines,
    }
    return build_table(
        np.asarray(rows.arrival)[pick],
        [rows.prompt[i] for i in pick],
        [rows.output[i] for i in pick],
        None,
        extra,
        attrs,
    )


def _session_id(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise TraceError(f"{where}: field 'session_id': expected a string, got {show(value)}")


def _rag_hash_ids(value: Any, where: str) -> dict[str, list[int]]:
    if isinstance(value, dict) and all(
        type(ids) is list and all(type(i) is int for i in ids) for ids in value.values()
    ):
        return value
    raise TraceError(
        f"{where}: field 'hash_ids': expected an object of integer lists (sys_prompt, passages_ids, ...), "
        f"got {show(value)}"
    )
