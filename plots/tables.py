"""Reading a results folder's tables back, in whichever format the run wrote them (CSV or Parquet).

``pulseinfer simulate`` writes ``name.parquet`` or ``name.csv`` per ``run.table_format`` (pulseinfer/tables_io.py);
summary.csv is always CSV. This module imports only pandas (plots must not import the simulator).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

PARQUET_INSTALL = "pip install 'pulseinfer[parquet]'"
# What a run writes (sim/metrics/tables.py): no number is ever ±inf; NaN only in the tables where a value can be
# undefined (a request that did not finish or was never issued; a summary metric with no sample); simulated time
# never runs below 0. A table breaking this was not written by the simulator, and no figure can draw it.
NAN_ALLOWED = frozenset({"requests", "summary"})
TIME_COLUMNS = {
    "steps": ("start_s", "duration_s"),
    "requests": ("arrival_s",),
    "layer_recall": ("time_s",),
    "timeline": ("start_s", "end_s"),
}


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


def value_problem(name: str, table: pd.DataFrame) -> str | None:
    """Why the figures cannot draw the table ``name`` (``steps``, ``steps.csv``, ...): its first numeric column
    holding ±inf, NaN (outside :data:`NAN_ALLOWED`) or a negative simulated time (:data:`TIME_COLUMNS`); None when
    every value is one a run writes. Columns that are not numeric are not looked at."""
    stem = name.removesuffix(".csv").removesuffix(".parquet")
    for column in table.select_dtypes("number").columns:
        values = table[column].to_numpy(dtype=float)
        if np.isinf(values).any():
            return f"{stem} column {column} holds an infinite value"
        if stem not in NAN_ALLOWED and np.isnan(values).any():
            return f"{stem} column {column} holds NaN"
        if column in TIME_COLUMNS.get(stem, ()) and (values < 0).any():
            return f"{stem} column {column} holds a negative time ({values.min():.6g} s)"
    return None
