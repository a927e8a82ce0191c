"""Human-readable rendering of the summary for ``pulseinfer simulate``: two narrow tables (service, then memory and
I/O) in display units, the bill, a fleet's replicas, and one line per reason requests were rejected (counted by
``sim.metrics.rejected_by_reason``). The CSV keeps every column at full precision in SI units."""

from __future__ import annotations

import pandas as pd

from sim.metrics import rejected_by_reason

# unfinished_reason of a request that can never run (sim/serving/admission.py ``never_fits``) → why, in words
REJECTION_REASONS = {
    "exceeds_max_seq_len": "prompt + output longer than max_seq_len {max_seq_len}",
    "exceeds_kv_pool": "KV of prompt + output larger than the GPU's KV pool of {kv_pool_gib:.2f} GiB",
}

# (column, header, scale, format)
SERVICE = [
    ("policy", "policy", None, "{}"),
    ("finished", "done", None, "{:d}"),
    ("unfinished", "unfin", None, "{:d}"),
    ("decode_tokens_per_s", "decode tok/s", 1.0, "{:.0f}"),
    ("throughput_vs_sglang", "x sglang", 1.0, "{:.2f}"),
    ("throughput_vs_headwise", "x headwise", 1.0, "{:.2f}"),
    ("tpot_mean_s", "TPOT mean ms", 1e3, "{:.1f}"),
    ("tpot_p99_s", "TPOT p99 ms", 1e3, "{:.1f}"),
    ("ttft_p99_s", "TTFT p99 s", 1.0, "{:.2f}"),
    ("goodput_requests_per_s", "goodput req/s", 1.0, "{:.3f}"),
]
MEMORY_IO = [
    ("policy", "policy", None, "{}"),
    ("mean_batch", "mean batch", 1.0, "{:.1f}"),
    ("peak_hbm_gib", "peak HBM GiB", 1.0, "{:.1f}"),
    ("num_preemptions", "preempted", None, "{:d}"),
    ("recall_gb_per_step", "recall GB/step", 1.0, "{:.3f}"),
    ("fragments_per_step", "fragments/step", 1.0, "{:.0f}"),
    ("link_gbps_achieved", "link GB/s", 1.0, "{:.1f}"),
    ("link_busy_frac", "link busy %", 100.0, "{:.1f}"),
    ("gather_busy_frac", "gather busy %", 100.0, "{:.1f}"),
    ("d2h_busy_frac", "D2H busy %", 100.0, "{:.1f}"),
    ("stall_frac", "stall %", 100.0, "{:.1f}"),
]


def display_frame(summary: pd.DataFrame, spec: list[tuple]) -> pd.DataFrame:
    """The columns of ``spec`` (column, header, scale, format) that ``summary`` has, scaled and formatted as text
    under their display headers ("-" for a missing value); the console tables and the report page show this."""
    cols = {}
    for col, header, scale, fmt in spec:
        if col not in summary:
            continue
        values = summary[col] * scale if scale is not None else summary[col]
        cols[header] = [("-" if pd.isna(v) else fmt.format(v)) for v in values]
    return pd.DataFrame(cols)


def _table(summary: pd.DataFrame, spec: list[tuple]) -> str:
    return display_frame(summary, spec).to_string(index=False)


BILL = [
    ("policy", "policy", None, "{}"),
    ("num_replicas", "replicas", None, "{:d}"),
    ("router", "router", None, "{}"),
    ("gpus", "GPUs", None, "{:d}"),
    ("gpu_hours", "GPU-hours", 1.0, "{:.3f}"),
    ("gpu_hour_usd", "$/GPU-h", 1.0, "{:.2f}"),
    ("usd_per_hour", "$/h", 1.0, "{:.2f}"),
    ("usd_per_million_output_tokens", "$/M out tok", 1.0, "{:.3f}"),
]
REPLICAS = [
    ("policy", "policy", None, "{}"),
    ("replica", "replica", None, "{:d}"),
    ("requests", "requests", None, "{:d}"),
    ("decode_tokens_per_s", "decode tok/s", 1.0, "{:.0f}"),
    ("tpot_p50_s", "TPOT p50 ms", 1e3, "{:.1f}"),
    ("tpot_p99_s", "TPOT p99 ms", 1e3, "{:.1f}"),
    ("mean_batch", "mean batch", 1.0, "{:.1f}"),
    ("peak_hbm_gib", "peak HBM GiB", 1.0, "{:.1f}"),
    ("link_busy_frac", "link busy %", 100.0, "{:.1f}"),
]


def format_bill(summary: pd.DataFrame) -> str:
    """The bill (sim/metrics/bill.py) as a text table: GPUs, GPU-hours over the simulated span and, when the card
    has a price, $ per GPU-hour, $ per hour and $ per million output tokens (a fleet adds its replicas and router)."""
    return _table(summary, BILL)


def format_replicas(replicas: pd.DataFrame) -> str:
    """A fleet's per-replica rows (sim/metrics/fleet_summary.py ``REPLICA_COLUMNS``) in display units."""
    return _table(replicas, REPLICAS)


BACKLOG_NOTE_FRAC = 0.01  # a D2H backlog above this fraction of the run's duration is worth a line


def format_summary(summary: pd.DataFrame) -> str:
    """The summary as two aligned text tables with units in the headers (ms for TPOT, % for fractions), then a
    ``note:`` line for each of :func:`summary_notes`."""
    notes = "".join(f"\nnote: {line}" for line in summary_notes(summary))
    return _table(summary, SERVICE) + "\n\n" + _table(summary, MEMORY_IO) + ("\n" + notes if notes else "")


def summary_notes(summary: pd.DataFrame) -> list[str]:
    """What the tables alone would hide: policies whose run issued no request before the horizon (every rate and
    fraction undefined), and D2H offload writes still queued when the run ended (``d2h_backlog_s`` above
    :data:`BACKLOG_NOTE_FRAC` of the duration: the link could not keep up, and that work is not in ``D2H busy %``)."""
    notes = []
    if "duration_s" in summary:
        idle = summary.loc[summary["duration_s"].isna(), "policy"].tolist()
        if idle:
            notes.append(f"nothing arrived before the horizon ({', '.join(idle)}): no rate or busy fraction is defined")
    if "d2h_backlog_s" in summary:
        late = summary[summary["d2h_backlog_s"] > BACKLOG_NOTE_FRAC * summary["duration_s"]]
        if len(late):
            each = ", ".join(f"{p} {s:.1f} s" for p, s in zip(late["policy"], late["d2h_backlog_s"]))
            notes.append(f"D2H offload writes still queued at the end of the run (d2h_backlog_s): {each}")
    return notes


def rejection_lines(requests: pd.DataFrame, max_seq_len: int, kv_pool_gib: float) -> list[str]:
    """``rejected: N — why`` for each reason requests of one policy's table were rejected (they can never run
    here), most frequent first; empty when none was. Requests cut by the horizon or left stuck are not rejected.

    Args:
        requests: the policy's requests table (``unfinished_reason`` column).
        max_seq_len: the model's context (tokens); kv_pool_gib: one GPU's device KV pool (2**30 bytes).
    """
    lines = []
    for reason, count in rejected_by_reason(requests).items():
        why = REJECTION_REASONS.get(reason, reason).format(max_seq_len=max_seq_len, kv_pool_gib=kv_pool_gib)
        lines.append(f"rejected: {count} — {why}")
    return lines
