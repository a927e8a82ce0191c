"""ServeGen slices: per-client arrival-rate windows and length distributions, read and checked.

ServeGen (github.com/alibaba/ServeGen, Apache-2.0) does not publish requests but a statistical description of
each client of a production model, read here from commit f891d1189eb32b3868dfc443800c4150548c282a
(`servegen/clientpool.py` `ClientPool._load_data`, `servegen/construct.py` `generate_workload`,
`servegen/workload_types.py` `ClientWindow`, data under `data/<category>/<model>/`):

- `chunk-<client>-trace.csv`: no header, one row per 600 s window of the client's clock (all clients share the
  window times), six fields `timestamp,rate,cv,pattern,shape,scale`: window start (integer s), mean arrival rate
  (req/s), inter-arrival coefficient of variation, the fitted inter-arrival distribution ("Gamma", "Weibull", or
  "" when the client sent nothing: then rate, cv, shape and scale are 0) and its two parameters (Gamma: shape
  a, scale theta, as `scipy.stats.gamma(a, scale=theta)`; Weibull: shape c, scale lambda, as
  `scipy.stats.weibull_min(c, scale=lambda)`). A window lasts until the next row's timestamp (the last one: as
  long as the one before it).
- `chunk-<client>-dataset.json`: {window start (string, every 21,600 s): {"input_tokens": PDF, "output_tokens":
  PDF}} where each PDF is a *string* holding a Python dict literal `{tokens: probability, ...}` (ServeGen `eval`s
  it; read here by a strict parser, no `eval`); `"{}"` means no distribution for that window. A rate window uses
  the latest non-empty length window at or before its start (ServeGen's `_get_dataset_window`).

Generating requests from a slice: traces/servegen_traffic.py.

A slice is a folder of those file pairs, each file plain or gzip-compressed (`.gz`); the shipped one is
`data/servegen/language_m_large` (9 clients of ServeGen's `data/language/m-large`, 14 days; see its README).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from traces._table import show
from traces.schema import TraceError

SERVEGEN_COMMIT = "f891d1189eb32b3868dfc443800c4150548c282a"
DATA_DIR: Path = Path(__file__).parent / "data" / "servegen"
SHIPPED_SERVEGEN_SLICES: dict[str, str] = {"language_m_large": "language_m_large"}  # name -> folder under DATA_DIR
DEFAULT_SERVEGEN_SLICE = "language_m_large"

TRACE_FIELDS = ("timestamp", "rate", "cv", "pattern", "shape", "scale")
LENGTH_FIELDS = ("input_tokens", "output_tokens")
PATTERNS = ("", "Gamma", "Weibull")
NO_PATTERN, GAMMA, WEIBULL = 0, 1, 2  # codes of PATTERNS in ServeGenClient.pattern
_PDF_SUM_TOLERANCE = 1e-3  # a PDF must sum to 1 within this (ServeGen checks 1e-6 on its own synthetic clients)
_FILE = re.compile(r"chunk-(\d+)-(trace\.csv|dataset\.json)(\.gz)?")


@dataclass(frozen=True)
class LengthWindow:
    """One non-empty length window of a client: token values (sorted) and their cumulative probabilities."""

    start_s: float
    input_values: np.ndarray  # int64
    input_cdf: np.ndarray  # float64, last entry 1
    output_values: np.ndarray
    output_cdf: np.ndarray


@dataclass(frozen=True)
class ServeGenClient:
    """One ServeGen client: per rate window (aligned with `ServeGenSlice.window_start_s`) its rate, cv and
    fitted pattern (0 none, 1 Gamma, 2 Weibull), shape and scale; and its non-empty length windows."""

    client_id: int
    rate: np.ndarray
    cv: np.ndarray
    pattern: np.ndarray  # int8 codes
    shape: np.ndarray
    scale: np.ndarray
    lengths: tuple[LengthWindow, ...]
    num_empty_length_windows: int = 0


@dataclass(frozen=True)
class ServeGenSlice:
    """A folder of ServeGen clients on one clock: window starts and ends (s) and the clients by id."""

    name: str
    path: Path
    window_start_s: np.ndarray
    window_end_s: np.ndarray
    clients: tuple[ServeGenClient, ...]
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        return float(self.window_end_s[-1])

    def window_rates(self) -> np.ndarray:
        """float64 [num_clients, num_windows]: each client's recorded rate per window (0 when inactive)."""
        return np.stack([c.rate for c in self.clients]) if self.clients else np.zeros((0, len(self.window_start_s)))


def resolve_servegen_slice(name_or_path: str | Path) -> Path:
    """A shipped slice name (`SHIPPED_SERVEGEN_SLICES`) or a folder path -> the folder; TraceError otherwise."""
    if isinstance(name_or_path, str) and name_or_path in SHIPPED_SERVEGEN_SLICES:
        path = DATA_DIR / SHIPPED_SERVEGEN_SLICES[name_or_path]
        if not path.is_dir():
            raise TraceError(f"shipped ServeGen slice {name_or_path!r} is missing its folder {path}; reinstall")
        return path
    path = Path(name_or_path)
    if path.is_dir():
        return path
    raise TraceError(
        f"no such ServeGen slice folder or shipped slice name {str(name_or_path)!r} "
        f"(shipped: {', '.join(SHIPPED_SERVEGEN_SLICES)}; a folder of chunk-N-trace.csv / chunk-N-dataset.json)"
    )


def read_servegen(name_or_path: str | Path = DEFAULT_SERVEGEN_SLICE) -> ServeGenSlice:
    """Read a ServeGen slice: every `chunk-N-trace.csv[.gz]` with its `chunk-N-dataset.json[.gz]` in a folder.

    A trace file without a dataset file gives a client with no length windows (usable only with
    `servegen_requests(..., lengths_from=...)`); a dataset file without its trace file is an error.

    Raises:
        TraceError: one line naming the file, line and field of a malformed row, a window clock that differs
            between clients, a missing trace file, or a folder with no trace files.
    """
    folder = resolve_servegen_slice(name_or_path)
    files: dict[int, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        match = _FILE.fullmatch(path.name)
        if match:
            kind = "trace" if match.group(2).startswith("trace") else "dataset"
            slot = files.setdefault(int(match.group(1)), {})
            if kind in slot:
                raise TraceError(f"{path}: client {match.group(1)} has two {kind} files ({slot[kind].name} too)")
            slot[kind] = path
    if not any("trace" in f for f in files.values()):
        raise TraceError(f"{folder}: no chunk-N-trace.csv files; expected a ServeGen data/<category>/<model> folder")
    starts: np.ndarray | None = None
    first: Path | None = None
    clients = []
    for client_id in sorted(files):
        pair = files[client_id]
        if "trace" not in pair:
            raise TraceError(f"{pair['dataset']}: no trace file chunk-{client_id}-trace.csv next to it")
        window_s, columns = _read_trace_csv(pair["trace"])
        if starts is None:
            starts, first = window_s, pair["trace"]
        elif len(window_s) != len(starts) or not np.array_equal(window_s, starts):
            row = _first_difference(window_s, starts)
            raise TraceError(
                f"{pair['trace']} line {row + 1}: field 'timestamp': window clock differs from {first.name} "
                f"(expected {_at(starts, row)}, got {_at(window_s, row)})"
            )
        lengths, num_empty = _read_dataset(pair["dataset"]) if "dataset" in pair else ((), 0)
        clients.append(ServeGenClient(client_id, *columns, lengths=lengths, num_empty_length_windows=num_empty))
    assert starts is not None
    last_len = starts[-1] - starts[-2] if len(starts) > 1 else 600.0
    ends = np.append(starts[1:], starts[-1] + last_len)
    name = str(name_or_path) if isinstance(name_or_path, str) else folder.name
    notes = {
        "num_clients_without_lengths": sum(1 for c in clients if not c.lengths),
        "num_empty_length_windows": sum(c.num_empty_length_windows for c in clients),
    }
    return ServeGenSlice(name, folder, starts, ends, tuple(clients), notes)


def _at(values: np.ndarray, i: int) -> str:
    return f"{values[i]:g}" if i < len(values) else "no row"


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read ServeGen file ({e})") from None


def _read_trace_csv(path: Path) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Window starts and (rate, cv, pattern code, shape, scale) arrays of one trace CSV."""
    rows = []
    previous = -math.inf
    for line_no, cells in enumerate(csv.reader(io.StringIO(_read_text(path))), start=1):
        if not cells or all(not c.strip() for c in cells):
            continue
        where = f"{path} line {line_no}"
        if len(cells) != len(TRACE_FIELDS):
            raise TraceError(f"{where}: expected {len(TRACE_FIELDS)} fields {','.join(TRACE_FIELDS)}, got {len(cells)}")
        ts = _number(cells[0], "timestamp", where)
        if ts <= previous:
            raise TraceError(f"{where}: field 'timestamp': expected a value above the previous row's, got {cells[0]!r}")
        previous = ts
        rate, cv = _number(cells[1], "rate", where), _number(cells[2], "cv", where)
        pattern = cells[3].strip()
        if pattern not in PATTERNS:
            raise TraceError(f"{where}: field 'pattern': expected Gamma, Weibull or empty, got {show(cells[3])}")
        shape, scale = _number(cells[4], "shape", where), _number(cells[5], "scale", where)
        if pattern and (shape <= 0 or scale <= 0):
            bad, text = ("shape", cells[4]) if shape <= 0 else ("scale", cells[5])
            raise TraceError(f"{where}: field '{bad}': expected > 0 for pattern {pattern}, got {text!r}")
        rows.append((ts, rate, cv, PATTERNS.index(pattern), shape, scale))
    if not rows:
        raise TraceError(f"{path}: no rows; expected {','.join(TRACE_FIELDS)} per 600 s window")
    table = np.array(rows, dtype=np.float64)
    return table[:, 0], (table[:, 1], table[:, 2], table[:, 3].astype(np.int8), table[:, 4], table[:, 5])


def _number(text: str, name: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: field '{name}': expected a non-negative number, got {show(text)}")
    return value


def _read_dataset(path: Path) -> tuple[tuple[LengthWindow, ...], int]:
    """The non-empty length windows of one dataset JSON (sorted by start) and the number of empty ones."""
    text = _read_text(path)
    try:
        data = json.loads(text)
    except ValueError as e:
        line = getattr(e, "lineno", "?")
        raise TraceError(f"{path} line {line}: not JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path} line 1: expected an object of window start -> length PDFs, got {type(data).__name__}")
    windows, num_empty = [], 0
    for key, fields in data.items():
        try:
            start = float(int(key))
        except ValueError:
            raise TraceError(
                f"{path} line {_line_of(text, key)}: window key: expected an integer start time in s, got {show(key)}"
            ) from None
        if not isinstance(fields, dict) or any(name not in fields for name in LENGTH_FIELDS):
            raise TraceError(
                f"{path} line {_line_of(text, key)}: window {key}: expected an object with fields "
                f"{', '.join(LENGTH_FIELDS)}, got {show(fields)}"
            )
        pdfs = []
        for name in LENGTH_FIELDS:
            try:
                pdfs.append(_pdf(fields[name]))
            except ValueError as e:
                raise TraceError(f"{path} line {_line_of(text, key, name)}: field '{name}': {e}") from None
        if any(p is None for p in pdfs):
            num_empty += 1
            continue
        (iv, ic), (ov, oc) = pdfs
        windows.append(LengthWindow(start, iv, ic, ov, oc))
    windows.sort(key=lambda w: w.start_s)
    return tuple(windows), num_empty


def _line_of(text: str, key: str, name: str | None = None) -> int:
    """1-based line of window `key` (and its field `name`) in a dataset file's text (for error messages)."""
    at = text.find(json.dumps(key) + ":")
    if at >= 0 and name is not None:
        found = text.find(json.dumps(name), at)
        at = found if found >= 0 else at
    return text.count("\n", 0, max(at, 0)) + 1


def _pdf(value: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(sorted token values, CDF) of a PDF given as ServeGen's dict-literal string `{tokens: probability, ...}`
    (or a JSON object); None if empty. ValueError (message without the location) if malformed."""
    if isinstance(value, dict):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    elif isinstance(value, str):
        body = value.strip()
        if not (body.startswith("{") and body.endswith("}")):
            raise ValueError(f"expected a dict literal '{{tokens: probability, ...}}', got {show(value)}")
        items = [item for item in body[1:-1].split(",") if item.strip()]
        pairs = [item.partition(":")[::2] if ":" in item else (item, "") for item in items]
    else:
        raise ValueError(f"expected a PDF string or object, got {show(value)}")
    if not pairs:
        return None
    try:
        tokens = np.array([int(k) for k, _ in pairs], dtype=np.int64)
        probs = np.array([float(v) for _, v in pairs], dtype=np.float64)
    except ValueError:
        bad = next(f"{k.strip()}: {v.strip()}" for k, v in pairs if not _is_entry(k, v))
        raise ValueError(f"entry {show(bad)}: expected 'tokens: probability' (integer: number)") from None
    if (tokens < 0).any() or not np.isfinite(probs).all() or (probs < 0).any():
        i = int(np.flatnonzero((tokens < 0) | ~np.isfinite(probs) | (probs < 0))[0])
        raise ValueError(f"entry {show(f'{tokens[i]}: {probs[i]}')}: expected tokens >= 0 and probability >= 0")
    total = float(probs.sum())
    if abs(total - 1.0) > _PDF_SUM_TOLERANCE:
        raise ValueError(f"probabilities sum to {total:.6g}, expected 1")
    order = np.argsort(tokens, kind="stable")
    cdf = np.cumsum(probs[order]) / total
    cdf[-1] = 1.0
    return tokens[order], cdf


def _is_entry(key: str, prob: str) -> bool:
    try:
        int(key)
        float(prob)
    except ValueError:
        return False
    return True
