"""Records → DataFrames → one summary row per policy.

Definitions :

* ``ttft_s`` = first token − arrival; ``e2e_s`` = finish − arrival;
* ``tpot_s`` = (e2e − ttft) / (output tokens − 1), undefined (NaN) for requests with < 2 output tokens;
* ``decode_tokens_per_s`` = tokens sampled by decode steps / duration, where duration runs from the
  first arrival to the last finish (or to the horizon, when the run is cut). A run that issued no request (a
  session trace whose first think time reaches past the horizon) has no duration: ``duration_s`` and every
  per-duration rate and busy fraction are NaN (undefined), the other ratios 0 as for any empty denominator;
* ``goodput_requests_per_s`` = finished requests meeting every SLO bound that is set / duration;
* ``mean_batch`` = mean decode batch size over decode steps; ``link_busy_frac`` = H2D busy time (copies or
  GPU gather kernels; never host gather) / duration; ``gather_busy_frac`` = host-gather busy time /
  duration; ``d2h_busy_frac`` = D2H offload-write time within the run / duration; ``stall_frac`` = GPU time
  waiting on recalls / decode time;
* ``d2h_backlog_s`` = D2H offload-write time still queued when the run ends (the queue has no back-pressure, so
  writes queued faster than the link drains them run on past the end: its last busy stretch is contiguous and ends
  at the queue's end, so the time within the run is the time queued minus this backlog);
* ``peak_hbm_gib`` = weights + reserve + the peak KV pool use (2**30 bytes);
* ``recall_miss_frac`` = fragments recalled / fragments selected over all decode steps (1 for full offload);
* ``prefix_hit_frac`` = prompt tokens served from the prefix cache at first admission / prompt tokens of
  every request (sim/serving/prefix.py; 0 without a cache);
* client view (SGLang ``bench_serving``: TTFT = first streamed token − send, TPOT = (latency − TTFT) /
  (output − 1)): ``ttft_client_s`` = the request's first join of the decode batch − arrival (in a
  PD-disaggregated deployment the decode side streams the first token when it admits the request, so the
  wait for a decode slot is TTFT); ``tpot_client_s`` = (e2e − ttft_client) / (output − 1);
  ``decode_queue_wait_s`` = decode admission − first token sampled by prefill (0 when colocated). The
  ``ttft_s``/``tpot_s`` columns keep the engine-side definition (first token sampled by prefill);
* ``recall_gb_per_step`` = mean H2D recall bytes per decode step / 1e9; ``fragments_per_step`` = mean
  recalled fragments per decode step; ``link_gbps_achieved`` = recall bytes / H2D busy time (what the
  link delivered while busy: near peak for coalesced recalls, far below for small fragments).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.config import GIB, SloSpec
from sim.metrics.outcomes import INCOMPLETE_REASONS
from sim.metrics.recorder import Recorder

STEP_COLUMNS = [
    "step_id", "phase", "start_s", "duration_s", "batch_size", "num_offloaded", "prefill_tokens",
    "attended_tokens", "recall_bytes", "num_fragments", "num_transfers", "stall_s", "link_busy_s", "gather_busy_s",
    "kv_used_blocks", "hbm_used_bytes", "host_used_bytes", "selected_fragments",
]  # fmt: skip
REQUEST_COLUMNS = [
    "request_id", "arrival_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens",
    "output_tokens", "generated_tokens", "offloaded", "num_preemptions", "finished", "unfinished_reason",
    "prefix_hit_tokens", "decode_admit_s", "ttft_client_s", "tpot_client_s", "decode_queue_wait_s", "scheduled_s",
]  # fmt: skip
SUMMARY_COLUMNS = [
    "policy", "finished", "unfinished", "decode_tokens_per_s", "tpot_mean_s", "tpot_p50_s", "tpot_p99_s",
    "ttft_p50_s", "ttft_p99_s", "goodput_requests_per_s", "mean_batch", "link_busy_frac", "peak_hbm_gib",
    "stall_frac", "offloaded_frac", "num_preemptions", "prefill_busy_frac", "duration_s", "recall_gb_per_step",
    "fragments_per_step", "link_gbps_achieved", "recall_miss_frac", "gather_busy_frac", "d2h_busy_frac",
    "d2h_backlog_s", "prefix_hit_frac", "ttft_client_p50_s", "ttft_client_p99_s", "tpot_client_mean_s",
    "tpot_client_p99_s", "decode_queue_wait_mean_s", "decode_queue_wait_p99_s",
]  # fmt: skip
LAYER_COLUMNS = ["layer", "recall_bytes", "fragments", "stall_s"]
LAYER_RECALL_COLUMNS = ["time_s", "layer", "recall_bytes"]
TIMELINE_COLUMNS = ["step_id", "layer", "group", "kind", "start_s", "end_s", "preempted"]


def timeline_table(rec: Recorder) -> pd.DataFrame:
    """The chosen step's compute, gather and transfer intervals, one row each (for a Gantt chart)."""
    return pd.DataFrame(rec.timeline, columns=TIMELINE_COLUMNS)


def layers_table(rec: Recorder) -> pd.DataFrame:
    """Per-layer totals over the run: recall bytes, fragments, stall seconds (one row per layer)."""
    return pd.DataFrame(
        {
            "layer": np.arange(rec.num_layers),
            "recall_bytes": rec.layer_bytes,
            "fragments": rec.layer_fragments,
            "stall_s": rec.layer_stall_s,
        }
    )


def layer_recall_table(rec: Recorder) -> pd.DataFrame:
    """Recall bytes per (time bin, layer), long format; ``time_s`` is the bin start."""
    if not rec.binned_bytes:
        return pd.DataFrame(columns=LAYER_RECALL_COLUMNS)
    keys = sorted(rec.binned_bytes)
    data = np.stack([rec.binned_bytes[k] for k in keys])  # [bins, L]
    return pd.DataFrame(
        {
            "time_s": np.repeat(np.array(keys, dtype=float) * rec.layer_bin_s, rec.num_layers),
            "layer": np.tile(np.arange(rec.num_layers), len(keys)),
            "recall_bytes": data.ravel(),
        }
    )


def requests_table(reqs: list) -> pd.DataFrame:
    """Per-request table (one row per request that arrived), sorted by request_id (columns :data:`REQUEST_COLUMNS`;
    built column-wise, each value in the same float operations as one request's row would take)."""
    n = len(reqs)
    if not n:
        return pd.DataFrame(columns=REQUEST_COLUMNS)

    def col(attr: str, dtype: type) -> np.ndarray:
        return np.fromiter((getattr(r, attr) for r in reqs), dtype=dtype, count=n)

    order = np.argsort(col("request_id", np.int64), kind="stable")
    reqs = [reqs[i] for i in order.tolist()]
    arrival, first, finish = col("arrival_s", np.float64), col("first_token_s", np.float64), col("finish_s", np.float64)
    output, admit_at = col("output_tokens", np.int64), col("decode_admit_s", np.float64)
    reasons = [r.unfinished_reason for r in reqs]
    done = ~np.isnan(finish) & np.fromiter((not reason for reason in reasons), dtype=bool, count=n)
    ttft = first - arrival
    e2e = np.where(done, finish - arrival, np.nan)
    streams = done & (output > 1)  # TPOT is defined
    steps = np.where(streams, output - 1, 1)
    tpot = np.where(streams, (e2e - ttft) / steps, np.nan)
    # Client view: a request that never joined a decode batch (one output token) streams at first token.
    admit = np.where(np.isnan(admit_at), first, admit_at)
    ttft_client = admit - arrival
    columns = {
        "request_id": col("request_id", np.int64), "arrival_s": arrival, "first_token_s": first, "finish_s": finish,
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "prompt_tokens": col("prompt_tokens", np.int64),
        "output_tokens": output, "generated_tokens": col("generated", np.int64), "offloaded": col("offloaded", bool),
        "num_preemptions": col("num_preemptions", np.int64), "finished": done, "unfinished_reason": reasons,
        "prefix_hit_tokens": np.maximum(col("prefix_hit_tokens", np.int64), 0), "decode_admit_s": admit_at,
        "ttft_client_s": ttft_client, "tpot_client_s": np.where(streams, (e2e - ttft_client) / steps, np.nan),
        "decode_queue_wait_s": admit - first, "scheduled_s": col("scheduled_s", np.float64),
    }  # fmt: skip
    return pd.DataFrame(columns, columns=REQUEST_COLUMNS)


def steps_table(rec: Recorder) -> pd.DataFrame:
    """Per-step table (prefill forwards and decode steps in time order), built from the recorder's column arrays.

    Raises:
        ValueError: the recorder keeps no step rows (``run.tables: summary``).
    """
    columns = rec.step_columns()
    phase = np.array(["prefill", "decode"], dtype=object)[columns["phase"]]
    return pd.DataFrame({**columns, "phase": phase}, columns=STEP_COLUMNS)


def meets_slo(requests: pd.DataFrame, slo: SloSpec) -> pd.Series:
    """Boolean per request: finished and within every SLO bound that is set (NaN TPOT passes)."""
    ok = requests["finished"].copy()
    if slo.tpot_ms is not None:
        ok &= ~(requests["tpot_s"] > slo.tpot_ms * 1e-3)
    if slo.ttft_s is not None:
        ok &= requests["ttft_s"] <= slo.ttft_s
    return ok


def summarize(
    policy: str,
    requests: pd.DataFrame,
    rec: Recorder,
    slo: SloSpec,
    fixed_hbm_bytes: int,
    block_bytes: int,
    end_s: float,
    peak_blocks: int,
) -> dict:
    """One summary row (a dict with :data:`SUMMARY_COLUMNS` keys) for one policy's run.

    Args:
        rec: the run's recorder; the step figures come from ``rec.totals``
            (:class:`sim.metrics.recorder.StepTotals`, kept whether or not step rows are).
        end_s: when the run ended (last finish, or the horizon).
        fixed_hbm_bytes: weights + reserve; block_bytes: bytes of one device-pool block.
        peak_blocks: the device pool's peak use (``Pool.peak``), in blocks.
    """
    issued = requests["arrival_s"].dropna()  # a session's request never issued before the horizon has no arrival
    start_s = float(issued.min()) if len(issued) else np.nan
    d2h_backlog_s = max(0.0, rec.d2h_free_s - end_s) if rec.d2h_busy_s else 0.0
    duration = max(end_s - start_s, 1e-12) if len(issued) else np.nan  # nothing issued: no window, no rate
    done = requests[requests["finished"]]
    tpot = done["tpot_s"].dropna()
    t = rec.totals
    decode_time, prefill_time, n = t.decode_time_s, t.prefill_time_s, t.decode_steps

    def pct(s: pd.Series, q: float) -> float:
        return float(np.percentile(s, q)) if len(s) else np.nan

    return {
        "policy": policy,
        "finished": int(len(done)),
        "unfinished": int(len(requests) - len(done)),
        "decode_tokens_per_s": rec.decode_tokens / duration,
        "tpot_mean_s": float(tpot.mean()) if len(tpot) else np.nan,
        "tpot_p50_s": pct(tpot, 50),
        "tpot_p99_s": pct(tpot, 99),
        "ttft_p50_s": pct(done["ttft_s"].dropna(), 50),
        "ttft_p99_s": pct(done["ttft_s"].dropna(), 99),
        "goodput_requests_per_s": float(meets_slo(requests, slo).sum()) / duration,
        "mean_batch": t.decode_batch_sum / n if n else 0.0,
        "link_busy_frac": rec.link_busy_s / duration,
        "peak_hbm_gib": (fixed_hbm_bytes + t.peak_kv_used_blocks * block_bytes) / GIB,
        "stall_frac": t.decode_stall_s / decode_time if decode_time else 0.0,
        "offloaded_frac": float(requests["offloaded"].mean()) if len(requests) else 0.0,
        "num_preemptions": rec.num_preemptions,
        "prefill_busy_frac": prefill_time / duration,
        "duration_s": duration,
        "recall_gb_per_step": float(t.decode_recall_bytes) / n / 1e9 if n else 0.0,
        "fragments_per_step": float(t.decode_fragments) / n if n else 0.0,
        "link_gbps_achieved": float(t.decode_recall_bytes) / rec.link_busy_s / 1e9 if rec.link_busy_s else 0.0,
        "recall_miss_frac": _ratio(t.decode_fragments, t.decode_selected_fragments),
        "gather_busy_frac": rec.gather_busy_s / duration,
        "d2h_busy_frac": (rec.d2h_busy_s - d2h_backlog_s) / duration,
        "d2h_backlog_s": d2h_backlog_s,
        **_client_view(requests, done, pct),
    }


def _client_view(requests: pd.DataFrame, done: pd.DataFrame, pct) -> dict:
    """Prefix-cache hit fraction and the client-side TTFT/TPOT and decode-queue wait (module docstring)."""
    prompt = float(requests["prompt_tokens"].sum())
    tpot = done["tpot_client_s"].dropna()
    wait = done["decode_queue_wait_s"].dropna()
    return {
        "prefix_hit_frac": float(requests["prefix_hit_tokens"].sum()) / prompt if prompt else 0.0,
        "ttft_client_p50_s": pct(done["ttft_client_s"].dropna(), 50),
        "ttft_client_p99_s": pct(done["ttft_client_s"].dropna(), 99),
        "tpot_client_mean_s": float(tpot.mean()) if len(tpot) else np.nan,
        "tpot_client_p99_s": pct(tpot, 99),
        "decode_queue_wait_mean_s": float(wait.mean()) if len(wait) else np.nan,
        "decode_queue_wait_p99_s": pct(wait, 99),
    }


def unfinished_counts(requests: pd.DataFrame) -> dict[str, int]:
    """``rejected``: requests that can never run here (refused on arrival or admission);
    ``incomplete``: requests cut by the horizon or left when the scheduler got stuck."""
    reason = requests["unfinished_reason"]
    incomplete = reason.isin(INCOMPLETE_REASONS)
    return {"rejected": int(((reason != "") & ~incomplete).sum()), "incomplete": int(incomplete.sum())}


def rejected_by_reason(requests: pd.DataFrame) -> dict[str, int]:
    """``unfinished_reason`` → how many requests of one policy's table were rejected for it (they can never run
    here), most frequent first; empty when none was. Requests cut by the horizon or left stuck are not rejected."""
    reasons = requests["unfinished_reason"]
    rejected = reasons[(reasons != "") & reasons.notna() & ~reasons.isin(INCOMPLETE_REASONS)]
    return {str(reason): int(count) for reason, count in rejected.value_counts().items()}


def _ratio(num: float, den: float) -> float:
    """num / den, or 0.0 when den is 0 (nothing was selected)."""
    return float(num) / float(den) if den else 0.0
