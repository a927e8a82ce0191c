"""Reading a results folder for its report page: its tables, text files and figures, each read at most once.

A table that is missing or unreadable is None, never an exception: a report of a folder the user trimmed or a run
that stopped early still opens, with what is there and a note for what is not.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import yaml

from plots.tables import read_table, table_path

MAX_TEXT_BYTES = 256 * 1024  # a scenario or profile file larger than this is shown cut, with a note
FIGURE_FOLDERS = ("", "plots")  # where a command's figure files lie: the folder's top and its plots/ folder


class Folder:
    """A results folder as the report reads it; ``notes`` collects what could not be read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.notes: list[str] = []
        self._tables: dict[str, pd.DataFrame | None] = {}

    def has(self, name: str) -> bool:
        """Whether the folder holds the file ``name`` (a table also as its ``.parquet``)."""
        return (self.path / name).is_file() or (name.endswith(".csv") and table_path(self.path, name) is not None)

    def table(self, name: str) -> pd.DataFrame | None:
        """The table ``name`` (``x.csv`` or its ``x.parquet``), or None with a note when it cannot be read."""
        if name not in self._tables:
            found = None
            if self.has(name):
                try:
                    found = read_table(self.path, name)
                except (OSError, ValueError, ImportError, UnicodeDecodeError) as exc:
                    self.notes.append(f"{name}: cannot be read ({str(exc).splitlines()[0]})")
            self._tables[name] = found
        return self._tables[name]

    def text(self, name: str) -> str | None:
        """The text file ``name`` (cut at :data:`MAX_TEXT_BYTES`, with a line saying so), or None."""
        path = self.path / name
        if not path.is_file():
            return None
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_TEXT_BYTES + 1)
        except OSError as exc:
            self.notes.append(f"{name}: cannot be read ({exc.strerror})")
            return None
        text = data[:MAX_TEXT_BYTES].decode("utf-8", errors="replace")
        return text + ("\n... (cut: the file is longer)" if len(data) > MAX_TEXT_BYTES else "")

    def yaml(self, name: str) -> dict:
        """The YAML mapping in ``name``, or {} (missing, unreadable or not a mapping)."""
        text = self.text(name)
        try:
            data = yaml.safe_load(text) if text else None
        except (yaml.YAMLError, RecursionError):
            self.notes.append(f"{name}: not valid YAML (or nested too deep)")
            return {}
        if text and not isinstance(data, dict):
            self.notes.append(f"{name}: not a mapping of keys")
        return data if isinstance(data, dict) else {}

    def figure_files(self) -> list[Path]:
        """The PNG files of these results, in name order: those the folder's marker lists (at its top and in
        ``plots/``, drawn by the same run) and those ``plots/``'s own marker lists when ``pulseinfer plot`` drew
        them after these results were written (figures of an earlier run, carried over by a re-run, are left out);
        symbolic links and files of yours are left out too."""
        from pulseinfer.marker import Claims, claims_of, read_claims

        claims = claims_of(self.path) or Claims()
        found = []
        for sub in FIGURE_FOLDERS:
            folder = self.path / sub if sub else self.path
            if not folder.is_dir() or folder.is_symlink():
                continue
            owned = claims
            if sub:
                later = read_claims(folder) if _written_after(folder, self.path) else None
                owned = claims.below(sub) | (later or Claims())
            for path in sorted(folder.glob("*.png")):
                if path.is_file() and not path.is_symlink() and owned.owns(path.name, folder=False):
                    found.append(path)
        return found


def number(value: object) -> float:
    """``value`` as a float; NaN when it is not a finite number (a blank cell, a string)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def fmt(value: object, digits: int = 3, unit: str = "") -> str:
    """A number with ``digits`` significant digits (thousands separated) and ``unit``; "n/a" when not a number."""
    x = number(value)
    if math.isnan(x):
        return "n/a"
    text = f"{x:,.0f}" if abs(x) >= 10 ** (digits - 1) else f"{x:.{digits}g}"
    return f"{text}{(' ' + unit) if unit else ''}"


def slo_of(scenario: dict) -> dict:
    """The scenario's ``slo`` mapping (tpot_ms, ttft_s, ...), {} without one."""
    slo = scenario.get("slo") if isinstance(scenario, dict) else None
    return slo if isinstance(slo, dict) else {}


def _written_after(inner: Path, outer: Path) -> bool:
    """Whether the results folder ``inner`` (a ``plots/`` of ``pulseinfer plot``) was written no earlier than
    ``outer``: by their markers' recorded dates (UTC, to the second), else by the markers' file times."""
    from pulseinfer.marker import MARKER, read_provenance

    a, b = read_provenance(inner).get("written_at"), read_provenance(outer).get("written_at")
    if isinstance(a, str) and isinstance(b, str):
        return a >= b
    try:
        return (inner / MARKER).stat().st_mtime >= (outer / MARKER).stat().st_mtime
    except OSError:
        return False
