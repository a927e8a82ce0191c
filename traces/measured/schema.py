"""The one result type of every measured-run reader (`MeasuredRun`), its error type, and the table and aggregates
built from it (the readers' shared value checks and file reading: `traces/measured/parse.py`).

A `MeasuredRun` is one benchmark run of a real server, as a serving-benchmark tool recorded it:

`requests`, one row per request (columns `MEASURED_COLUMNS`, in this order):

| column | dtype | unit / meaning |
|---|---|---|
| `request_id` | int64 | 0..n-1 in the tool's request order (send order where the file records send times) |
| `prompt_tokens` | int64 | prompt length in tokens as the tool counted it |
| `output_tokens` | int64 | generated tokens as the tool counted it (0 for failed requests where the tool says so) |
| `arrival_s` | float64 | seconds from the run's first send; NaN for every row when the file records no send times |
| `ttft_s` | float64 | time to first token, seconds; NaN where absent (failed requests, tools without it) |
| `e2e_s` | float64 | end-to-end latency, seconds; NaN where absent |
| `itl_s` | object | numpy float64 array of inter-token (inter-chunk) gaps in seconds, or None where absent |
| `tpot_s` | float64 | (e2e - ttft) / (output - 1); NaN for < 2 output tokens or a missing operand |
| `success` | bool | the tool counted the request as completed |
| `cached_tokens` | float64 | prompt tokens served from the server's prefix cache, as it reported them; NaN: unknown |
| `prefix_ids` | object | tuple of prefix-block hashes of the prompt text (`text_prefix_ids`); None without texts |
| `queue_s` | float64 | arrival to first scheduled by the server, seconds (server-side records); NaN where unknown |

Run-level fields: `tool`, `request_rate` (req/s; inf for "send all at once"; NaN where the file does not say),
`max_concurrency` (int or None), `duration_s`, `model`, `backend`, `num_prompts`, `summary` (the tool's own
aggregate metrics as the file gives them), `source_path`, and `notes` (what reading chose or derived, e.g. which
run of a multi-run file). `load` is derived: "trace" (send times recorded), "rate" (finite request_rate),
"concurrency" (max_concurrency with an infinite or unknown rate), else "all_at_once".

Every reader raises `MeasuredFormatError` (a `ValueError`) with one line naming the file, the format, the field
(and index) and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from traces.measured.engine import engine_from
from traces.measured.prefix import text_prefix_ids

MEASURED_COLUMNS: list[str] = [
    "request_id",
    "prompt_tokens",
    "output_tokens",
    "arrival_s",
    "ttft_s",
    "e2e_s",
    "itl_s",
    "tpot_s",
    "success",
    "cached_tokens",
    "prefix_ids",
    "queue_s",
]
LOADS: tuple[str, ...] = ("trace", "rate", "concurrency", "all_at_once")


class MeasuredFormatError(ValueError):
    """A measured-run file that is not what it claims to be, or holds a bad value.

    The message is one line naming the file, the format, the field (and index where there is one) and what was
    expected, e.g. `run.jsonl: not an SGLang bench_serving --output-details line: missing 'itls' (run with
    --output-details)`.
    """


@dataclass
class MeasuredRun:
    """One benchmark run of a real server: a per-request table plus the run's settings (see module docstring)."""

    requests: pd.DataFrame
    tool: str
    request_rate: float
    max_concurrency: int | None
    duration_s: float
    model: str | None
    backend: str | None
    num_prompts: int
    summary: dict[str, Any]
    source_path: str
    notes: list[str] = field(default_factory=list)

    @property
    def load(self) -> str:
        """How the tool offered load: "trace", "rate", "concurrency" or "all_at_once" (see module docstring)."""
        if len(self.requests) and bool(self.requests["arrival_s"].notna().any()):
            return "trace"
        if math.isfinite(self.request_rate):
            return "rate"
        if self.max_concurrency is not None:
            return "concurrency"
        return "all_at_once"

    @property
    def engine(self) -> str | None:
        """The serving engine and its release as the file records them, ``NAME-VERSION`` (``sglang-0.5.5.post1``),
        ``NAME`` alone where the file names the engine but no version, or None (:func:`engine_from`)."""
        return engine_from(self.backend, self.summary)


# ---------------------------------------------------------------------------------------------------------------
# Building the request table


def build_requests(
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    arrival_s: Sequence[float] | None,
    ttft_s: Sequence[float],
    e2e_s: Sequence[float],
    itl_s: Sequence[Sequence[float] | np.ndarray | None],
    success: Sequence[bool],
    tpot_s: Sequence[float] | None = None,
    cached_tokens: Sequence[float] | None = None,
    prompt_texts: Sequence[str | None] | None = None,
    queue_s: Sequence[float] | None = None,
) -> pd.DataFrame:
    """Assemble a request table with `MEASURED_COLUMNS` from already-validated per-request lists.

    Args:
        prompt_tokens, output_tokens: token counts (>= 0).
        arrival_s: send times in seconds on any clock (rebased so the earliest is 0.0), or None when the source
            records none (the column is then all NaN).
        ttft_s, e2e_s: seconds, NaN where absent.
        itl_s: per request a sequence of gaps in seconds (stored as a float64 numpy array) or None.
        success: per request.
        tpot_s: the tool's own per-request TPOT in seconds, if it gives one; otherwise computed as
            (e2e - ttft) / (output - 1), NaN for fewer than 2 output tokens.
        cached_tokens: prompt tokens served from the server's prefix cache, per request as the server reported them
            (NaN where unknown); None when the file records none.
        prompt_texts: the prompt strings (None for a request without one); their shared prefixes become
            `prefix_ids` (`text_prefix_ids`).
        queue_s: seconds from arrival to the server first scheduling the request (server-side records), NaN where
            unknown; None when the file records none.

    Returns:
        The request table, `request_id` = 0..n-1 in the given order.
    """
    n = len(prompt_tokens)
    outputs = np.asarray(output_tokens, dtype=np.int64)
    ttft = np.asarray(ttft_s, dtype=np.float64)
    e2e = np.asarray(e2e_s, dtype=np.float64)
    if arrival_s is None:
        arrivals = np.full(n, np.nan)
    else:
        arrivals = np.asarray(arrival_s, dtype=np.float64)
        if n and np.isfinite(arrivals).any():
            arrivals = arrivals - np.nanmin(arrivals)
    if tpot_s is None:
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(outputs >= 2, (e2e - ttft) / np.maximum(outputs - 1, 1), np.nan)
    else:
        tpot = np.asarray(tpot_s, dtype=np.float64)
    gaps = pd.Series([None if g is None else np.asarray(g, dtype=np.float64) for g in itl_s], dtype=object)
    columns: dict[str, Any] = {
        "request_id": np.arange(n, dtype=np.int64),
        "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
        "output_tokens": outputs,
        "arrival_s": arrivals,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "itl_s": gaps,
        "tpot_s": tpot.astype(np.float64),
        "success": np.asarray(success, dtype=bool),
        "cached_tokens": np.full(n, np.nan) if cached_tokens is None else np.asarray(cached_tokens, dtype=np.float64),
        "prefix_ids": pd.Series(
            [None] * n if prompt_texts is None else text_prefix_ids(prompt_texts, prompt_tokens), dtype=object
        ),
        "queue_s": np.full(n, np.nan) if queue_s is None else np.asarray(queue_s, dtype=np.float64),
    }
    return pd.DataFrame(columns, columns=MEASURED_COLUMNS)


def check_requests_table(df: pd.DataFrame, argument: str = "run.requests") -> None:
    """Raise ValueError unless `df` has every column of `MEASURED_COLUMNS` (writers call this)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{argument} must be a pandas DataFrame with columns {MEASURED_COLUMNS}")
    missing = [c for c in MEASURED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{argument} is missing columns {missing}; expected {MEASURED_COLUMNS}")


# ---------------------------------------------------------------------------------------------------------------
# Aggregates (what the writers put next to the per-request lists)


def _stats_ms(values: np.ndarray, name: str, percentiles: Sequence[int]) -> dict[str, float]:
    """mean/median/std/pN of `values` (seconds) in ms under `{stat}_{name}_ms`; 0.0 when empty (as the tools do)."""
    arr = values if len(values) else np.zeros(1)
    out = {
        f"mean_{name}_ms": float(np.mean(arr) * 1000),
        f"median_{name}_ms": float(np.median(arr) * 1000),
        f"std_{name}_ms": float(np.std(arr) * 1000),
    }
    for p in percentiles:
        out[f"p{p}_{name}_ms"] = float(np.percentile(arr, p) * 1000)
    return out


def latency_summary(
    requests: pd.DataFrame, duration_s: float, e2e_name: str, itl_percentiles: Sequence[int] = (99,)
) -> dict[str, float]:
    """The tools' aggregate metrics over successful requests: totals, throughputs, ttft/tpot/itl/e2e stats in ms.

    TPOT is averaged over requests with >= 2 output tokens, ITL over every gap of every successful request
    (as SGLang's and vLLM's `calculate_metrics` do). `e2e_name` is "e2e_latency" (SGLang) or "e2el" (vLLM).
    """
    ok = requests[requests["success"].to_numpy(dtype=bool)]
    ttft = ok["ttft_s"].to_numpy(dtype=np.float64)
    tpot = ok["tpot_s"].to_numpy(dtype=np.float64)
    e2e = ok["e2e_s"].to_numpy(dtype=np.float64)
    gaps = [g for g in ok["itl_s"] if g is not None and len(g)]
    itl = np.concatenate(gaps) if gaps else np.zeros(0)
    total_input = int(ok["prompt_tokens"].sum())
    total_output = int(requests["output_tokens"].where(requests["success"], 0).sum())
    completed = len(ok)
    duration = duration_s if duration_s > 0 else float("nan")
    summary: dict[str, float] = {
        "completed": completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / duration,
        "output_throughput": total_output / duration,
    }
    summary.update(_stats_ms(ttft[np.isfinite(ttft)], "ttft", (99,)))
    summary.update(_stats_ms(tpot[np.isfinite(tpot)], "tpot", (99,)))
    summary.update(_stats_ms(itl, "itl", itl_percentiles))
    summary.update(_stats_ms(e2e[np.isfinite(e2e)], e2e_name, (99,)))
    return summary
