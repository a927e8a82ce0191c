"""The one result type of every measured-run reader (`MeasuredRun`), its error type and shared checks.

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
from pathlib import Path
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

_MAX_SHOWN_CHARS = 60
_INT64_LIMIT = 2**63


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


# ---------------------------------------------------------------------------------------------------------------
# Value checks shared by the readers: each raises MeasuredFormatError in one line naming file, format, field, index


def show(value: Any) -> str:
    """Short repr of an offending value for an error message (never more than one line)."""
    text = repr(value).replace("\n", "\\n")
    return text if len(text) <= _MAX_SHOWN_CHARS else text[: _MAX_SHOWN_CHARS - 3] + "..."


def where(source: str, fmt_desc: str) -> str:
    """The common message prefix `<file>: <format description>`."""
    return f"{source}: {fmt_desc}"


def fail(source: str, fmt_desc: str, detail: str) -> MeasuredFormatError:
    """A MeasuredFormatError `<file>: <format>: <detail>` (newlines in `detail` are escaped)."""
    return MeasuredFormatError(f"{where(source, fmt_desc)}: {detail}".replace("\n", "\\n"))


def field_at(name: str, index: int | None) -> str:
    """`field 'x'` or `field 'x' index 3`."""
    return f"field '{name}'" if index is None else f"field '{name}' index {index}"


def as_count(value: Any, name: str, index: int | None, source: str, fmt_desc: str) -> int:
    """A token count: an int (or integral float) >= 0; bool, NaN, None, negative and fractional values fail."""
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and 0 <= value < _INT64_LIMIT:
        return value
    raise fail(source, fmt_desc, f"{field_at(name, index)}: expected a non-negative integer, got {show(value)}")


def as_seconds(value: Any, name: str, index: int | None, source: str, fmt_desc: str, unit: str = "seconds") -> float:
    """A duration or time stamp: a finite int/float >= 0 (bool, NaN, inf, None and negatives fail)."""
    if type(value) in (int, float) and math.isfinite(value) and value >= 0:
        return float(value)
    if type(value) in (int, float) and math.isfinite(value):
        raise fail(source, fmt_desc, f"{field_at(name, index)}: negative time {show(value)}; expected >= 0 {unit}")
    raise fail(
        source, fmt_desc, f"{field_at(name, index)}: expected a non-negative number of {unit}, got {show(value)}"
    )


def as_timestamp(value: Any, name: str, index: int | None, source: str, fmt_desc: str) -> float:
    """A clock reading (may be any finite number: perf_counter or epoch seconds)."""
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    raise fail(source, fmt_desc, f"{field_at(name, index)}: expected a finite time stamp in seconds, got {show(value)}")


def as_gaps(value: Any, name: str, index: int, source: str, fmt_desc: str) -> list[float]:
    """A list of inter-token gaps in seconds, each finite and >= 0."""
    if not isinstance(value, list):
        raise fail(source, fmt_desc, f"{field_at(name, index)}: expected a list of seconds, got {show(value)}")
    out = []
    for j, gap in enumerate(value):
        if type(gap) in (int, float) and math.isfinite(gap) and gap >= 0:
            out.append(float(gap))
            continue
        what = "negative time" if type(gap) in (int, float) and math.isfinite(gap) else "expected a non-negative number"
        raise fail(source, fmt_desc, f"{field_at(name, index)} item {j}: {what} {show(gap)} (seconds)")
    return out


def require(obj: dict[str, Any], key: str, source: str, fmt_desc: str, hint: str) -> Any:
    """`obj[key]`, or `<file>: not <format>: missing '<key>' (<hint>)`."""
    if key in obj:
        return obj[key]
    raise MeasuredFormatError(f"{source}: not {fmt_desc}: missing '{key}' ({hint})")


def require_list(obj: dict[str, Any], key: str, n: int | None, ref: str, source: str, fmt_desc: str, hint: str) -> list:
    """`obj[key]` as a list of length `n` (one per request, like `ref`); one-line errors otherwise."""
    value = require(obj, key, source, fmt_desc, hint)
    if not isinstance(value, list):
        raise fail(source, fmt_desc, f"field '{key}': expected a list (one entry per request), got {show(value)}")
    if n is not None and len(value) != n:
        raise fail(
            source, fmt_desc, f"field '{key}' has {len(value)} entries, expected {n} (one per request, as '{ref}')"
        )
    return value


def rate_value(value: Any, name: str, source: str, fmt_desc: str) -> float:
    """A request rate in req/s: a positive number, or inf given as a float or the string "inf"."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if type(value) in (int, float) and value > 0:
        return float(value)
    raise fail(
        source, fmt_desc, f"field '{name}': expected a positive number of requests/s or 'inf', got {show(value)}"
    )


def concurrency_value(value: Any, name: str, source: str, fmt_desc: str) -> int | None:
    """A max concurrency: None (not set) or an int >= 1."""
    if value is None:
        return None
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and value >= 1:
        return value
    raise fail(source, fmt_desc, f"field '{name}': expected null or an integer >= 1, got {show(value)}")


def source_name(path: str | Path) -> str:
    """The file as named in messages and `MeasuredRun.source_path`."""
    return str(path)


# ---------------------------------------------------------------------------------------------------------------
# File reading shared by the readers


MAX_FILE_BYTES = 2 * 2**30  # a benchmark output larger than 2 GiB is not read whole into memory
MAX_JSON_DEPTH = 64  # nesting a benchmark output never needs (Python's parser would recurse out of its stack)


def read_text(path: str | Path, fmt_desc: str) -> str:
    """The whole file as text; MeasuredFormatError for a missing, unreadable or larger than :data:`MAX_FILE_BYTES`
    file."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_FILE_BYTES:
            raise MeasuredFormatError(f"{path}: {fmt_desc}: {size / 2**30:.1f} GiB, larger than the "
                                      f"{MAX_FILE_BYTES / 2**30:.0f} GiB a benchmark output is read whole up to; "
                                      "split it (one run per file)")  # fmt: skip
        with open(path, "rb") as f:
            return f.read().decode("utf-8")
    except FileNotFoundError:
        raise MeasuredFormatError(f"{path}: {fmt_desc}: no such file") from None
    except UnicodeDecodeError as e:
        raise MeasuredFormatError(f"{path}: {fmt_desc}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise MeasuredFormatError(f"{path}: {fmt_desc}: cannot read file ({e.strerror or e})") from None


def parse_json_documents(
    text: str, source: str, fmt_desc: str, cut_off: list[str] | None = None
) -> list[tuple[int, Any]]:
    """The file as JSON documents: one document for a JSON file, else one per non-blank line (JSONL).

    Returns (1-based line number, parsed value) pairs. Python's json accepts the `Infinity`/`NaN` literals that
    Python tools write (SGLang writes `"request_rate": Infinity`). ``cut_off``: where given, a JSONL file whose last
    line is invalid and unterminated (a benchmark stopped while writing it) keeps its earlier lines; the line is left
    out and a note appended to ``cut_off``. Otherwise that line is an error that says it is cut off.
    """
    import json

    stripped = text.strip()
    if not stripped:
        raise MeasuredFormatError(f"{source}: {fmt_desc}: empty file")
    depth = _max_depth(stripped)
    if depth > MAX_JSON_DEPTH:
        raise MeasuredFormatError(f"{source}: {fmt_desc}: JSON nested {depth} deep, more than the {MAX_JSON_DEPTH} "
                                  "levels a benchmark output has; not a benchmark output")  # fmt: skip
    try:
        return [(1, json.loads(stripped))]
    except ValueError:
        pass
    documents = []
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            documents.append((line_no, json.loads(line)))
        except ValueError as e:
            torn = line_no == last and not text.endswith(("\n", "\r")) and documents
            if torn and cut_off is not None:
                cut_off.append(f"line {line_no} is cut off (the file ends inside it: a run stopped while writing?); "
                               "left out, the earlier lines read")  # fmt: skip
                break
            why = "; the file ends inside this line (cut off)" if torn else ""
            raise MeasuredFormatError(f"{source} line {line_no}: {fmt_desc}: invalid JSON ({e}){why}") from None
    return documents


def _max_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text (brackets inside strings not counted), without parsing it."""
    import re

    no_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    depth = deepest = 0
    for char in re.sub(r"[^\[\]{}]", "", no_strings):
        depth += 1 if char in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def pick_run(
    path: str | Path, run_index: int, fmt_desc: str, notes: list[str] | None = None
) -> tuple[dict[str, Any], str, int, int]:
    """One run of a file of JSON documents (one per line or one whole): (its object, where it is for messages,
    its line, the number of runs in the file).

    Raises:
        MeasuredFormatError: unreadable file, invalid JSON, ``run_index`` out of range, or a run that is not a JSON
            object.
    """
    source = source_name(path)
    documents = parse_json_documents(read_text(path, fmt_desc), source, fmt_desc, notes)
    if not -len(documents) <= run_index < len(documents):
        raise MeasuredFormatError(
            f"{source}: {fmt_desc}: run_index {run_index} out of range; the file holds {len(documents)} run(s)"
        )
    line_no, obj = documents[run_index]
    where = source if len(documents) == 1 else f"{source} line {line_no}"
    if not isinstance(obj, dict):
        raise MeasuredFormatError(f"{where}: not {fmt_desc}: expected a JSON object, got {type(obj).__name__}")
    return obj, where, line_no, len(documents)


def parse_bench_lists(
    obj: dict[str, Any], source: str, fmt_desc: str, hint: str
) -> tuple[list[int], list[int], list[float], list[list[float]], list[bool]]:
    """The per-request lists SGLang's and vLLM's bench scripts share: `input_lens`, `output_lens`, `ttfts`, `itls`
    and (optional) `errors`, validated to one entry per request.

    A request is successful when its error is empty and its ttft > 0 (both tools leave ttft at 0.0 and write a
    non-empty error, or at least output 0, for a failed request). Failed requests keep their lengths; their ttft and
    gaps are returned as given (the readers blank them).
    """
    missing = [k for k in ("input_lens", "output_lens", "ttfts", "itls") if k not in obj]
    if missing:
        names = ", ".join(f"'{k}'" for k in missing)
        raise MeasuredFormatError(f"{source}: not {fmt_desc}: missing {names} ({hint})")
    input_lens = require_list(obj, "input_lens", None, "input_lens", source, fmt_desc, hint)
    n = len(input_lens)
    output_lens = require_list(obj, "output_lens", n, "input_lens", source, fmt_desc, hint)
    ttfts = require_list(obj, "ttfts", n, "input_lens", source, fmt_desc, hint)
    itls = require_list(obj, "itls", n, "input_lens", source, fmt_desc, hint)
    errors = obj.get("errors")
    if errors is None:
        errors = [""] * n
    elif not isinstance(errors, list) or len(errors) != n:
        count = len(errors) if isinstance(errors, list) else show(errors)
        raise fail(
            source, fmt_desc, f"field 'errors' has {count} entries, expected {n} (one per request, as 'input_lens')"
        )
    prompts = [as_count(v, "input_lens", i, source, fmt_desc) for i, v in enumerate(input_lens)]
    outputs = [as_count(v, "output_lens", i, source, fmt_desc) for i, v in enumerate(output_lens)]
    ttft = [as_seconds(v, "ttfts", i, source, fmt_desc) for i, v in enumerate(ttfts)]
    gaps = [as_gaps(v, "itls", i, source, fmt_desc) for i, v in enumerate(itls)]
    success = [(not errors[i]) and ttft[i] > 0 for i in range(n)]
    return prompts, outputs, ttft, gaps, success
