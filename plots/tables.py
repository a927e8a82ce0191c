"""Reading a results folder's tables back, in whichever format the run wrote them (CSV or Parquet).

``pulseinfer simulate`` writes ``name.parquet`` or ``name.csv`` per ``run.table_format`` (sim/metrics/files.py);
summary.csv is always CSV. This module imports only pandas (plots must not import the simulator).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

PARQUET_INSTALL = "pip install 'pulseinfer[parquet]'"


def table_path(out_dir: Path, name: str) -> Path | None:
    """``out_dir/name.parquet`` if it exists, else ``out_dir/name.csv`` if it exists, else None.

    ``name`` may carry its ``.csv`` suffix (``steps.csv``): the Parquet file of the same table is still found.
    """
    stem = name.removesuffix(".csv").removesuffix(".parquet")
    for suffix in (".parquet", ".csv"):
        path = Path(out_dir) / f"{stem}{suffix}"
        if path.is_file():
            return path
    return None


def read_table(out_dir: Path, name: str) -> pd.DataFrame:
    """The table ``name`` (``steps``, ``requests``, ``layers``, ...) of a results folder, CSV or Parquet.

    Raises:
        FileNotFoundError: neither ``name.parquet`` nor ``name.csv`` is in ``out_dir``.
        ImportError: the table is Parquet and pyarrow is not installed (the message names the fix).
        pandas.errors.ParserError, pandas.errors.EmptyDataError: an unreadable CSV.
    """
    path = table_path(out_dir, name)
    if path is None:
        stem = name.removesuffix(".csv").removesuffix(".parquet")
        raise FileNotFoundError(f"no {stem}.csv or {stem}.parquet in {out_dir}")
    if path.suffix == ".parquet":
        if importlib.util.find_spec("pyarrow") is None:
            raise ImportError(f"{path} is Parquet and pyarrow is not installed: {PARQUET_INSTALL}")
        return pd.read_parquet(path, engine="pyarrow")
    return pd.read_csv(path)
