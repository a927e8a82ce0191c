"""Shipped traces, name/path resolution, format dispatch and the summary statistics of a request table.

A scenario names its trace as either a shipped name (a key of `SHIPPED_TRACES`, a file under `DATA_DIR`) or a
path to a trace file. `load_trace` resolves it and picks the reader from `fmt` or the file extension.
`trace_stats` computes the numbers of `traces/data/README.md` (numpy linear-interpolation percentiles over
requests; rate = rows / (last - first arrival); 8K = 8,192 and 32K = 32,768 prompt tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from traces.mooncake import read_mooncake
from traces.schema import TraceError, require_request_columns

DATA_DIR: Path = Path(__file__).parent / "data"

SHIPPED_TRACES: dict[str, str] = {
    "mooncake_conversation": "mooncake_conversation.jsonl",
}

_READERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    "mooncake": read_mooncake,
}
_FORMAT_BY_SUFFIX: dict[str, str] = {
    ".jsonl": "mooncake",
}

_PROMPT_8K_TOKENS = 8192
_PROMPT_32K_TOKENS = 32768
_PERCENTILES = (50, 90, 99)


def resolve_trace(name_or_path: str) -> Path:
    """Turn a shipped trace name or a file path into the path of an existing trace file.

    A shipped name wins over a file of the same name in the working directory.

    Args:
        name_or_path: a key of `SHIPPED_TRACES` (e.g. "mooncake_conversation") or a path to a trace file.

    Returns:
        Path of the trace file.

    Raises:
        TraceError: if it is neither a shipped name nor an existing file (the message lists the shipped
            names), or a shipped file is missing from the installation.
    """
    if name_or_path in SHIPPED_TRACES:
        path = DATA_DIR / SHIPPED_TRACES[name_or_path]
        if not path.is_file():
            raise TraceError(f"shipped trace '{name_or_path}' is missing its file {path}; reinstall pulseinfer")
        return path
    path = Path(name_or_path)
    if path.is_file():
        return path
    raise TraceError(
        f"no such trace file or shipped trace name {str(name_or_path)!r} (shipped: {', '.join(SHIPPED_TRACES)})"
    )


def load_trace(name_or_path: str, fmt: str = "auto") -> pd.DataFrame:
    """Resolve a trace and read it into a request table (`traces.schema`).

    Args:
        name_or_path: shipped trace name or file path (see `resolve_trace`).
        fmt: "auto" (pick by extension: .jsonl -> mooncake) or a reader name ("mooncake").

    Returns:
        The request table from the reader, with its `df.attrs`.

    Raises:
        TraceError: if `fmt` is unknown, "auto" cannot tell the format from the extension, the trace cannot be
            resolved, or the reader rejects the file.
    """
    if fmt != "auto" and fmt not in _READERS:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(['auto', *_READERS])}")
    path = resolve_trace(name_or_path)
    if fmt == "auto":
        suffix = path.suffix.lower()
        if suffix not in _FORMAT_BY_SUFFIX:
            known = ", ".join(f"{s} -> {f}" for s, f in _FORMAT_BY_SUFFIX.items())
            raise TraceError(
                f"{path}: cannot tell the trace format from extension {suffix!r} (known: {known}); "
                f"pass fmt= one of {', '.join(_READERS)}"
            )
        fmt = _FORMAT_BY_SUFFIX[suffix]
    return _READERS[fmt](path)


def trace_stats(df: pd.DataFrame) -> dict[str, float]:
    """Summary statistics of a request table, as in `traces/data/README.md`.

    Args:
        df: request table (`traces.schema`), non-empty.

    Returns:
        Plain python numbers: `rows`; `span_s` (last - first arrival, s); `rate_per_s` (rows / span_s, NaN
        when the span is 0); `prompt_tokens_{mean,p50,p90,p99,max}` and `output_tokens_{mean,p50,p90,p99,max}`
        (numpy linear-interpolation percentiles); `share_prompt_over_8k` and `share_prompt_over_32k`
        (fractions in [0, 1] of rows with prompt_tokens > 8,192 and > 32,768).

    Raises:
        TypeError: if `df` is not a DataFrame.
        ValueError: if `df` lacks request columns or has no rows.
    """
    require_request_columns(df)
    if df.empty:
        raise ValueError("df has no rows; trace_stats needs a non-empty request table")
    arrivals = df["arrival_s"].to_numpy(dtype=np.float64)
    span_s = float(arrivals.max() - arrivals.min())
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
    return stats
