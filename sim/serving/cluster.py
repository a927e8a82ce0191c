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

In → out: ``simulate_cluster(scenario, workload, policy, num_replicas, router)`` → ``ClusterResult`` (one request
table with a ``replica`` column; one summary row over the cluster; one row per replica, ``REPLICA_COLUMNS``; each
replica's samples every ``sample_interval_s`` (sim/serving/fleet.py), ``SERIES_COLUMNS``: the replicas' outcomes
merged and checked by sim/metrics/fleet_summary.py ``fleet_result``). ``pulseinfer simulate`` runs it
when ``serving.replicas`` > 1 (sim/run.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator

import numpy as np
import pandas as pd
import simpy

from sim.config import Scenario
from sim.metrics.fleet_summary import ClusterResult, fleet_result
from sim.metrics.physics import check_clock
from sim.serving.arrivals import ArrivalSchedule
from sim.serving.fleet import Fleet, request_objects, sample_interval_s
from sim.serving.fleet_pool import outcome_of, pool_size, run_replicas
from sim.serving.replica import Replica
from sim.serving.request import Request

ROUTERS = ("round_robin", "least_tokens")  # plan's default routers
PREFIX_ROUTER = "prefix_aware"
ALL_ROUTERS = (*ROUTERS, PREFIX_ROUTER)  # = the serving.router choices (sim/config/scenario.py)


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
        return fleet_result(scenario, outcomes, policy_name, router, routed)
    fleet = Fleet(scenario, policy_name, num_replicas, seed_index, on_finish, sample_s=sample_interval_s(workload))
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
    # progress (sim/serving/decode.py ``Decode.cut_run``): its choice reads only outstanding tokens and prefix caches,
    # which no run changes before its end (a run ends at its first finish, evicts nothing).
    static = isinstance(picker, RoundRobinRouter)
    own = [schedule.subset(np.arange(i, len(reqs), num_replicas)) for i in range(num_replicas)] if static else None
    for i, replica in enumerate(fleet.replicas):
        replica.follow(own[i] if static else None, horizon_s, reqs[i::num_replicas] if static else None)
        if not static:
            replica.cut_runs, replica.ties = True, schedule
    fleet.run(_route(fleet.env, fleet.replicas, reqs, picker, routed, schedule, own))
    outcomes = [outcome_of(r, rec, fleet.env.now) for r, rec in zip(fleet.replicas, fleet.recorders)]
    return fleet_result(scenario, outcomes, policy_name, router, routed)


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
