"""Reader for the Azure LLM inference traces (Azure/AzurePublicDataset, 2023 Splitwise and 2024 DynamoLLM).

Format: CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens` (CRLF line endings in the published files):

- `TIMESTAMP`: wall-clock datetime, e.g. `2023-11-16 18:17:03.9799600` (7 fractional digits, no time zone, 2023)
  or with `+00:00` (2024); parsed to the 100 ns exactly,
- `ContextTokens`: prompt tokens (integer >= 1), `GeneratedTokens`: output tokens (integer >= 0).

`arrival_s` = seconds since the earliest TIMESTAMP, which is kept in `df.attrs["clock_origin"]`. Errors and
blank lines as in `traces.generic`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from traces.generic import ColumnMap, read_csv_trace

AZURE_COLUMNS = ColumnMap(
    arrival="TIMESTAMP", prompt_tokens="ContextTokens", output_tokens="GeneratedTokens", arrival_unit="datetime"
)


def read_azure(path: str | Path) -> pd.DataFrame:
    """Read an Azure LLM inference CSV into a request table (`traces.schema`).

    Args:
        path: the `.csv` file.

    Returns:
        Request table sorted stably by `arrival_s` (seconds since the first request). `attrs`: `source`, `format`
        ("azure"), `clock_origin` (the earliest TIMESTAMP), `num_blank_lines`, `num_resorted`.

    Raises:
        TraceError: see `traces.generic.read_csv_trace` (file, line and field named).
    """
    return read_csv_trace(path, AZURE_COLUMNS, fmt="azure")
