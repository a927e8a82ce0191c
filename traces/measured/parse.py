"""What every measured-run reader shares to read a file and check a value: the file read whole with its size and
nesting bounded, JSON documents (one, or one per line), one run of a multi-run file, the per-request lists SGLang's
and vLLM's clients share, and value checks (counts, seconds, timestamps, gaps, rates, concurrency) that raise
`MeasuredFormatError` in one line naming file, format, field and index. Standard library only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from traces.measured.schema import MeasuredFormatError

_MAX_SHOWN_CHARS = 60  # an offending value is shown up to this many characters
_INT64_LIMIT = 2**63


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
