"""The one request-table schema every trace reader and generator returns, and the trace error type.

A request table is a `pandas.DataFrame` with exactly the columns in `REQUEST_COLUMNS`, one row per request,
sorted by arrival:

| column | dtype | unit / meaning |
|---|---|---|
| `request_id` | int64 | 0..n-1, unique (readers: source file order; `shape_requests`: row order) |
| `arrival_s` | float64 | arrival time in seconds on the trace's own clock, non-decreasing |
| `prompt_tokens` | int64 | input (prompt) length in tokens, >= 1 |
| `output_tokens` | int64 | output (decode) length in tokens, >= 0 |
| `hash_ids` | object | python `list[int]` per row: prefix-block hashes as in the source, `[]` if none |

Readers may add extra columns after these (e.g. `session_id`, `week`, `failed`); every table function keeps them.

**Session tables** (closed-loop agentic traces, `traces.kvcache_tester`) also have `SESSION_COLUMNS`:
`session_id` (str), `turn` (int64, 0-based order within the session) and `think_time_s` (float64, the client's
delay before issuing the request, after the previous one finished). Sessions have no shared clock: rows are
grouped by session then turn, `arrival_s` is the time on the session's own clock (non-decreasing within a
session only) and `df.attrs["clock"]` is "per_session". `is_session_table` tells them apart.

Metadata travels in `df.attrs` (e.g. `source`, `num_blank_lines`, `num_resorted`, `num_dropped_window`), so a
reader never drops, clips or reorders rows without saying so .
"""

from __future__ import annotations

import pandas as pd

REQUEST_COLUMNS: list[str] = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "hash_ids"]
SESSION_COLUMNS: list[str] = ["session_id", "turn", "think_time_s"]


class TraceError(ValueError):
    """A trace file or trace name that cannot be used.

    The message is one line naming the file, the 1-based line number and the field, the value found and what
    was expected, e.g. `traces/data/x.jsonl line 12: field 'output_length': expected a non-negative integer,
    got -5`.
    """


def require_request_columns(df: pd.DataFrame, argument: str = "df") -> None:
    """Check that `df` is a request table (has every column in `REQUEST_COLUMNS`).

    Args:
        df: the table to check.
        argument: the argument name to use in the error message.

    Raises:
        TypeError: if `df` is not a `pandas.DataFrame`.
        ValueError: if a column of `REQUEST_COLUMNS` is missing.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(
            f"{argument} must be a pandas DataFrame with columns {REQUEST_COLUMNS}, got {type(df).__name__}"
        )
    missing = [c for c in REQUEST_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{argument} is missing request columns {missing}; expected {REQUEST_COLUMNS}, got {list(df.columns)}"
        )


def is_session_table(df: pd.DataFrame) -> bool:
    """True for a closed-loop session table (it has every column of `SESSION_COLUMNS`)."""
    return all(c in df.columns for c in SESSION_COLUMNS)
