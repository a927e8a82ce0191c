"""A fleet's tables and summary: the replicas' outcomes merged into one request table, one summary row over the fleet
(checked against its physics, sim/metrics/physics.py) and one row per replica (:data:`REPLICA_COLUMNS`).

Serving runs the replicas (sim/serving/cluster.py ``simulate_cluster``, in one environment or in worker processes,
sim/serving/fleet_pool.py) and hands each one's :class:`ReplicaOutcome` to :func:`fleet_result`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.config import GIB, Scenario
from sim.metrics.physics import PhysicsBounds, check_physics
from sim.metrics.recorder import Recorder, StepTotals
from sim.metrics.tables import summarize, unfinished_counts

# One row per replica (ClusterResult.replicas): requests routed to it, its decode tokens over the fleet's duration,
# TPOT percentiles of its finished requests (s), its mean decode batch, its peak HBM (GiB, weights + reserve + peak
# KV pool use) and its H2D link busy time over the fleet's duration.
REPLICA_COLUMNS = [
    "replica", "requests", "decode_tokens_per_s", "tpot_p50_s", "tpot_p99_s", "mean_batch", "peak_hbm_gib",
    "link_busy_frac",
]  # fmt: skip
# Each replica's samples (ClusterResult.series; Recorder.samples: a decode and a prefill step row a sample_s seconds
# at most): the step's start (s), phase (decode, prefill), batch size (requests; prefill: chunks), offloaded requests,
# device KV pool in use after it and its size, HBM in use after it (GiB).
SERIES_COLUMNS = [
    "replica", "time_s", "phase", "batch_size", "num_offloaded", "kv_used_gib", "kv_pool_gib", "hbm_used_gib",
]  # fmt: skip


@dataclass
class ReplicaOutcome:
    """What the merge needs of one replica's run (picklable: no SimPy object, no Request)."""

    requests: pd.DataFrame  # requests_table of its finished, rejected and unfinished requests
    recorder: Recorder  # its totals (requests list emptied)
    peak_blocks: int  # its device KV pool's peak use (blocks)
    capacity_blocks: int  # its device KV pool (blocks)
    fixed_hbm_bytes: int  # weights + reserve + policy reservations
    block_bytes: int
    bounds: PhysicsBounds  # its GPU's physical bounds (sim/metrics/physics.py)
    end_now_s: float  # its environment's clock when the run ended


@dataclass
class ClusterResult:
    """One cluster run."""

    requests: pd.DataFrame  # requests_table rows plus a ``replica`` column, by request_id
    summary: dict  # SUMMARY_COLUMNS over the cluster + num_replicas, router, rejected, incomplete
    routed: list[int]  # requests sent to each replica
    replicas: pd.DataFrame  # REPLICA_COLUMNS, one row per replica
    kv_pool_gib: float  # one GPU's device KV pool (2**30 bytes)
    series: pd.DataFrame  # SERIES_COLUMNS, by replica then time


def fleet_result(
    scenario: Scenario, outcomes: list[ReplicaOutcome], policy_name: str, router: str, routed: list[int]
) -> ClusterResult:
    """Merge the replicas' outcomes (one environment or worker processes) into the cluster's tables and summary."""
    recs, first = [o.recorder for o in outcomes], outcomes[0]
    tables = [o.requests.assign(replica=i) for i, o in enumerate(outcomes)]
    requests = pd.concat(tables, ignore_index=True).sort_values("request_id", kind="stable").reset_index(drop=True)
    merged = Recorder(scenario.model.num_layers, scenario.run.layer_bin_s, keep_steps=False)
    merged.totals = functools.reduce(StepTotals.merged, [rec.totals for rec in recs])
    merged.decode_tokens = sum(rec.decode_tokens for rec in recs)
    merged.link_busy_s = sum(rec.link_busy_s for rec in recs) / len(recs)  # per-replica mean
    merged.gather_busy_s = sum(rec.gather_busy_s for rec in recs) / len(recs)
    merged.d2h_busy_s = sum(rec.d2h_busy_s for rec in recs) / len(recs)
    end_s = _end_s(scenario, requests, max(o.end_now_s for o in outcomes))
    # the merged queue ends its mean backlog after the run (summarize subtracts it)
    merged.d2h_free_s = end_s + sum(max(0.0, rec.d2h_free_s - end_s) for rec in recs) / len(recs)
    merged.num_preemptions = sum(rec.num_preemptions for rec in recs)
    summary = summarize(
        policy_name, requests, merged, scenario.slo, first.fixed_hbm_bytes, first.block_bytes,
        end_s, max(o.peak_blocks for o in outcomes),
    )  # fmt: skip
    summary["prefill_busy_frac"] /= len(outcomes)  # summed over replicas by summarize
    link_busy_s = sum(rec.link_busy_s for rec in recs)  # the bytes are every replica's: so is the busy time
    summary["link_gbps_achieved"] = merged.totals.decode_recall_bytes / link_busy_s / 1e9 if link_busy_s else 0.0
    # replicas on a fuller node share their host path more: the link bound is the least shared replica's
    check_physics(summary, max((o.bounds for o in outcomes), key=lambda b: b.link_gbps), scenario)
    summary.update(num_replicas=len(outcomes), router=router, **unfinished_counts(requests))
    rows = [
        _replica_row(i, n, table, o.recorder, first.fixed_hbm_bytes, first.block_bytes, summary["duration_s"])
        for i, (n, table, o) in enumerate(zip(routed, tables, outcomes))
    ]
    pool_gib = first.capacity_blocks * first.block_bytes / GIB
    series = [(i, t, ("prefill", "decode")[p], b, n, k * o.block_bytes / GIB, pool_gib, h / GIB)
              for i, o in enumerate(outcomes) for t, p, b, n, k, h in o.recorder.samples]  # fmt: skip
    replicas, series = pd.DataFrame(rows, columns=REPLICA_COLUMNS), pd.DataFrame(series, columns=SERIES_COLUMNS)
    return ClusterResult(requests, summary, routed, replicas, pool_gib, series)


def _end_s(scenario: Scenario, requests: pd.DataFrame, now_s: float) -> float:
    """When the run ended (``Fleet.end_s`` of the clock ``now_s``): the last finish, or the clock when a horizon cut it
    (or nothing finished)."""
    end_s = float(requests["finish_s"].max()) if scenario.run.horizon_s is None else now_s
    return now_s if np.isnan(end_s) else end_s


def _replica_row(
    index: int, routed: int, requests: pd.DataFrame, rec: Recorder, fixed_hbm_bytes: int, block_bytes: int,
    duration_s: float,
) -> dict:  # fmt: skip
    """One :data:`REPLICA_COLUMNS` row; rates and busy fractions over the fleet's ``duration_s``."""
    tpot = requests.loc[requests["finished"], "tpot_s"].dropna()
    t = rec.totals
    return {
        "replica": index,
        "requests": routed,
        "decode_tokens_per_s": rec.decode_tokens / duration_s,
        "tpot_p50_s": float(np.percentile(tpot, 50)) if len(tpot) else np.nan,
        "tpot_p99_s": float(np.percentile(tpot, 99)) if len(tpot) else np.nan,
        "mean_batch": t.decode_batch_sum / t.decode_steps if t.decode_steps else 0.0,
        "peak_hbm_gib": (fixed_hbm_bytes + t.peak_kv_used_blocks * block_bytes) / GIB,
        "link_busy_frac": rec.link_busy_s / duration_s,
    }
