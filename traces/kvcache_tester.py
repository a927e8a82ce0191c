"""Reader for agentic-coding session traces in the kv-cache-tester format (callanjfox/kv-cache-tester
`traces/trace_NNNN.json`: anonymised Claude Code sessions).

Format: one JSON object per file = one session: `id`, `block_size`, ..., and `requests`, a list of

- ordinary requests: `t` (s since session start), `type` ("n" or "s"), `in` (input tokens: the whole context,
  integer >= 1), `out` (output tokens, integer >= 0), `think_time` (s: client delay before this request, >= 0),
  `hash_ids` (64-token prefix blocks, optional; kept as they are), `api_time`, `model`, ... (not used);
- sub-agents: `type` "subagent", `t` (s since session start), `agent_id`, and their own `requests` list (same
  shape, `t` counted from the sub-agent's start; nested sub-agents are handled the same way).

Flattening: every request gets the time `t` on its session's clock (a sub-agent's request: sub-agent `t` + its own
`t`); a session's requests, sub-agent requests included, are ordered stably by that time and numbered `turn` 0, 1,
... (`num_resorted` counts requests that this ordering moved). Sessions have no shared clock, so the table is
grouped by session (file order), then turn, and `arrival_s` is the time on the session's own clock: the table is
not sorted by `arrival_s` across sessions. The simulator replays such a table closed loop (`sim/serving/sessions.py`):
request k + 1 of a session is issued `think_time_s` after request k finished.

Errors name the file, the line (the files are usually one line) and the request's JSON location, e.g.
`trace_0001.json line 1, requests[12]: field 'in': expected an integer >= 1, got -5`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces._table import build_table, count, count_resorted, read_bytes, seconds, show
from traces.schema import TraceError

SESSION_GLOB = "*.json"
_HERE = "\x00"  # placeholder location, replaced by file, line and JSON path when a check fails
_WS = re.compile(r"[ \t\n\r]*")


def read_kvcache_tester(path: str | Path) -> pd.DataFrame:
    """Read kv-cache-tester session files (a folder of `*.json`, or one file) into a session table.

    Args:
        path: a folder (every `*.json` in it, in name order, one session each; subfolders are ignored) or one
            session file.

    Returns:
        Request table (`traces.schema`) grouped by session (file order) then turn, with the extra columns
        `session_id` (str: the file's `id`, else its stem), `turn` (int64, 0-based in flattened time order),
        `think_time_s` (float64, as recorded) and `agent_id` (str: "" for the main agent, else the sub-agent's
        `agent_id`, nested ones joined with "/"). `arrival_s` = time on the session's own clock; `request_id` =
        0-based row. `attrs`: `source`, `format` ("kvcache_tester"), `clock` ("per_session"), `num_sessions`,
        `num_subagent_requests`, `num_resorted` (requests moved by the per-session time ordering).

    Raises:
        TraceError: no session file; a file that is not valid JSON or not an object with a `requests` list; two
            files with the same session id; a request that is not an object or has a missing or bad `t`, `in`,
            `out`, `think_time` or `hash_ids`, or a sub-agent without a `requests` list (file, line and JSON
            location named); no requests at all.
    """
    root = Path(path)
    files = _session_files(root)
    rows, num_resorted = _session_rows(files)
    if not rows:
        raise TraceError(f"{root}: no requests in {len(files)} session file(s)")
    extra = {
        "session_id": pd.Series([r[0] for r in rows], dtype=object),
        "turn": np.asarray([r[7] for r in rows], dtype=np.int64),
        "think_time_s": np.asarray([r[4] for r in rows], dtype=np.float64),
        "agent_id": pd.Series([r[6] for r in rows], dtype=object),
    }
    attrs = {
        "hash_block_tokens": 64,  # tokens per hash_ids block (module docstring)
        "source": str(root),
        "format": "kvcache_tester",
        "clock": "per_session",
        "num_sessions": len(files),
        "num_subagent_requests": sum(r[6] != "" for r in rows),
        "num_resorted": num_resorted,
    }
    arrival = np.asarray([r[1] for r in rows], dtype=np.float64)
    # Per-session clocks: no global sort, which would interleave sessions.
    return build_table(arrival, [r[2] for r in rows], [r[3] for r in rows], [r[5] for r in rows], extra, attrs, False)


def _session_files(root: Path) -> list[Path]:
    """Every `*.json` file directly in folder `root`, in name order, or [root] for a file; TraceError if none."""
    if not root.is_dir():
        return [root]
    files = sorted(p for p in root.glob(SESSION_GLOB) if p.is_file())
    if not files:
        raise TraceError(f"{root}: no {SESSION_GLOB} session files in this folder")
    return files


def _session_rows(files: list[Path]) -> tuple[list[tuple], int]:
    """(rows as (session_id, t, in, out, think, hash_ids, agent_id, turn) in file, then time order, num_resorted).

    Raises:
        TraceError: a bad session file, or two files with the same session id.
    """
    rows: list[tuple] = []
    seen: dict[str, Path] = {}
    num_resorted = 0
    for file in files:
        session_id, flat = _read_session(file)
        if session_id in seen:
            raise TraceError(f"{file}: session id {session_id!r} repeats that of {seen[session_id]}")
        seen[session_id] = file
        times = np.asarray([r[0] for r in flat], dtype=np.float64)
        num_resorted += count_resorted(times)
        for turn, i in enumerate(np.argsort(times, kind="stable")):
            t, n_in, n_out, think, ids, agent = flat[i]
            rows.append((session_id, t, n_in, n_out, think, ids, agent, turn))
    return rows, num_resorted


def _read_session(file: Path) -> tuple[str, list[tuple]]:
    """(session id, flattened requests as (t, in, out, think_time, hash_ids, agent_id) in file order)."""
    data = read_bytes(file)
    try:
        session = json.loads(data)
    except json.JSONDecodeError as e:
        raise TraceError(f"{file} line {e.lineno}: invalid JSON ({e.msg}); expected one session object") from None
    except ValueError as e:  # bytes that are not UTF-8
        raise TraceError(f"{file}: invalid JSON ({e}); expected one session object") from None
    if not isinstance(session, dict) or not isinstance(session.get("requests"), list):
        got = f"keys {sorted(session)}" if isinstance(session, dict) else type(session).__name__
        raise TraceError(f"{file} line 1: expected a session object with a 'requests' list, got {got}")
    session_id = session.get("id")
    if not isinstance(session_id, str) or not session_id:
        session_id = file.stem
    flat: list[tuple] = []
    try:
        _flatten(session["requests"], 0.0, ["requests"], "", flat)
    except _Bad as bad:
        text = data.decode("utf-8", errors="replace")
        where = f"{file} line {_line_of(text, bad.steps)}, {_json_path(bad.steps)}"
        raise TraceError(bad.message.replace(_HERE, where)) from None
    return session_id, flat


class _Bad(Exception):
    """A failed check inside a session, before its line is known."""

    def __init__(self, message: str, steps: list[str | int]) -> None:
        super().__init__(message)
        self.message, self.steps = message, steps


def _flatten(requests: list[Any], offset_s: float, steps: list[str | int], agent: str, out: list[tuple]) -> None:
    for i, req in enumerate(requests):
        here = [*steps, i]
        try:
            if not isinstance(req, dict):
                raise TraceError(f"{_HERE}: expected a request object, got {type(req).__name__} {show(req)}")
            t = seconds(_get(req, "t"), "t", _HERE)
            if req.get("type") == "subagent":
                sub = _get(req, "requests")
                if not isinstance(sub, list):
                    raise TraceError(f"{_HERE}: field 'requests': expected a list of requests, got {show(sub)}")
                name = req.get("agent_id")
                name = name if isinstance(name, str) and name else f"subagent{i}"
                _flatten(sub, offset_s + t, [*here, "requests"], f"{agent}/{name}" if agent else name, out)
                continue
            n_in = count(_get(req, "in"), "in", 1, _HERE)
            n_out = count(_get(req, "out"), "out", 0, _HERE)
            think = seconds(_get(req, "think_time"), "think_time", _HERE)
            ids = req.get("hash_ids", [])
            if type(ids) is not list or not all(type(h) is int for h in ids):
                raise TraceError(f"{_HERE}: field 'hash_ids': expected a list of integers, got {show(ids)}")
        except TraceError as e:
            raise _Bad(str(e), here) from None
        out.append((offset_s + t, n_in, n_out, think, ids, agent))


def _get(req: dict[str, Any], name: str) -> Any:
    try:
        return req[name]
    except KeyError:
        raise TraceError(f"{_HERE}: field '{name}': missing; keys present: {sorted(req)}") from None


def _json_path(steps: list[str | int]) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else (f".{s}" if i else s) for i, s in enumerate(steps))


def _line_of(text: str, steps: list[str | int]) -> int:
    """1-based line where the value at `steps` (object keys and list indices from the top) starts.

    Only runs on the error path: walks the text with `json.JSONDecoder.raw_decode`, skipping sibling values.
    """
    decoder = json.JSONDecoder()
    pos = _WS.match(text).end()
    try:
        for step in steps:
            opener = text[pos]
            pos = _WS.match(text, pos + 1).end()
            if isinstance(step, str):
                if opener != "{":
                    break
                while text[pos] != "}":
                    key, pos = decoder.raw_decode(text, pos)
                    pos = _WS.match(text, _WS.match(text, pos).end() + 1).end()  # past ':'
                    if key == step:
                        break
                    _, pos = decoder.raw_decode(text, pos)
                    pos = _WS.match(text, pos).end()
                    if text[pos] == ",":
                        pos = _WS.match(text, pos + 1).end()
            else:
                if opener != "[":
                    break
                for _ in range(step):
                    _, pos = decoder.raw_decode(text, pos)
                    pos = _WS.match(text, _WS.match(text, pos).end() + 1).end()  # past ','
    except (ValueError, IndexError):
        pass
    return text.count("\n", 0, pos) + 1
