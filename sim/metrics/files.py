"""Writing a run's tables: CSV or Parquet (``run.table_format``), one file per table.

A table ``name`` is written as ``name.csv`` or ``name.parquet`` (never both); ``plots.tables.read_table`` reads
either back (plots must not import the simulator, so the reader lives there). summary.csv is always CSV.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.config.files import resolve_table_format, table_format_problem

SUFFIXES = {"csv": ".csv", "parquet": ".parquet"}


def write_table(df: pd.DataFrame, out_dir: Path, name: str, table_format: str) -> Path:
    """Write ``df`` as ``out_dir/name.csv`` or ``name.parquet`` (``table_format``: auto, csv or parquet).

    Returns:
        The path written.

    Raises:
        ValueError: ``parquet`` without pyarrow installed (the message names the fix), or an unknown format.
    """
    fmt = resolve_table_format(table_format)
    if fmt not in SUFFIXES:
        raise ValueError(f"run.table_format: unknown {table_format!r} (known: auto, {', '.join(SUFFIXES)})")
    problem = table_format_problem(fmt)
    if problem:
        raise ValueError(f"run.table_format: {problem}")
    path = out_dir / f"{name}{SUFFIXES[fmt]}"
    if fmt == "parquet":
        # Dictionary encoding for every column but the float ones: times and durations are nearly all distinct, so
        # a dictionary only costs time (a third of the steps table's write) and bytes.
        dictionary = [name for name, dtype in df.dtypes.items() if dtype.kind != "f"]
        df.to_parquet(path, index=False, engine="pyarrow", use_dictionary=dictionary)
    else:
        df.to_csv(path, index=False)
    return path
