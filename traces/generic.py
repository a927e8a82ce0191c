"""Generic CSV and JSON Lines readers driven by a column mapping (`ColumnMap`), and the core the Azure and BurstGPT
readers share.

A mapping names three source columns (keys, for JSONL) and the arrival unit:

- `arrival`: arrival time; `arrival_unit` "s", "ms" or "us" (a non-negative number, or a string holding one, on the
  trace's own clock: `arrival_s` = value / 1, 1e3 or 1e6) or "datetime" (`YYYY-MM-DD HH:MM:SS[.f...]`, space or
  `T`, optional `Z` / `+HH:MM`; up to 9 fractional digits kept exactly; `arrival_s` = seconds since the earliest
  row, whose datetime goes to `df.attrs["clock_origin"]`),
- `prompt_tokens`: integer >= 1,
- `output_tokens`: integer >= 0 (0 is allowed: the simulator counts such a request finished with no first token),

plus `optional`: (source column, table column) pairs copied into extra columns when the source has them (text as
written, for CSV; the JSON value, for JSONL). Other columns are ignored.

CSV: UTF-8 (a BOM is skipped), any line ending (Azure writes CRLF), first row = header, quoted fields as the `csv`
module reads them. JSONL: one JSON object per line. Blank lines are skipped and counted (`num_blank_lines`);
every other bad row raises `TraceError` naming the file, the 1-based line and the field. Rows come back sorted
stably by arrival with the number of rows sorting moved in `num_resorted`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces._table import NS_PER_S, build_table, count, datetime_ns, format_ns, read_bytes, seconds, show
from traces.schema import TraceError

ARRIVAL_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e3, "us": 1e6}  # divisor to seconds; plus "datetime"
_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}


@dataclass(frozen=True)
class ColumnMap:
    """Which source columns hold the arrival time, the prompt and the output token counts.

    Raises:
        ValueError: if a column name is empty or `arrival_unit` is not one of s, ms, us, datetime.
    """

    arrival: str
    prompt_tokens: str
    output_tokens: str
    arrival_unit: str = "s"  # s | ms | us | datetime
    optional: tuple[tuple[str, str], ...] = ()  # (source column, table column), copied when present

    def __post_init__(self) -> None:
        for field in ("arrival", "prompt_tokens", "output_tokens"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise ValueError(f"columns.{field} must be a non-empty column name, got {getattr(self, field)!r}")
        if self.arrival_unit not in (*ARRIVAL_UNITS, "datetime"):
            raise ValueError(f"columns.arrival_unit must be one of s, ms, us, datetime, got {self.arrival_unit!r}")


class _Rows:
    """Column lists accumulated row by row, validated as they come."""

    def __init__(self, columns: ColumnMap, source: str, skip_zero_prompt: bool) -> None:
        self.columns, self.source, self.skip_zero_prompt = columns, source, skip_zero_prompt
        self.arrival: list[float | int] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.extra: dict[str, list[Any]] = {target: [] for _, target in columns.optional}
        self.aware: bool | None = None  # datetime unit: whether the rows carry a UTC offset
        self.num_blank_lines = 0
        self.num_skipped_zero_prompt = 0

    def add(self, get: Callable[[str], Any], present: Callable[[str], bool], line_no: int) -> None:
        """Validate one row (`get(column)` returns its raw value) and append it."""
        c, where = self.columns, f"{self.source} line {line_no}"
        raw_arrival = get(c.arrival)
        if c.arrival_unit == "datetime":
            value_ns, aware = datetime_ns(raw_arrival, c.arrival, where)
            if self.aware is None:
                self.aware = aware
            elif aware != self.aware:
                have = "has" if aware else "lacks"
                raise TraceError(
                    f"{where}: field '{c.arrival}': {show(raw_arrival)} {have} a UTC offset, unlike the rows above; "
                    "expected every timestamp with an offset or none"
                )
            arrival: float | int = value_ns
        else:
            value = seconds(raw_arrival, c.arrival, where, _UNIT_WORDS[c.arrival_unit])
            arrival = value / ARRIVAL_UNITS[c.arrival_unit] if c.arrival_unit != "s" else value
        prompt = count(get(c.prompt_tokens), c.prompt_tokens, 0 if self.skip_zero_prompt else 1, where)
        output = count(get(c.output_tokens), c.output_tokens, 0, where)
        if prompt == 0:
            self.num_skipped_zero_prompt += 1
            return
        self.arrival.append(arrival)
        self.prompt.append(prompt)
        self.output.append(output)
        for name, target in c.optional:
            self.extra[target].append(get(name) if present(name) else None)

    def table(self, fmt: str, num_lines: int) -> pd.DataFrame:
        if not self.arrival:
            skipped = f", {self.num_skipped_zero_prompt} rows with 0 prompt tokens skipped" * bool(
                self.num_skipped_zero_prompt
            )
            raise TraceError(f"{self.source}: no requests ({num_lines} lines{skipped}); expected one request per row")
        attrs: dict[str, Any] = {"source": self.source, "format": fmt, "num_blank_lines": self.num_blank_lines}
        if self.skip_zero_prompt:
            attrs["num_skipped_zero_prompt"] = self.num_skipped_zero_prompt
        if self.columns.arrival_unit == "datetime":
            stamps = np.asarray(self.arrival, dtype=np.int64)
            origin = int(stamps.min())
            arrival_s = (stamps - origin) / NS_PER_S
            attrs["clock_origin"] = format_ns(origin, bool(self.aware))
        else:
            arrival_s = np.asarray(self.arrival, dtype=np.float64)
        extra = {  # an optional column no row has is left out
            target: pd.Series(values, dtype=object)
            for target, values in self.extra.items()
            if any(v is not None for v in values)
        }
        return build_table(arrival_s, self.prompt, self.output, None, extra, attrs)


def read_csv_trace(
    path: str | Path, columns: ColumnMap, *, fmt: str = "csv", skip_zero_prompt: bool = False
) -> pd.DataFrame:
    """Read a CSV trace through a column mapping into a request table (`traces.schema`).

    Args:
        path: the `.csv` file (first row = header).
        columns: which columns hold arrival, prompt and output tokens (see the module docstring).
        fmt: the format name recorded in `df.attrs["format"]`.
        skip_zero_prompt: skip rows with 0 prompt tokens, counted in `attrs["num_skipped_zero_prompt"]`, instead
            of rejecting them (BurstGPT).

    Returns:
        Request table sorted stably by `arrival_s`, `request_id` = 0-based position among the kept data rows
        (file order), plus the mapped optional columns that any row has. `attrs`: `source`, `format`,
        `num_blank_lines`, `num_resorted`, `clock_origin` (datetime arrivals) and `num_skipped_zero_prompt`
        (with `skip_zero_prompt`).

    Raises:
        TraceError: unreadable or non-UTF-8 file, no header, a mapped column missing from the header, a row with
            the wrong number of fields, a bad arrival or token count (file, line and field named), or no rows.
    """
    source = str(path)
    text = _decode(read_bytes(path), source)
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    index: dict[str, int] = {}
    rows = _Rows(columns, source, skip_zero_prompt)
    try:
        for row in reader:
            line_no = reader.line_num
            if not any(cell.strip() for cell in row):
                rows.num_blank_lines += 1
                continue
            if header is None:
                header = [cell.strip() for cell in row]
                index = {name: i for i, name in enumerate(header)}
                for name in (columns.arrival, columns.prompt_tokens, columns.output_tokens):
                    if name not in index:
                        raise TraceError(
                            f"{source} line {line_no}: column '{name}' missing from the header; columns present: "
                            f"{header}"
                        )
                continue
            if len(row) != len(header):
                raise TraceError(
                    f"{source} line {line_no}: expected {len(header)} fields ({', '.join(header)}), got {len(row)}: "
                    f"{show(','.join(row))}"
                )
            rows.add(lambda name, row=row, index=index: row[index[name]], index.__contains__, line_no)
    except csv.Error as e:
        raise TraceError(f"{source} line {reader.line_num}: unreadable CSV ({e})") from None
    if header is None:
        raise TraceError(f"{source}: empty file; expected a header row and one request per row")
    return rows.table(fmt, reader.line_num)


def read_jsonl_trace(
    path: str | Path, columns: ColumnMap, *, fmt: str = "jsonl", skip_zero_prompt: bool = False
) -> pd.DataFrame:
    """Read a JSON Lines trace through a column mapping (keys of each object) into a request table.

    Args and Returns: as `read_csv_trace`.

    Raises:
        TraceError: unreadable file, a line that is not a JSON object, a mapped key missing, a bad arrival or
            token count (file, line and field named), or no rows.
    """
    source = str(path)
    lines = read_bytes(path).splitlines()
    rows = _Rows(columns, source, skip_zero_prompt)
    for line_no, raw in enumerate(lines, start=1):
        if not raw.strip():
            rows.num_blank_lines += 1
            continue
        obj = parse_json_object(raw, source, line_no)
        rows.add(lambda name, obj=obj, n=line_no: field(obj, name, f"{source} line {n}"), obj.__contains__, line_no)
    return rows.table(fmt, len(lines))


def parse_json_object(raw: bytes, source: str, line_no: int) -> dict[str, Any]:
    """One JSONL line as a dict, or a TraceError naming the line."""
    where = f"{source} line {line_no}"
    try:
        obj = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
        raise TraceError(f"{where}: invalid JSON ({e}); expected one JSON object per line") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__} {show(obj)}")
    return obj


def field(obj: dict[str, Any], name: str, where: str) -> Any:
    """`obj[name]`, or a TraceError naming the missing field."""
    try:
        return obj[name]
    except KeyError:
        raise TraceError(f"{where}: field '{name}': missing; keys present: {sorted(obj)}") from None


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line_no = data[: e.start].count(b"\n") + 1
        raise TraceError(f"{source} line {line_no}: not UTF-8 text ({e.reason}); expected a UTF-8 CSV file") from None
