"""N replicas of one policy behind a router, in one SimPy environment (seeding and the shared run loop:
sim/serving/fleet.py, so a one-replica cluster *is* the single-replica simulation).

The router process walks the workload in arrival order; at each arrival it picks a replica, attaches a ``done``
event to the request and calls :meth:`Replica.submit`; after the last arrival it closes every replica.

Routers (``ROUTERS``):

- ``round_robin``: replica ``k mod N`` for the k-th request.
- ``least_tokens``: the replica with the fewest outstanding tokens, i.e. prompt + output tokens of the
  requests routed to it and not done yet (ties go to the lowest index). Model assumption: the router
  knows each request's output length, as a length-predicting router would.
- ``prefix_aware`` (:data:`PREFIX_ROUTER`, as llm-d's and Dynamo's KV-aware routing): the replica whose radix
  prefix cache (sim/serving/prefix.py) holds the longest prefix of the request's ``hash_ids`` at its arrival, ties by
  fewest outstanding tokens, then the lowest index. Without hash ids or prefix caches (a policy without
  ``prefix_cache``, or disaggregated prefill, where the decode side keeps none) it is ``least_tokens``.
  Model assumption: the router sees every replica's cache as it is (llm-d and Dynamo track it from KV events).

In → out: ``simulate_cluster(scenario, workload, policy, num_replicas, router)`` → :class:`ClusterResult`
(one request table with a ``replica`` column; one summary row over the cluster; one row per replica,
:data:`REPLICA_COLUMNS`). ``pulseinfer simulate`` runs it when ``serving.replicas`` > 1 (sim/run.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from sim.config import GIB, Scenario
from sim.metrics import Recorder, StepTotals, summarize, unfinished_counts
from sim.metrics.physics import check_clock, check_physics
from sim.serving.arrivals import ArrivalSchedule
from sim.serving.fleet import Fleet, request_objects
from sim.serving.fleet_pool import ReplicaOutcome, outcome_of, pool_size, run_replicas
from sim.serving.replica import Replica
from sim.serving.request import Request

ROUTERS = ("round_robin", "least_tokens")  # plan's default routers
PREFIX_ROUTER = "prefix_aware"
ALL_ROUTERS = (*ROUTERS, PREFIX_ROUTER)  # = the serving.router choices (sim/config/scenario.py)
# One row per replica (ClusterResult.replicas): requests routed to it, its decode tokens over the fleet's duration,
# TPOT percentiles of its finished requests (s), its mean decode batch, its peak HBM (GiB, weights + reserve + peak
# KV pool use) and its H2D link busy time over the fleet's duration.
REPLICA_COLUMNS = [
    "replica", "requests", "decode_tokens_per_s", "tpot_p50_s", "tpot_p99_s", "mean_batch", "peak_hbm_gib",
    "link_busy_frac",
]  # fmt: skip


class RoundRobinRouter:
    """Replica ``k mod N`` for the k-th request."""

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self.next = 0

    def pick(self, tokens: int, req: Request | None = None) -> int:
        """Replica for a request of ``tokens`` prompt + output tokens."""
        i = self.next
        self.next = (i + 1) % self.num_replicas
        return i

    def release(self, replica: int, tokens: int) -> None:
        """A request routed to ``replica`` is done (round robin keeps no load)."""


class LeastTokensRouter:
    """The replica with the fewest outstanding prompt + output tokens; ties go to the lowest index."""

    def __init__(self, num_replicas: int) -> None:
        self.outstanding = np.zeros(num_replicas, dtype=np.int64)

    def pick(self, tokens: int, req: Request | None = None) -> int:
        """Replica for a request of ``tokens`` prompt + output tokens; counts them as outstanding there."""
        i = int(np.argmin(self.outstanding))
        self.outstanding[i] += tokens
        return i

    def release(self, replica: int, tokens: int) -> None:
        """A request routed to ``replica`` is done: its tokens are no longer outstanding."""
        self.outstanding[replica] -= tokens


class PrefixAwareRouter(LeastTokensRouter):
    """The replica whose prefix cache holds the longest prefix of the request's hash ids; ties by fewest
    outstanding prompt + output tokens, then the lowest index."""

    def __init__(self, replicas: list[Replica]) -> None:
        super().__init__(len(replicas))
        self.caches = [r.kv.prefix for r in replicas]

    def pick(self, tokens: int, req: Request | None = None) -> int:
        """Replica for ``req`` (``tokens`` prompt + output tokens); counts them as outstanding there."""
        if req is None or not req.hash_ids or not any(c is not None for c in self.caches):
            return super().pick(tokens)
        ids, prompt, block = req.hash_ids, req.prompt_tokens, req.hash_block_tokens
        hits = np.array([c.match(ids, prompt, block)[1] if c is not None else 0 for c in self.caches])
        best = np.flatnonzero(hits == hits.max())
        i = int(best[np.argmin(self.outstanding[best])])
        self.outstanding[i] += tokens
        return i


Router = RoundRobinRouter | LeastTokensRouter


def make_router(kind: str, num_replicas: int, replicas: list[Replica] | None = None) -> Router:
    """A router by name (``prefix_aware`` reads ``replicas``' prefix caches; without them it is ``least_tokens``).

    Raises:
        ValueError: unknown ``kind`` or ``num_replicas`` < 1.
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if kind == "round_robin":
        return RoundRobinRouter(num_replicas)
    if kind == "least_tokens":
        return LeastTokensRouter(num_replicas)
    if kind == PREFIX_ROUTER:
        return PrefixAwareRouter(replicas) if replicas is not None else LeastTokensRouter(num_replicas)
    raise ValueError(f"router: unknown {kind!r} (known: {', '.join(ALL_ROUTERS)})")


@dataclass
class ClusterResult:
    """One cluster run."""

    requests: pd.DataFrame  # requests_table rows plus a ``replica`` column, by request_id
    summary: dict  # SUMMARY_COLUMNS over the cluster + num_replicas, router, rejected, incomplete
    routed: list[int]  # requests sent to each replica
    replicas: pd.DataFrame  # REPLICA_COLUMNS, one row per replica
    kv_pool_gib: float  # one GPU's device KV pool (2**30 bytes)


def simulate_cluster(
    scenario: Scenario,
    workload: pd.DataFrame,
    policy_name: str,
    num_replicas: int,
    router: str = "round_robin",
    seed_index: int = 0,
    on_finish: Callable[[Request], None] | None = None,
) -> ClusterResult:
    """Serve the workload with ``num_replicas`` replicas of one policy behind ``router``.

    Summary over the cluster: latency percentiles and goodput over all requests; ``decode_tokens_per_s``
    is the cluster's total; ``link_busy_frac``, ``gather_busy_frac``, ``d2h_busy_frac`` and
    ``prefill_busy_frac`` are per-replica means; ``link_gbps_achieved`` is every replica's recall bytes over every
    replica's link time (what one link delivered while busy); ``peak_hbm_gib`` is the largest replica's peak.
    ``on_finish`` is called with each finished or rejected request.

    Raises:
        ValueError: unknown router or ``num_replicas`` < 1.
        CapacityError: if the model does not fit in HBM.
        ScenarioError: the workload's clock would outrun float64 (sim/metrics/physics.py ``check_clock``).
        PhysicsError: the run broke a physical bound (a simulator bug, sim/metrics/physics.py).
    """
    make_router(router, num_replicas)  # a bad name or count fails before the fleet is built
    workers = pool_size(scenario.run.workers, num_replicas, len(workload)) if router == "round_robin" else 1
    if workers > 1:  # independent replicas: each in its own environment, in worker processes (fleet_pool.py)
        probe = Fleet(scenario, policy_name, num_replicas, seed_index, indices=[0]).replicas[0]
        check_clock(scenario, workload, probe.policy.compute)
        outcomes = run_replicas(scenario, workload, policy_name, num_replicas, seed_index, workers, on_finish)
        routed = [len(o.requests) for o in outcomes]
        return _cluster_result(scenario, outcomes, policy_name, router, routed)
    fleet = Fleet(scenario, policy_name, num_replicas, seed_index, on_finish)
    picker = make_router(router, num_replicas, fleet.replicas)
    check_clock(scenario, workload, fleet.replicas[0].policy.compute)
    fleet.preload_kernels(workload["prompt_tokens"].to_numpy())
    routed = [0] * num_replicas
    reqs = request_objects(workload)
    schedule = ArrivalSchedule((r.arrival_s for r in reqs), fleet.env.now)  # the router's arrivals, fixed in advance
    # Skip-ahead: only arrivals, the horizon and a replica's own remote prefills can change its decisions; another
    # replica's steps, prefills and finishes touch that replica's state and the router's counters. With colocated
    # prefill an arrival only queues a request: a soft bound (sim/serving/decode_run.py).
    horizon_s = scenario.run.horizon_s if scenario.run.horizon_s is not None else math.inf
    # A static router (round robin) decides every request's replica in advance: a replica then stops only at its own
    # arrivals, so its runs do not end at every arrival of the fleet and the cost stays linear in the replicas.
    # Behind a load-aware router a replica's runs pass every arrival and the one routed to it cuts its run in
    # progress (sim/serving/skip_ahead.py ``cut_run``): its choice reads only outstanding tokens and prefix caches,
    # which no run changes before its end (a run ends at its first finish, evicts nothing).
    static = isinstance(picker, RoundRobinRouter)
    own = [schedule.subset(np.arange(i, len(reqs), num_replicas)) for i in range(num_replicas)] if static else None
    for i, replica in enumerate(fleet.replicas):
        replica.follow(own[i] if static else None, horizon_s, reqs[i::num_replicas] if static else None)
        if not static:
            replica.cut_runs, replica.ties = True, schedule
    fleet.run(_route(fleet.env, fleet.replicas, reqs, picker, routed, schedule, own))
    outcomes = [outcome_of(r, rec, fleet.env.now) for r, rec in zip(fleet.replicas, fleet.recorders)]
    return _cluster_result(scenario, outcomes, policy_name, router, routed)


def _route(
    env: simpy.Environment,
    replicas: list[Replica],
    reqs: list[Request],
    picker: Router,
    routed: list[int],
    schedule: ArrivalSchedule,
    own: list[ArrivalSchedule] | None = None,
) -> Generator[simpy.Event, object, None]:
    """Submit each request at its arrival to the replica the router picks, then close every replica;
    ``schedule.next_index`` follows the arrival it waits for (and each replica's ``own`` schedule, with a static
    router, its next request)."""
    for n, req in enumerate(reqs):
        schedule.next_index = n
        if req.arrival_s > env.now:
            yield env.timeout(req.arrival_s - env.now)
        tokens = req.total_tokens
        i = picker.pick(tokens, req)
        routed[i] += 1
        if own is not None:
            own[i].next_index += 1
        req.done = env.event()
        req.done.callbacks.append(lambda _ev, i=i, tokens=tokens: picker.release(i, tokens))
        if own is None:
            replicas[i].cut_run(req)
        replicas[i].submit(req)
    schedule.next_index = len(reqs)
    for replica in replicas:
        replica.close()


def _cluster_result(
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
    return ClusterResult(requests, summary, routed, pd.DataFrame(rows, columns=REPLICA_COLUMNS), pool_gib)


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
