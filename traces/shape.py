"""Cut and rescale a request table into the workload a scenario replays.

`shape_requests` applies, in this fixed order:

1. time window `[start_s, end_s)` on `arrival_s` measured from the table's first arrival,
2. prompt-length filter `min_prompt_tokens <= prompt_tokens <= max_prompt_tokens` (both inclusive),
3. the first `max_requests` remaining rows,
4. rebase: subtract the first kept arrival, so the result starts at 0.0 s,
5. time scaling: `arrival_s *= time_scale` (> 1 slows the trace down, < 1 speeds it up), or, with
   `target_rate_per_s`, the factor that makes `(n - 1) / span` equal to the target.

Rows are only ever dropped, never altered (apart from the rebase and the time scale); every drop is counted in
`df.attrs` : `num_input_rows`, `num_dropped_window`, `num_dropped_prompt_filter`,
`num_dropped_max_requests`, `arrival_offset_s` (the first kept arrival, on the input clock) and
`time_scale_applied`. Attributes of the input (e.g. `source`) are kept.

`shape_sessions` is the counterpart for closed-loop session tables: first sessions, prompt filter, think-time cap.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from traces._checks import check_int, check_non_negative, check_positive
from traces.schema import SESSION_COLUMNS, is_session_table, require_request_columns


def shape_requests(
    df: pd.DataFrame,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    max_requests: int | None = None,
    time_scale: float = 1.0,
    target_rate_per_s: float | None = None,
    min_prompt_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
) -> pd.DataFrame:
    """Window, filter, truncate, rebase and time-scale a request table (order in the module docstring).

    Args:
        df: request table (`traces.schema`), sorted by `arrival_s`; not modified.
        start_s: window start in seconds after the first arrival, inclusive, >= 0; None = from the start.
        end_s: window end in seconds after the first arrival, exclusive, > start_s; None = to the end.
        max_requests: keep at most this many rows (the earliest), >= 1; None = all.
        time_scale: multiply rebased arrivals by this factor, > 0 (2.0 = half the request rate).
        target_rate_per_s: instead of `time_scale`, scale so that (n - 1) / (last - first arrival) equals this
            rate in requests per second, > 0. Needs at least two rows with distinct arrivals.
        min_prompt_tokens: drop rows with fewer prompt tokens, >= 1; None = no lower bound.
        max_prompt_tokens: drop rows with more prompt tokens, >= max(1, min_prompt_tokens); None = no bound.

    Returns:
        A new request table: `request_id` renumbered 0..n-1, `arrival_s` starting at 0.0, other columns (and
        any extra columns) as in `df`; `df.attrs` extended as described in the module docstring.

    Raises:
        TypeError: if `df` is not a DataFrame or an option has the wrong type.
        ValueError: if `df` lacks request columns, is empty or unsorted; if an option is out of range; if
            both `time_scale` != 1 and `target_rate_per_s` are given; if `target_rate_per_s` meets a zero
            span; or if the options remove every row (the message names the option that did).
    """
    require_request_columns(df)
    _check_options(start_s, end_s, max_requests, time_scale, target_rate_per_s, min_prompt_tokens, max_prompt_tokens)
    out = _window(df, _sorted_arrivals(df), start_s, end_s)
    num_after_window = len(out)
    out = _filter_prompt_tokens(out, min_prompt_tokens, max_prompt_tokens)
    num_after_filter = len(out)
    if max_requests is not None:
        out = out.iloc[:max_requests]
    kept_s = out["arrival_s"].to_numpy(dtype=np.float64)
    scale = time_scale if target_rate_per_s is None else _scale_for_rate(kept_s, target_rate_per_s)
    out = _renumber(out)
    out["arrival_s"] = (kept_s - kept_s[0]) * scale
    out.attrs.update(
        num_input_rows=len(df),
        num_dropped_window=len(df) - num_after_window,
        num_dropped_prompt_filter=num_after_window - num_after_filter,
        num_dropped_max_requests=num_after_filter - len(out),
        arrival_offset_s=float(kept_s[0]),
        time_scale_applied=float(scale),
    )
    return out


def _sorted_arrivals(df: pd.DataFrame) -> np.ndarray:
    """`df.arrival_s` as float64 [num_rows]; ValueError if `df` is empty or not sorted by arrival."""
    if df.empty:
        raise ValueError("df has no rows; expected a non-empty request table")
    arrivals = df["arrival_s"].to_numpy(dtype=np.float64)
    if np.any(np.diff(arrivals) < 0):
        raise ValueError("df.arrival_s must be sorted ascending (read_mooncake and synthetic_requests sort it)")
    return arrivals


def _window(df: pd.DataFrame, arrivals: np.ndarray, start_s: float | None, end_s: float | None) -> pd.DataFrame:
    """Rows with start_s <= arrival - first arrival < end_s (None = unbounded); ValueError if none is left."""
    relative_s = arrivals - arrivals[0]
    in_window = np.ones(len(df), dtype=bool)
    if start_s is not None:
        in_window &= relative_s >= start_s
    if end_s is not None:
        in_window &= relative_s < end_s
    out = df.loc[in_window]
    if out.empty:
        raise ValueError(
            f"start_s={start_s}, end_s={end_s} removed every row; the trace spans [0, {relative_s[-1]:g}] s "
            "after its first arrival"
        )
    return out


def _renumber(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with a fresh 0..n-1 index and `request_id` renumbered to match."""
    out = df.reset_index(drop=True)
    out["request_id"] = np.arange(len(out), dtype=np.int64)
    return out


def _check_options(
    start_s: float | None,
    end_s: float | None,
    max_requests: int | None,
    time_scale: float,
    target_rate_per_s: float | None,
    min_prompt_tokens: int | None,
    max_prompt_tokens: int | None,
) -> None:
    """Range-check every option of `shape_requests` before touching the data."""
    if start_s is not None:
        check_non_negative("start_s", start_s)
    if end_s is not None:
        check_positive("end_s", end_s)
        if start_s is not None and end_s <= start_s:
            raise ValueError(f"end_s must be > start_s, got end_s={end_s!r}, start_s={start_s!r}")
    if max_requests is not None:
        check_int("max_requests", max_requests, 1)
    check_positive("time_scale", time_scale)
    if target_rate_per_s is not None:
        check_positive("target_rate_per_s", target_rate_per_s)
        if time_scale != 1.0:
            raise ValueError(
                f"give either time_scale or target_rate_per_s, not both; got time_scale={time_scale!r}, "
                f"target_rate_per_s={target_rate_per_s!r}"
            )
    if min_prompt_tokens is not None:
        check_int("min_prompt_tokens", min_prompt_tokens, 1)
    if max_prompt_tokens is not None:
        check_int("max_prompt_tokens", max_prompt_tokens, min_prompt_tokens or 1)


def _filter_prompt_tokens(df: pd.DataFrame, min_tokens: int | None, max_tokens: int | None) -> pd.DataFrame:
    """Rows with min_tokens <= prompt_tokens <= max_tokens; ValueError if none is left."""
    if min_tokens is None and max_tokens is None:
        return df
    prompt = df["prompt_tokens"].to_numpy()
    keep = np.ones(len(df), dtype=bool)
    if min_tokens is not None:
        keep &= prompt >= min_tokens
    if max_tokens is not None:
        keep &= prompt <= max_tokens
    if not keep.any():
        raise ValueError(
            f"min_prompt_tokens={min_tokens}, max_prompt_tokens={max_tokens} removed every row; "
            f"prompt_tokens in the window range over [{prompt.min()}, {prompt.max()}]"
        )
    return df.loc[keep]


def _scale_for_rate(arrivals_s: np.ndarray, target_rate_per_s: float) -> float:
    """Factor k such that (n - 1) / (k * span) == target_rate_per_s for the kept arrivals."""
    n = len(arrivals_s)
    span_s = float(arrivals_s[-1] - arrivals_s[0]) if n else 0.0
    if span_s <= 0:
        raise ValueError(
            f"target_rate_per_s={target_rate_per_s!r} needs rows spread over a span > 0 s; after filtering "
            f"there are {n} rows spanning {span_s:g} s (use time_scale, or keep more rows)"
        )
    return (n - 1) / (span_s * target_rate_per_s)


def shape_sessions(
    df: pd.DataFrame,
    *,
    max_sessions: int | None = None,
    min_prompt_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
    max_think_time_s: float | None = None,
) -> pd.DataFrame:
    """Cut a session table (`traces.schema.is_session_table`) into the sessions a scenario replays closed loop.

    In this order: keep the first `max_sessions` sessions (table order; a `max_sessions` above the trace's
    session count replays its sessions again in order, the copies' `session_id` suffixed `#2`, `#3`, ...); drop
    requests outside
    `min_prompt_tokens <= prompt_tokens <= max_prompt_tokens` (the session's other requests stay, each still
    issued its own think time after the previous kept one finished); cap `think_time_s` at `max_think_time_s`.
    Time windows and time scaling do not apply: sessions have no shared clock, and a closed loop sets its own
    pace. Everything is counted in `df.attrs`: `num_input_rows`, `num_dropped_sessions` (requests of the sessions
    left out), `num_repeated_sessions`, `num_dropped_prompt_filter`, `num_think_capped`; `num_sessions` (and
    `num_subagent_requests`, with an `agent_id` column) describe the result.

    Args:
        df: session table.
        max_sessions: >= 1; None = every session once.
        min_prompt_tokens, max_prompt_tokens: as in `shape_requests`.
        max_think_time_s: >= 0; None = think times as recorded (agentic traces have pauses of hours).

    Returns:
        A new session table, `request_id` renumbered 0..n-1, other columns as in `df`.

    Raises:
        TypeError: if `df` is not a DataFrame or an option has the wrong type.
        ValueError: if `df` is not a non-empty session table, an option is out of range, or the options remove
            every request.
    """
    _check_session_options(df, max_sessions, min_prompt_tokens, max_prompt_tokens, max_think_time_s)
    out, num_repeated = _first_sessions(df, max_sessions)
    num_after_sessions = len(out)
    out = _renumber(_filter_prompt_tokens(out, min_prompt_tokens, max_prompt_tokens))
    num_capped = _cap_think_times(out, max_think_time_s)
    if "agent_id" in out.columns:
        out.attrs["num_subagent_requests"] = int((out["agent_id"] != "").sum())
    out.attrs.update(
        num_sessions=int(out["session_id"].nunique()),
        num_input_rows=len(df),
        num_dropped_sessions=max(len(df) - num_after_sessions, 0),
        num_repeated_sessions=num_repeated,
        num_dropped_prompt_filter=num_after_sessions - len(out),
        num_think_capped=num_capped,
    )
    return out


def _check_session_options(
    df: pd.DataFrame,
    max_sessions: int | None,
    min_prompt_tokens: int | None,
    max_prompt_tokens: int | None,
    max_think_time_s: float | None,
) -> None:
    """Check that `df` is a non-empty session table, then range-check every option of `shape_sessions`."""
    require_request_columns(df)
    if not is_session_table(df):
        raise ValueError(f"df is not a session table: expected columns {SESSION_COLUMNS}, got {list(df.columns)}")
    if df.empty:
        raise ValueError("df has no rows; expected a non-empty session table")
    if max_sessions is not None:
        check_int("max_sessions", max_sessions, 1)
    if min_prompt_tokens is not None:
        check_int("min_prompt_tokens", min_prompt_tokens, 1)
    if max_prompt_tokens is not None:
        check_int("max_prompt_tokens", max_prompt_tokens, min_prompt_tokens or 1)
    if max_think_time_s is not None:
        check_non_negative("max_think_time_s", max_think_time_s)


def _first_sessions(df: pd.DataFrame, max_sessions: int | None) -> tuple[pd.DataFrame, int]:
    """(rows of the first `max_sessions` sessions, number of sessions repeated to reach `max_sessions`).

    Above the trace's session count its sessions are replayed again in order, the copies' `session_id` suffixed
    `#2`, `#3`, ... (`df.attrs` kept).
    """
    session_ids = pd.unique(df["session_id"])
    if max_sessions is None:
        return df, 0
    if max_sessions <= len(session_ids):
        return df.loc[df["session_id"].isin(set(session_ids[:max_sessions]))], 0
    copies = [df]
    for k in range(len(session_ids), max_sessions):
        copy = df.loc[df["session_id"] == session_ids[k % len(session_ids)]].copy()
        copy["session_id"] = copy["session_id"] + f"#{k // len(session_ids) + 1}"
        copies.append(copy)
    out = pd.concat(copies, ignore_index=True)
    out.attrs = dict(df.attrs)
    return out, max_sessions - len(session_ids)


def _cap_think_times(df: pd.DataFrame, max_think_time_s: float | None) -> int:
    """Cap `df.think_time_s` at `max_think_time_s` in place (None = no cap); returns how many were capped."""
    if max_think_time_s is None:
        return 0
    think = df["think_time_s"].to_numpy(dtype=np.float64)
    num_capped = int(np.count_nonzero(think > max_think_time_s))
    df["think_time_s"] = np.minimum(think, max_think_time_s)
    return num_capped
