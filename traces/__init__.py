"""Request traces for PulseInfer: read, generate, shape and summarise request tables.

Every function here produces or consumes one schema, the request table of `traces.schema`: a DataFrame
with `REQUEST_COLUMNS` (`request_id`, `arrival_s`, `prompt_tokens`, `output_tokens`, `hash_ids`), sorted by
arrival.

- `load_trace` / `resolve_trace`: a shipped name (`SHIPPED_TRACES`) or a file path -> request table.
- `read_mooncake`: Mooncake JSONL file -> request table (bad rows raise `TraceError` with file, line, field).
- `synthetic_requests`: Poisson arrivals + lognormal lengths from an explicit `np.random.Generator`.
- `shape_requests`: window, prompt-length filter, max rows, rebase to 0 s, time scale / target rate.
- `trace_stats`: the summary numbers of `traces/data/README.md`.

This package is a leaf: it imports only the standard library, numpy and pandas.
"""

from traces.mooncake import read_mooncake
from traces.registry import SHIPPED_TRACES, load_trace, resolve_trace, trace_stats
from traces.schema import REQUEST_COLUMNS, TraceError
from traces.shape import shape_requests
from traces.synthetic import synthetic_requests

__all__ = [
    "REQUEST_COLUMNS",
    "SHIPPED_TRACES",
    "TraceError",
    "load_trace",
    "read_mooncake",
    "resolve_trace",
    "shape_requests",
    "synthetic_requests",
    "trace_stats",
]
