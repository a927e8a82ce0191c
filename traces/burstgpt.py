"""Reader for BurstGPT traces (HPMLL/BurstGPT, KDD'25: `BurstGPT_{1,2,3}.csv` and `BurstGPT_without_fails_*.csv`).

Format: CSV with the columns as the project publishes them,
`Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (`BurstGPT_3.csv` adds `Session ID` and
`Elapsed time` as columns 2-3):

- `Timestamp`: seconds from 0:00 of the trace's first day (`arrival_s` = Timestamp, the trace's own clock),
- `Request tokens`: prompt tokens, `Response tokens`: output tokens,
- `Model` (ChatGPT / GPT-4), `Log Type` (Conversation log / API log) and `Session ID` are kept as the extra
  columns `model`, `log_type` and `session_id`; `Total tokens` and `Elapsed time` are not used.

Failed requests: BurstGPT logs a failed request with `Response tokens` = 0. They are kept, as zero-output requests
(the simulator counts them finished with no first token and no TPOT), flagged in a boolean `failed` column and
counted in `df.attrs["num_failed"]`; filter on `failed` to drop them. Rows with `Request tokens` = 0 cannot be
simulated (no prompt) and are skipped, counted in `df.attrs["num_skipped_zero_prompt"]`. Nothing else is dropped:
other bad rows raise `TraceError` naming the file, line and field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.generic import ColumnMap, read_csv_trace

BURSTGPT_COLUMNS = ColumnMap(
    arrival="Timestamp",
    prompt_tokens="Request tokens",
    output_tokens="Response tokens",
    arrival_unit="s",
    optional=(("Model", "model"), ("Log Type", "log_type"), ("Session ID", "session_id")),
)


def read_burstgpt(path: str | Path) -> pd.DataFrame:
    """Read a BurstGPT CSV into a request table (`traces.schema`) plus `model`, `log_type`, (`session_id`) and
    `failed` columns.

    Args:
        path: the `.csv` file.

    Returns:
        Request table sorted stably by `arrival_s`. `attrs`: `source`, `format` ("burstgpt"), `num_blank_lines`,
        `num_resorted`, `num_failed` (rows with 0 response tokens, kept), `num_skipped_zero_prompt`.

    Raises:
        TraceError: see `traces.generic.read_csv_trace` (file, line and field named).
    """
    df = read_csv_trace(path, BURSTGPT_COLUMNS, fmt="burstgpt", skip_zero_prompt=True)
    failed = df["output_tokens"].to_numpy() == 0
    df["failed"] = failed
    df.attrs["num_failed"] = int(np.count_nonzero(failed))
    return df
