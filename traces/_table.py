"""Helpers shared by the trace readers: value checks that raise one-line `TraceError`s, timestamp parsing and
assembling the sorted request table with its extra columns and `df.attrs`.

Every check takes `where` (e.g. `traces/data/x.csv line 12`) and names the field, the value found and what was
expected, so each reader's error messages read the same.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.schema import REQUEST_COLUMNS, TraceError

MAX_SHOWN_CHARS = 60  # longest repr of an offending value quoted in an error message
INT64_LIMIT = 2**63  # token counts must fit the int64 columns
NS_PER_S = 1_000_000_000

_EPOCH = datetime(1970, 1, 1)
_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?\s*(Z|[+-]\d{2}(?::?\d{2})?)?"
)


def show(value: Any) -> str:
    """Short repr of an offending value for an error message."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def read_bytes(path: str | Path) -> bytes:
    """The whole file; TraceError if it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a folder; expected a trace file") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read trace file ({e.strerror or e})") from None


def count(value: Any, name: str, minimum: int, where: str) -> int:
    """A token count: an int, an integral float (12.0) or, from text formats, a string holding one; >= `minimum`.

    Raises:
        TraceError: naming `where`, the field `name`, the value and the expected range. Bools are rejected.
    """
    number = value
    if isinstance(number, str):
        text = number.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    if type(number) is float and number.is_integer():
        number = int(number)
    if type(number) is int and minimum <= number < INT64_LIMIT:
        return number
    expected = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
    raise TraceError(f"{where}: field '{name}': expected {expected}, got {show(value)}")


def seconds(value: Any, name: str, where: str, unit: str = "seconds") -> float:
    """A non-negative finite time: a number or, from text formats, a string holding one (RAGPulse writes
    `"timestamp": "82"`). Bools are rejected."""
    number = value
    if isinstance(number, str):
        try:
            number = float(number.strip())
        except ValueError:
            number = None
    if type(number) in (int, float) and math.isfinite(number) and number >= 0:
        return float(number)
    raise TraceError(f"{where}: field '{name}': expected a non-negative number ({unit}), got {show(value)}")


def datetime_ns(value: Any, name: str, where: str) -> tuple[int, bool]:
    """Parse `YYYY-MM-DD HH:MM:SS[.fffffffff][Z|+HH:MM]` (space or `T`) into integer ns since 1970 (UTC when an
    offset is given) and whether it carried an offset. Up to 9 fractional digits are kept exactly (Azure writes 7,
    more than `datetime` holds)."""
    match = _DATETIME.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise TraceError(
            f"{where}: field '{name}': expected a datetime like '2023-11-16 18:17:03.9799600', got {show(value)}"
        )
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError as e:
        raise TraceError(f"{where}: field '{name}': invalid datetime {show(value)} ({e})") from None
    delta = moment - _EPOCH
    total_ns = (delta.days * 86400 + delta.seconds) * NS_PER_S + int((fraction or "0").ljust(9, "0"))
    if offset is not None and offset != "Z":
        sign = -1 if offset[0] == "-" else 1
        digits = offset[1:].replace(":", "")
        shift = timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
        total_ns -= sign * int(shift.total_seconds()) * NS_PER_S
    return total_ns, offset is not None


def format_ns(total_ns: int, aware: bool) -> str:
    """ISO text of ns since 1970 (the clock origin recorded in `df.attrs`)."""
    whole_s, frac_ns = divmod(total_ns, NS_PER_S)
    text = (_EPOCH + timedelta(seconds=whole_s)).isoformat(sep=" ")
    if frac_ns:
        text += "." + f"{frac_ns:09d}".rstrip("0")
    return text + "+00:00" if aware else text


def build_table(
    arrival_s: np.ndarray,
    prompt_tokens: list[int],
    output_tokens: list[int],
    hash_ids: list[list[int]] | None,
    extra: dict[str, Any],
    attrs: dict[str, Any],
    sort: bool = True,
) -> pd.DataFrame:
    """Assemble a request table: `REQUEST_COLUMNS` then `extra` columns, sorted stably by arrival (unless `sort`
    is False: session tables, whose arrivals are on per-session clocks).

    `request_id` is the 0-based position in the source (so it still names the source row after sorting).
    `attrs` gets `num_resorted`: rows whose arrival was earlier than some row above them in the source (the rows
    that sorting moved); with `sort` False the caller sets it.
    """
    arrivals = np.asarray(arrival_s, dtype=np.float64)
    n = len(arrivals)
    num_resorted = count_resorted(arrivals) if sort else 0
    columns: dict[str, Any] = {
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": arrivals,
        "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
        "output_tokens": np.asarray(output_tokens, dtype=np.int64),
        "hash_ids": pd.Series(hash_ids if hash_ids is not None else [[] for _ in range(n)], dtype=object),
    }
    columns.update(extra)
    df = pd.DataFrame(columns, columns=[*REQUEST_COLUMNS, *extra])
    if num_resorted:
        order = np.argsort(arrivals, kind="stable")
        df = df.iloc[order].reset_index(drop=True)
    df.attrs.update(attrs)
    if sort:
        df.attrs["num_resorted"] = num_resorted
    return df


def count_resorted(values: np.ndarray) -> int:
    """Rows whose value is below some value above them (the rows a stable sort moves)."""
    if len(values) < 2:
        return 0
    return int(np.count_nonzero(values[1:] < np.maximum.accumulate(values)[:-1]))
