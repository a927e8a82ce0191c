"""Writing a run's tables: :func:`write_result` puts a ``SimResult`` (sim/run.py) on disk, one file per table, CSV
or Parquet (``run.table_format``).

A table ``name`` is written as ``name.csv`` or ``name.parquet`` (never both); ``plots.tables.read_table`` reads
either back (plots must not import the simulator, so the reader lives there). summary.csv is always CSV.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.config import dump_scenario
from sim.config.files import resolve_table_format, table_format_problem
from sim.run import SimResult

SUFFIXES = {"csv": ".csv", "parquet": ".parquet"}
# PolicyResult's per-policy tables, in order (``replica_series``: a fleet's, sim.metrics.fleet_summary.SERIES_COLUMNS)
TABLES = ("requests", "steps", "layers", "layer_recall", "timeline", "replica_series")


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


def write_result(result: SimResult, out_dir: Path) -> list[str]:
    """Write summary.csv, the requests/steps/layers/layer_recall/timeline tables (with a ``policy`` column;
    ``.parquet`` or ``.csv`` per ``run.table_format``) and scenario.yaml. With ``run.tables: summary`` only
    summary.csv, the requests table and scenario.yaml; a fleet (``serving.replicas`` > 1) writes summary.csv,
    replicas.csv, the requests table, the replica_series table (each replica's samples over time, with a
    ``policy`` column) and scenario.yaml.

    Returns:
        The names of the files written, in order.

    Raises:
        ValueError: ``run.table_format: parquet`` without pyarrow (the message names the fix).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    result.summary.to_csv(out_dir / "summary.csv", index=False)
    written = ["summary.csv"]
    replicas = result.replicas
    if replicas is not None:
        replicas.to_csv(out_dir / "replicas.csv", index=False)
        written.append("replicas.csv")
    for name in TABLES:
        frames = [getattr(r, name) for r in result.policies.values()]
        if any(f is None for f in frames):  # not kept (run.tables: summary; a fleet's series: one replica)
            continue
        frames = [f.assign(policy=p) for f, p in zip(frames, result.policies)]
        df = pd.concat(frames, ignore_index=True)
        df = df[["policy"] + [c for c in df.columns if c != "policy"]]
        written.append(write_table(df, out_dir, name, result.scenario.run.table_format).name)
    dump_scenario(result.scenario, out_dir / "scenario.yaml")
    return [*written, "scenario.yaml"]
