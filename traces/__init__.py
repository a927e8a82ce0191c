"""Request traces for PulseInfer: read, generate, shape and summarise request tables.

Every function here produces or consumes one schema, the request table of `traces.schema`: a DataFrame
with `REQUEST_COLUMNS` (`request_id`, `arrival_s`, `prompt_tokens`, `output_tokens`, `hash_ids`), sorted by
arrival.

- `load_trace` / `resolve_trace`: a shipped name (`SHIPPED_TRACES`) or a file path -> request table; the format
  comes from `fmt` or `detect_format`.
- Readers (bad rows raise `TraceError` with file, line, field): `read_mooncake` (Mooncake JSONL), `read_azure`
  (Azure 2023/2024 CSV), `read_ragpulse` (RAGPulse JSONL, one week), `read_burstgpt` (BurstGPT CSV, failed rows
  flagged), `read_kvcache_tester` (agentic sessions -> a session table), `read_csv_trace` / `read_jsonl_trace`
  (any CSV/JSONL through a `ColumnMap`).
- `synthetic_requests`: Poisson arrivals + lognormal lengths from an explicit `np.random.Generator`.
- `traces.servegen` / `traces.servegen_traffic`: `read_servegen` / `servegen_requests`, ServeGen's
  per-client rate windows and length distributions (a slice folder; `SHIPPED_SERVEGEN_SLICES`) -> a request
  table at a target rate (`lengths_from=` another table).
- `shape_requests`: window, prompt-length filter, max rows, rebase to 0 s, time scale / target rate;
  `shape_sessions`: the same role for session tables (max sessions, prompt filter, think-time cap).
- `trace_stats`: the summary numbers of `traces/data/README.md`; `trace_notes`: what reading and shaping did.

This package is a leaf: it imports only the standard library, numpy and pandas.
"""

from traces.azure import read_azure
from traces.burstgpt import read_burstgpt
from traces.generic import ColumnMap, read_csv_trace, read_jsonl_trace
from traces.kvcache_tester import read_kvcache_tester
from traces.mooncake import read_mooncake
from traces.ragpulse import read_ragpulse
from traces.registry import (
    FORMATS,
    SHIPPED_TRACES,
    detect_format,
    load_trace,
    resolve_trace,
    trace_notes,
    trace_stats,
)
from traces.schema import REQUEST_COLUMNS, SESSION_COLUMNS, TraceError, is_session_table
from traces.servegen import SHIPPED_SERVEGEN_SLICES, ServeGenSlice, read_servegen
from traces.servegen_traffic import servegen_requests
from traces.shape import shape_requests, shape_sessions
from traces.synthetic import synthetic_requests

__all__ = [
    "FORMATS",
    "REQUEST_COLUMNS",
    "SESSION_COLUMNS",
    "SHIPPED_SERVEGEN_SLICES",
    "SHIPPED_TRACES",
    "ColumnMap",
    "ServeGenSlice",
    "TraceError",
    "detect_format",
    "is_session_table",
    "load_trace",
    "read_azure",
    "read_burstgpt",
    "read_csv_trace",
    "read_jsonl_trace",
    "read_kvcache_tester",
    "read_mooncake",
    "read_ragpulse",
    "read_servegen",
    "resolve_trace",
    "servegen_requests",
    "shape_requests",
    "shape_sessions",
    "synthetic_requests",
    "trace_notes",
    "trace_stats",
]
