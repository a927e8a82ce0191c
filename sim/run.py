"""``simulate(scenario) -> SimResult``: load the workload, run each policy on its own replica, tabulate.

An open-loop workload is submitted at its recorded arrival times (``Replica.arrivals``); a session trace is
replayed closed loop by ``sim.serving.sessions.SessionDriver`` (requests issued as earlier ones finish), with session
start times from a generator of their own, so every policy is offered the same sessions at the same times.

Each policy gets a fresh SimPy environment and a generator seeded from ``(scenario.seed, policy index)``,
so policies do not share random streams and the same seed gives identical tables.

With ``serving.replicas`` > 1 each policy runs as a fleet behind ``serving.router`` (sim/serving/cluster.py
``simulate_cluster``, the path ``plan`` checks fleets on): one summary row over the fleet, a ``replica`` column in
the requests table, a per-replica table (``replicas.csv``) and each replica's samples over time (``replica_series``);
a fleet keeps no per-step tables (it runs with ``run.tables: summary``). One replica is the single-replica path,
unchanged. Every summary row gets the bill's columns (sim/metrics/bill.py: GPUs, GPU-hours, and with a price for the
card the cost).

Before a policy runs, its workload's clock is checked (sim/metrics/physics.py ``check_clock``: a
``ScenarioError``); after, its summary is checked against the card and the compute model (``check_physics``: a
``PhysicsError``, a simulator bug), so simulate, sweep, search and plan never report an impossible number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

import traces
from sim.config import GIB, Scenario, ScenarioError, SessionsSpec
from sim.metrics import (
    SUMMARY_COLUMNS,
    layer_recall_table,
    layers_table,
    requests_table,
    steps_table,
    summarize,
    timeline_table,
    unfinished_counts,
)
from sim.metrics.bill import BILL_COLUMNS, PRICED_COLUMNS, bill, card_price
from sim.metrics.physics import bounds_of, check_clock, check_physics
from sim.serving.cluster import simulate_cluster
from sim.serving.fleet import Fleet, request_objects
from sim.serving.request import Request
from sim.serving.sessions import SessionDriver, session_starts
from sim.workload import load_workload

BASELINE = "sglang"
OFFLOAD_BASELINE = "headwise"  # the representative existing offloader
RATIO_COLUMNS = {
    "decode_tokens_per_s": "throughput_vs_sglang",
    "goodput_requests_per_s": "goodput_vs_sglang",
    "tpot_mean_s": "tpot_mean_vs_sglang",
    "tpot_p99_s": "tpot_p99_vs_sglang",
}
FLEET_COLUMNS = ["num_replicas", "router", "rejected", "incomplete"]  # summary.csv of a fleet (serving.replicas > 1)


@dataclass
class PolicyResult:
    """Tables of one policy's run; with ``run.tables: summary`` only ``requests`` and ``summary`` (others None)."""

    requests: pd.DataFrame
    steps: pd.DataFrame | None
    summary: dict
    layers: pd.DataFrame | None  # per layer totals: recall bytes, fragments, stall
    layer_recall: pd.DataFrame | None  # recall bytes per (time bin, layer)
    timeline: pd.DataFrame | None  # intervals of one decode step that recalls
    kv_pool_gib: float = 0.0  # the device KV pool of one GPU (what a request rejected as exceeds_kv_pool outgrew)
    replicas: pd.DataFrame | None = None  # a fleet's per-replica rows (sim.metrics.fleet_summary.REPLICA_COLUMNS)
    replica_series: pd.DataFrame | None = None  # a fleet's per-replica samples over time (fleet_summary.SERIES_COLUMNS)


@dataclass
class SimResult:
    """Everything a run produced; ``pulseinfer.tables_io.write_result`` puts it on disk."""

    scenario: Scenario
    workload: pd.DataFrame
    policies: dict[str, PolicyResult] = field(default_factory=dict)

    @property
    def summary(self) -> pd.DataFrame:
        """One row per policy: :data:`sim.metrics.SUMMARY_COLUMNS`, then :data:`FLEET_COLUMNS` for a fleet, then the
        bill (:data:`sim.metrics.bill.BILL_COLUMNS`, and :data:`~sim.metrics.bill.PRICED_COLUMNS` with a price)."""
        columns = [
            *SUMMARY_COLUMNS,
            *(FLEET_COLUMNS if self.scenario.serving.replicas > 1 else []),
            *BILL_COLUMNS,
            *(PRICED_COLUMNS if card_price(self.scenario) is not None else []),
        ]
        rows = [{**r.summary, **bill(r.summary, self.scenario)} for r in self.policies.values()]
        return pd.DataFrame(rows, columns=columns)

    @property
    def replicas(self) -> pd.DataFrame | None:
        """A fleet's per-replica rows with a ``policy`` column first (None for one replica)."""
        frames = [r.replicas.assign(policy=p) for p, r in self.policies.items() if r.replicas is not None]
        if not frames:
            return None
        df = pd.concat(frames, ignore_index=True)
        return df[["policy"] + [c for c in df.columns if c != "policy"]]


def simulate_policy(
    scenario: Scenario,
    workload: pd.DataFrame,
    policy_name: str,
    seed_index: int = 0,
    on_finish: Callable[[Request], None] | None = None,
) -> PolicyResult:
    """Run one policy over the workload on one replica.

    Raises:
        CapacityError: if the model does not fit in HBM.
        ScenarioError: the workload's clock would outrun float64 (:func:`sim.metrics.physics.check_clock`).
        PhysicsError: the run broke a physical bound (a simulator bug, :func:`sim.metrics.physics.check_physics`).
    """
    fleet = Fleet(scenario, policy_name, 1, seed_index, on_finish)
    replica, rec = fleet.replicas[0], fleet.recorders[0]
    check_clock(scenario, workload, replica.policy.compute)
    fleet.preload_kernels(workload["prompt_tokens"].to_numpy())
    if workload.attrs.get("warm_prefixes"):  # a measured run's server-side cache hits (sim/serving/kv.py warm)
        replica.kv.warm(workload.attrs["warm_prefixes"], int(workload.attrs["hash_block_tokens"]))
    if traces.is_session_table(workload):  # closed loop: sessions issue requests as earlier ones finish
        spec = scenario.workload.sessions or SessionsSpec()
        slots = workload.attrs.get("max_concurrency")
        if slots is not None:  # synthetic requests behind a client's concurrency cap, offered at their arrivals
            starts = workload["arrival_s"].to_numpy(dtype=float)
        else:  # same session start times for every policy: a generator of their own, not the policy's
            starts_rng = np.random.default_rng([scenario.seed, 0x5E55])
            starts = session_starts(workload["session_id"].nunique(), spec.session_rate_per_s, starts_rng)
            slots = spec.max_concurrent_sessions
        driver = SessionDriver(fleet.env, replica, workload, starts, slots)
        reason = fleet.run(driver.run())
        rec.requests.extend(driver.unissued(reason))
        requests = requests_table(rec.requests)
        requests = requests.merge(workload[["request_id", "session_id", "turn"]], on="request_id", how="left")
    else:
        fleet.run(replica.arrivals(request_objects(workload)))
        requests = requests_table(rec.requests)
    kv = replica.kv
    summary = summarize(
        policy_name, requests, rec, scenario.slo, kv.fixed_hbm_bytes, kv.block_bytes,
        fleet.end_s(requests), kv.device.peak,
    )  # fmt: skip
    check_physics(summary, bounds_of(replica.policy), scenario)
    pool_gib = kv.device.capacity * kv.block_bytes / GIB
    if not rec.keep_steps:
        return PolicyResult(requests, None, summary, None, None, None, pool_gib)
    return PolicyResult(
        requests, steps_table(rec), summary, layers_table(rec), layer_recall_table(rec), timeline_table(rec), pool_gib
    )


def simulate_fleet(
    scenario: Scenario,
    workload: pd.DataFrame,
    policy_name: str,
    seed_index: int = 0,
    on_finish: Callable[[Request], None] | None = None,
) -> PolicyResult:
    """Run one policy as ``serving.replicas`` replicas behind ``serving.router`` (sim/serving/cluster.py), with
    ``run.tables: summary`` (a fleet keeps no per-step tables): the fleet's requests (with a ``replica`` column),
    its summary row (``simulate_cluster``'s, with :data:`FLEET_COLUMNS`), per-replica rows and samples.

    Raises:
        ScenarioError: a session (closed-loop) workload, which the router cannot replay; more replicas than
            requests; or the workload's clock would outrun float64.
        CapacityError: if the model does not fit in HBM. PhysicsError: a broken physical bound (a simulator bug).
    """
    n = scenario.serving.replicas
    if traces.is_session_table(workload) or n > len(workload):
        raise ScenarioError(f"serving.replicas: {n} needs an open-loop workload of at least as many requests; this "
                            f"one is {'a session trace' if traces.is_session_table(workload) else f'{len(workload)}'}"
                            " (set serving.replicas=1, or fewer)")  # fmt: skip
    result = simulate_cluster(
        summary_only(scenario), workload, policy_name, n, scenario.serving.router, seed_index, on_finish
    )
    return PolicyResult(
        result.requests, None, result.summary, None, None, None, result.kv_pool_gib, result.replicas, result.series
    )


def simulate_one(
    scenario: Scenario,
    workload: pd.DataFrame,
    policy_name: str,
    seed_index: int = 0,
    on_finish: Callable[[Request], None] | None = None,
) -> PolicyResult:
    """One policy as the scenario deploys it: :func:`simulate_fleet` when ``serving.replicas`` > 1, else
    :func:`simulate_policy` (errors: theirs)."""
    run = simulate_fleet if scenario.serving.replicas > 1 else simulate_policy
    return run(scenario, workload, policy_name, seed_index, on_finish)


def summary_only(scenario: Scenario) -> Scenario:
    """The scenario with ``run.tables: summary`` (no per-step records kept; the summary is the same)."""
    if scenario.run.tables == "summary":
        return scenario
    return scenario.model_copy(update={"run": scenario.run.model_copy(update={"tables": "summary"})})


def policy_summary(scenario: Scenario, workload: pd.DataFrame, policy_name: str, seed_index: int = 0) -> dict:
    """One policy as the scenario deploys it (:func:`simulate_one`: one replica, or a fleet with
    ``serving.replicas`` > 1): its summary row plus :func:`unfinished_counts` (sweeps and searches run this).

    Runs with ``run.tables: summary`` whatever the scenario says (only the summary is returned).

    Raises:
        CapacityError: if the model does not fit in HBM.
        ScenarioError: a fleet over a session workload.
    """
    result = simulate_one(summary_only(scenario), workload, policy_name, seed_index=seed_index)
    return {**result.summary, **unfinished_counts(result.requests)}


def simulate(scenario: Scenario, progress: Callable[[str, int], Callable[[Request], None]] | None = None) -> SimResult:
    """Simulate every policy of the scenario on the same workload.

    Args:
        scenario: a validated scenario.
        progress: optional factory ``(policy_name, num_requests) -> on_finish callback``.

    Raises:
        ScenarioError: bad workload input.
        CapacityError: the model does not fit on the hardware.
        PhysicsError: a run broke a physical bound (a simulator bug).
    """
    workload = load_workload(scenario)
    result = SimResult(scenario, workload)
    for i, name in enumerate(scenario.policies):
        on_finish = progress(name, len(workload)) if progress else None
        result.policies[name] = simulate_one(scenario, workload, name, seed_index=i, on_finish=on_finish)
    return result


def with_ratios(summary: pd.DataFrame) -> pd.DataFrame:
    """Add ratio columns: ``*_vs_sglang`` for throughput, goodput and TPOT when sglang was run, and
    ``throughput_vs_headwise`` when the headwise baseline was run."""
    out = summary.copy()
    policies = set(summary["policy"])
    if BASELINE in policies:
        base = summary.set_index("policy").loc[BASELINE]
        for col, ratio in RATIO_COLUMNS.items():
            out[ratio] = out[col] / base[col]
    if OFFLOAD_BASELINE in policies:
        base = summary.set_index("policy").loc[OFFLOAD_BASELINE]
        out["throughput_vs_headwise"] = out["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    return out
