"""Replicas behind a static router (round robin), simulated in worker processes and merged.

A static router decides every request's replica from the arrival order alone, so replicas share nothing but the
clock: replica ``i`` of a fleet can be simulated in its own SimPy environment, seeded and placed as in the whole
fleet (``Fleet(..., indices=[i])``: the generator of ``(seed, seed_index, i)``, its node's host share), fed its
own requests by :func:`feed` at the times the fleet's router submits them. :func:`run_replicas` runs them in a
pool of ``workers`` processes (workers/__init__.py: spawned, stopped together on Ctrl-C, SIGTERM or a failure) and
returns one ``ReplicaOutcome`` (sim/metrics/fleet_summary.py) each, in replica order; ``fleet_result`` (the same
module) merges them into the tables and summary the one-environment run gives (tests/sim/test_fleet_scale.py
compares them).

Same times, same order: the router submits arrival ``m`` after waiting ``arrival_s − now`` from the fleet's
previous arrival (sim/serving/arrivals.py), and SimPy orders events of one instant by when they were scheduled. So
:func:`feed` first reaches that previous arrival's time (:func:`~sim.serving.arrivals.timeout_at`), then waits as the
router does: the arrival lands on the same float, its timeout scheduled at the same instant as the router's. It
closes the replica at the fleet's last arrival, as the router does. The replica's skip-ahead bounds are those of
the one-environment static path (``Replica.follow``).

``run.workers`` (sim/config/scenario.py) picks the pool size: :func:`pool_size`.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Generator
from concurrent.futures import Future

import numpy as np
import pandas as pd
import simpy

from sim.config import Scenario
from sim.metrics import Recorder, requests_table
from sim.metrics.fleet_summary import ReplicaOutcome
from sim.metrics.physics import bounds_of
from sim.serving.arrivals import ArrivalSchedule, timeout_at
from sim.serving.fleet import Fleet, request_objects, sample_interval_s
from sim.serving.replica import Replica
from workers import WorkerPool

AUTO_MIN_REQUESTS = 2_000  # ``run.workers: auto`` starts a pool only for fleets serving at least this many requests


def outcome_of(replica: Replica, recorder: Recorder, now_s: float) -> ReplicaOutcome:
    """A replica's ``ReplicaOutcome`` after its run (its recorder's request list is emptied)."""
    table = requests_table(recorder.requests)
    recorder.requests = []
    kv = replica.kv
    return ReplicaOutcome(
        table, recorder, kv.device.peak, kv.device.capacity, kv.fixed_hbm_bytes, kv.block_bytes,
        bounds_of(replica.policy), now_s,
    )  # fmt: skip


def pool_size(workers: int | str, num_replicas: int, num_requests: int) -> int:
    """Worker processes for a static fleet: ``run.workers`` when a number (at most one per replica); ``auto``: the
    idle CPUs this process may use (its CPUs less the 1-minute load average other than itself: on a machine others
    keep busy, processes only add their start-up), when this is not itself a worker process and the fleet has 2+
    replicas and at least :data:`AUTO_MIN_REQUESTS` requests (a pool's start-up costs seconds), else 1 (one
    environment, this process)."""
    if workers != "auto":
        return max(1, min(int(workers), num_replicas))
    if num_replicas < 2 or num_requests < AUTO_MIN_REQUESTS or multiprocessing.parent_process() is not None:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = max(0.0, os.getloadavg()[0] - 1.0) if hasattr(os, "getloadavg") else 0.0
    return max(1, min(int(cpus - busy + 0.5), num_replicas))


def run_replicas(
    scenario: Scenario,
    workload: pd.DataFrame,
    policy_name: str,
    num_replicas: int,
    seed_index: int,
    workers: int,
    on_finish: Callable[[object], None] | None = None,
) -> list[ReplicaOutcome]:
    """Simulate each replica of a round-robin fleet in a pool of ``workers`` processes; outcomes in replica order.
    ``on_finish`` is called here, with ``None``, once per request of each replica whose run came back.

    Raises:
        whatever a replica's run raises (CapacityError, PhysicsError, a process's RuntimeError), from the worker.
    """
    arrivals = workload["arrival_s"].to_numpy(dtype=np.float64)
    schedule = ArrivalSchedule(arrivals, 0.0)  # the router's clock at each arrival (its environment starts at 0)
    before = np.concatenate([[0.0], schedule.times_s[:-1]])  # the router's clock when it waits for each arrival
    last_s, sample_s = float(schedule.times_s[-1]) if len(arrivals) else 0.0, sample_interval_s(workload)
    tasks = []
    for i in range(num_replicas):
        mine = np.arange(i, len(workload), num_replicas)
        rows = workload.iloc[mine]
        tasks.append((scenario, policy_name, num_replicas, seed_index, i, rows, schedule.subset(mine), before[mine]))
    outcomes: list[ReplicaOutcome | None] = [None] * num_replicas
    with WorkerPool(min(workers, num_replicas)) as pool:  # Ctrl-C, SIGTERM or a failed replica stops every worker
        futures = [pool.submit(simulate_replica, *task, last_s, sample_s) for task in tasks]
        index = {future: i for i, future in enumerate(futures)}

        def collect(future: Future) -> None:
            i = index[future]
            outcomes[i] = future.result()
            if on_finish is not None:
                for _ in range(len(outcomes[i].requests)):
                    on_finish(None)

        pool.wait(futures, on_done=collect)
    return outcomes


def simulate_replica(
    scenario: Scenario,
    policy_name: str,
    num_replicas: int,
    seed_index: int,
    index: int,
    rows: pd.DataFrame,
    own: ArrivalSchedule,
    before_s: np.ndarray,
    last_s: float,
    sample_s: float = math.inf,
) -> ReplicaOutcome:
    """Replica ``index`` of a round-robin fleet alone (a worker's task): its requests ``rows`` (arrival order),
    submitted at ``own``'s times, each after reaching ``before_s`` (the router's clock when it waits for it), the
    replica closed at ``last_s`` (the fleet's last arrival), sampled every ``sample_s`` seconds (the fleet's).

    Raises:
        CapacityError: the model does not fit in HBM; RuntimeError: a process's error.
    """
    fleet = Fleet(scenario, policy_name, num_replicas, seed_index, indices=[index], sample_s=sample_s)
    replica, recorder = fleet.replicas[0], fleet.recorders[0]
    fleet.preload_kernels(rows["prompt_tokens"].to_numpy())
    horizon_s = scenario.run.horizon_s if scenario.run.horizon_s is not None else math.inf
    reqs = request_objects(rows)
    replica.follow(own, horizon_s, reqs)
    fleet.run(feed(fleet.env, replica, reqs, own, before_s, last_s))
    return outcome_of(replica, recorder, fleet.env.now)


def feed(
    env: simpy.Environment,
    replica: Replica,
    reqs: list,
    own: ArrivalSchedule,
    before_s: np.ndarray,
    last_s: float,
) -> Generator[simpy.Event, object, None]:
    """Submit ``reqs`` as the fleet's router does (module docstring): for each, reach ``before_s`` (the router's
    clock when it starts waiting for it), wait ``arrival_s − now`` like the router, submit; close at ``last_s``."""
    for n, req in enumerate(reqs):
        own.next_index = n
        if before_s[n] > env.now:
            yield timeout_at(env, float(before_s[n]))
        if req.arrival_s > env.now:
            yield env.timeout(req.arrival_s - env.now)
        replica.submit(req)
    own.next_index = len(reqs)
    if last_s > env.now:
        yield timeout_at(env, last_s)
    replica.close()
