"""N replicas of one policy in one SimPy environment, and the run loop every simulation shares.

Each replica gets its own policy object (so its own admission state), KV pool, devices, recorder and a
generator seeded from ``(scenario.seed, seed_index, replica)`` — replica 0 from ``(seed, seed_index)`` alone,
so a one-replica fleet *is* the single-replica simulation. Replicas are packed onto nodes in index order and
share their node's host path (:func:`replicas_sharing_node`, sim/config/parallel.py ``host_share``). A driver
process feeds requests: open-loop arrivals (:meth:`Replica.arrivals`), a router (sim/serving/cluster.py) or
closed-loop sessions (sim/serving/sessions.py); :meth:`Fleet.run` runs until every replica is done or the horizon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence

import numpy as np
import pandas as pd
import simpy
from simpy.core import EmptySchedule, StopSimulation

from sim.config import Scenario
from sim.metrics.outcomes import HORIZON, STUCK
from sim.metrics.recorder import Recorder
from sim.policies import make_policy
from sim.serving.replica import Replica
from sim.serving.request import Request

SAMPLES_OVER_ARRIVALS, MIN_SAMPLE_S = 500, 0.1  # a fleet's per-replica series (sample_interval_s): points, floor (s)


def request_objects(workload: pd.DataFrame) -> list[Request]:
    """One :class:`Request` per workload row, in row (arrival) order."""
    cols = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
    reqs = [Request(int(i), float(a), int(p), int(o)) for i, a, p, o in zip(*(workload[c] for c in cols))]
    block_tokens = int(workload.attrs.get("hash_block_tokens", 0))
    if block_tokens and "hash_ids" in workload.columns:  # prefix-block hashes (sim/serving/prefix.py)
        for req, ids in zip(reqs, workload["hash_ids"]):
            req.hash_ids, req.hash_block_tokens = tuple(ids), block_tokens
    return reqs


def sample_interval_s(workload: pd.DataFrame) -> float:
    """Seconds between a fleet's per-replica samples (``Recorder.sample_s``, the ``replica_series`` table): the
    workload's arrival span / :data:`SAMPLES_OVER_ARRIVALS`, at least :data:`MIN_SAMPLE_S`: ~500 samples a replica
    over the arrivals of any trace (a day's trace: one every ~3 min), plus the drain's at the same interval."""
    arrival_s = workload["arrival_s"].to_numpy(dtype=float)
    return max(float(np.ptp(arrival_s)) / SAMPLES_OVER_ARRIVALS if len(arrival_s) else 0.0, MIN_SAMPLE_S)


def replicas_sharing_node(scenario: Scenario, num_replicas: int) -> list[int]:
    """For each of ``num_replicas`` replicas, the replicas on its node, its own included (int list, length N).

    Placement: replicas are packed in index order, ``gpus_per_node // tp_size`` to a node (the last node may hold
    fewer). A single replica keeps its card's ``replicas_sharing_node`` (1 unless a scenario sets it).
    """
    if num_replicas == 1:
        return [scenario.hardware.replicas_sharing_node]
    per_node = max(1, scenario.hardware.gpus_per_node // scenario.serving.tp_size)
    return [min(per_node, num_replicas - (i // per_node) * per_node) for i in range(num_replicas)]


def on_node(scenario: Scenario, sharing: int) -> Scenario:
    """``scenario`` with its card's ``replicas_sharing_node`` set to ``sharing`` (the scenario itself if unchanged):
    the card then gives each GPU its share of the node's host path (sim/config/parallel.py ``host_share``)."""
    hardware = scenario.hardware
    if hardware.replicas_sharing_node == sharing:
        return scenario
    return scenario.model_copy(update={"hardware": hardware.model_copy(update={"replicas_sharing_node": sharing})})


class Fleet:
    """Replicas of one policy sharing an environment.

    Args:
        scenario: the validated scenario.
        policy_name: a name in ``scenario.policies``.
        num_replicas: >= 1.
        seed_index: which of the scenario's generator streams (the policy's index in a single run).
        on_finish: called with each finished or rejected request.
        indices: which replicas of the ``num_replicas`` to build (default all), each seeded and placed as in the
            whole fleet (a worker process simulating some replicas of a static router, sim/serving/fleet_pool.py).
        sample_s: seconds between the recorders' samples (``Recorder.samples``; :func:`sample_interval_s`).

    Raises:
        CapacityError: if the model does not fit in HBM.
    """

    def __init__(
        self,
        scenario: Scenario,
        policy_name: str,
        num_replicas: int = 1,
        seed_index: int = 0,
        on_finish: Callable[[Request], None] | None = None,
        indices: Sequence[int] | None = None,
        sample_s: float = math.inf,
    ) -> None:
        self.scenario = scenario
        self.env = simpy.Environment()
        self.replicas: list[Replica] = []
        self.recorders: list[Recorder] = []
        run = scenario.run
        sharing = replicas_sharing_node(scenario, num_replicas)
        for i in range(num_replicas) if indices is None else indices:
            rng = np.random.default_rng([scenario.seed, seed_index, *([i] if i else [])])
            rec = Recorder(
                scenario.model.num_layers, run.layer_bin_s, run.timeline_step, run.tables == "all", sample_s=sample_s
            )
            policy = make_policy(on_node(scenario, sharing[i]), policy_name)
            self.replicas.append(Replica(self.env, scenario, policy, rng, rec, on_finish))
            self.recorders.append(rec)

    def preload_kernels(self, prompt_tokens: np.ndarray) -> None:
        """Before the event loop: load the compiled kernels of skip-ahead over offloaded steps when a request with
        the longest of these prompts would run offloaded (sim/step/timing.py ``preload_kernels``); a
        one-time start-up cost that would otherwise land inside the loop at the first offloaded step."""
        replica = self.replicas[0]
        if not (len(prompt_tokens) and replica.offload_runs):
            return
        if replica.policy.wants_offload(int(np.max(prompt_tokens))):
            from sim.step.timing import preload_kernels

            preload_kernels(self.scenario.run.kernels)

    def run(self, driver: Generator[simpy.Event, object, None]) -> str:
        """Start ``driver``, then run every replica's scheduler until all are done or the horizon.

        Requests that arrived but neither finished nor were rejected are recorded as unfinished with the
        returned reason: :data:`HORIZON` (the horizon cut them) or :data:`STUCK` (nothing could make progress: no
        event was left before every replica was done). An exception of a process (e.g. the layer pipeline's
        deadlock ``RuntimeError``) propagates.
        """
        env = self.env
        env.process(driver)
        mains = [env.process(r.run()) for r in self.replicas]
        done = mains[0] if len(mains) == 1 else env.all_of(mains)
        horizon = self.scenario.run.horizon_s
        until = done if horizon is None else env.any_of([done, env.timeout(horizon)])
        reason = HORIZON if _run_until(env, until) else STUCK
        for replica, rec in zip(self.replicas, self.recorders):
            _collect_unfinished(replica, rec, reason)
        return reason

    def end_s(self, requests: pd.DataFrame) -> float:
        """When the run ended: the last finish, or the clock when a horizon cut it (or nothing finished)."""
        end_s = float(requests["finish_s"].max()) if self.scenario.run.horizon_s is None else self.env.now
        return self.env.now if np.isnan(end_s) else end_s


def _run_until(env: simpy.Environment, until: simpy.Event) -> bool:
    """``env.run(until=until)`` that tells an empty schedule apart from any other error: True when ``until`` fired,
    False when no event was left before it (SimPy's ``run`` turns that case into a bare ``RuntimeError``, which an
    error raised inside a process would then read as)."""
    until.callbacks.append(StopSimulation.callback)
    try:
        while True:
            env.step()
    except StopSimulation:
        return True
    except EmptySchedule:
        return False


def _collect_unfinished(replica: Replica, rec: Recorder, reason: str) -> None:
    """Record the requests that arrived but neither finished nor were rejected, with ``reason``."""
    if len(replica.batch):
        replica.batch.remove_all()
    recorded = {r.request_id for r in rec.requests}
    for r in replica.submitted:
        if r.request_id not in recorded:
            r.unfinished_reason = reason
            rec.requests.append(r)
