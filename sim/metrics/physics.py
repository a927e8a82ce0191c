"""A run checks its own physics before its summary is reported; a workload checks its clock before it runs.

:func:`check_physics` holds one policy's summary row (sim/metrics/tables.py ``summarize``) against bounds no
correct simulation can break (:class:`PhysicsBounds`, from the policy's card and compute model):

* ``peak_hbm_gib`` ≤ the card's ``hbm_gib`` (per GPU);
* ``link_gbps_achieved`` ≤ the fastest rate the link model charges (the H2D bandwidth, the top of a measured
  size table, or the GPU-gather kernel's rate);
* fractions in [0, 1]: ``recall_miss_frac``, ``stall_frac``, ``offloaded_frac``, ``prefix_hit_frac`` and the
  busy fractions of the link, host gather, D2H queue and prefill (a resource is busy at most all the time). A busy
  fraction may be NaN only in a run that issued no request (``duration_s`` NaN: nothing arrived before the
  horizon), and then must be; every other fraction is always defined;
* TPOT (``tpot_*`` and ``tpot_client_*``) ≥ the least time one decode step can take (:func:`min_step_s`:
  overhead + layers + LM head for one request attending one token): a request's second to last tokens each
  come out of a decode step.

A violation is a bug in the simulator, not a result and not bad input: :class:`PhysicsError` names the check,
the measured value, the bound and the scenario, and the CLI prints it as a bug report (pulseinfer/cli.py).

:func:`check_clock` refuses, before the run, a workload whose arrivals reach so far past the shortest step
that float64 seconds stop resolving it (sim/config/checks.py ``clock_problem``): a ``ScenarioError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

import traces
from sim.config import Scenario, ScenarioError, SessionsSpec
from sim.config.checks import clock_problem

if TYPE_CHECKING:
    from sim.policies.base import Policy
    from sim.step.compute import ComputeModel

REL_TOL = 1e-6  # float sums of many steps; a real violation is far larger
FRACTIONS = (
    "recall_miss_frac", "stall_frac", "offloaded_frac", "prefix_hit_frac", "link_busy_frac", "gather_busy_frac",
    "d2h_busy_frac", "prefill_busy_frac",
)  # fmt: skip
PER_DURATION = ("link_busy_frac", "gather_busy_frac", "d2h_busy_frac", "prefill_busy_frac")  # busy time / duration
TPOTS = ("tpot_mean_s", "tpot_p50_s", "tpot_p99_s", "tpot_client_mean_s", "tpot_client_p99_s")


class PhysicsError(RuntimeError):
    """A run reported a number no correct simulation can produce: a simulator bug (to report, not to fix in the
    input).

    Attributes:
        check: what was checked, e.g. ``peak_hbm_gib <= hbm_gib``.
        measured: the value the run produced.
        bound: the bound it broke.
        where: the scenario and policy (name, policy, seed).
    """

    def __init__(self, check: str, measured: float, bound: float, where: str) -> None:
        super().__init__(check, measured, bound, where)  # (args match the signature: the error pickles)
        self.check, self.measured, self.bound, self.where = check, measured, bound, where

    def __str__(self) -> str:
        return (
            f"physics check failed: {self.check} (measured {self.measured:.6g}, bound {self.bound:.6g}) in "
            f"{self.where}; this is a simulator bug, not a result — please report it with the scenario"
        )


@dataclass(frozen=True)
class PhysicsBounds:
    """What one GPU of a policy's replica can do at most (or must take at least)."""

    hbm_gib: float  # HBM capacity per GPU (2**30 bytes)
    link_gbps: float  # fastest rate the link model charges (1e9 B/s)
    min_step_s: float  # least time of one decode step (seconds)


@dataclass(frozen=True)
class Violation:
    """One broken bound: ``check`` reads as the rule that should hold."""

    check: str
    measured: float
    bound: float


def min_layer_s(compute: ComputeModel) -> float:
    """The least time of one decode layer (seconds): one request's weights, experts and all-reduces, without
    attention (:meth:`ComputeModel.gemm_layer_s`, which grows with the batch); with a measured profile, one request
    attending one token (its linear form grows with both)."""
    return compute.decode_layer_s(1, 1) if compute.profile is not None else compute.gemm_layer_s(1)


def min_step_s(compute: ComputeModel) -> float:
    """The least time of one decode step: per-step overhead + ``num_layers`` × :func:`min_layer_s` + the LM head of
    one request, or the engine's overlapped host work of one request when longer (seconds), as the step timing takes
    it (sim/step/pipeline.py ``idle_step_s``)."""
    serial_s = compute.step_overhead_s + compute.num_layers * min_layer_s(compute) + compute.decode_head_s(1)
    return max(serial_s, compute.overlapped_host_s(1))


def bounds_of(policy: Policy) -> PhysicsBounds:
    """The bounds of one GPU of ``policy``'s replica (its card as one GPU of the group sees it, its compute)."""
    hw = policy.hardware
    link = max([hw.h2d_bandwidth_gbps, hw.gpu_gather_gbps] + [gbps for _, gbps in hw.h2d_size_table or ()])
    return PhysicsBounds(hw.hbm_gib, link, min_step_s(policy.compute))


def physics_violations(summary: dict, bounds: PhysicsBounds) -> list[Violation]:
    """Every bound ``summary`` (a summary row) breaks, in the order of the module docstring; NaN (undefined, e.g.
    TPOT with no request of two tokens) passes the TPOT bound but not a fraction, which is always defined, except a
    busy fraction (:data:`PER_DURATION`) of a run that issued nothing (``duration_s`` NaN), which must be NaN."""
    out = []
    peak = summary["peak_hbm_gib"]
    if not peak <= bounds.hbm_gib * (1 + REL_TOL):
        out.append(Violation("peak_hbm_gib <= hardware.hbm_gib", peak, bounds.hbm_gib))
    link = summary["link_gbps_achieved"]
    if not link <= bounds.link_gbps * (1 + REL_TOL):
        out.append(Violation("link_gbps_achieved <= the link's peak GB/s", link, bounds.link_gbps))
    no_window = math.isnan(summary["duration_s"])  # no request issued: no duration to divide by
    for name in FRACTIONS:
        value = summary[name]
        if name in PER_DURATION and no_window:
            if not math.isnan(value):
                out.append(Violation(f"{name} is NaN when duration_s is (nothing issued)", value, math.nan))
            continue
        if not -REL_TOL <= value <= 1 + REL_TOL:
            out.append(Violation(f"0 <= {name} <= 1", value, 0.0 if value < 0 else 1.0))
    for name in TPOTS:
        value = summary[name]
        if value < bounds.min_step_s * (1 - REL_TOL):  # (NaN compares False: no TPOT defined)
            out.append(Violation(f"{name} >= the least decode step time (roofline)", value, bounds.min_step_s))
    return out


def check_physics(summary: dict, bounds: PhysicsBounds, scenario: Scenario) -> None:
    """Raise on the first bound ``summary`` breaks (:func:`physics_violations`).

    Raises:
        PhysicsError: naming the check, the measured value, the bound, and the scenario, policy and seed.
    """
    found = physics_violations(summary, bounds)
    if found:
        first = found[0]
        where = f"scenario {scenario.name!r}, policy {summary['policy']!r}, seed {scenario.seed}"
        if len(found) > 1:
            where += f" ({len(found) - 1} more check(s) failed too)"
        raise PhysicsError(first.check, first.measured, first.bound, where)


def check_clock(scenario: Scenario, workload: pd.DataFrame, compute: ComputeModel) -> None:
    """Refuse a workload whose arrivals reach beyond :data:`sim.config.checks.CLOCK_EXACT_STEPS` decode-layer steps
    of ``compute`` (the clock where the simulation starts losing time to float64 rounding).

    The clock's reach is the last arrival (capped by ``run.horizon_s``); for closed-loop sessions, the expected last
    session start plus the longest session's think times. The message names the key that sets it.

    Raises:
        ScenarioError: one line naming the field, its value and the bound.
    """
    field, value, clock_s, scale = _clock_reach(scenario, workload)
    if scenario.run.horizon_s is not None:
        clock_s = min(clock_s, scenario.run.horizon_s)
    problem = clock_problem(field, value, clock_s, min_layer_s(compute), scale)
    if problem:
        raise ScenarioError(problem)


def _clock_reach(scenario: Scenario, workload: pd.DataFrame) -> tuple[str, float, float, str]:
    """(the key that sets how far the clock goes, its value, the clock it reaches in s, "up" or "down")."""
    w = scenario.workload
    if traces.is_session_table(workload):
        spec = w.sessions or SessionsSpec()
        starts = (workload["session_id"].nunique() - 1) / spec.session_rate_per_s
        think = float(workload.groupby("session_id")["think_time_s"].sum().max()) if len(workload) else 0.0
        if starts >= think:
            return "workload.sessions.session_rate_per_s", spec.session_rate_per_s, starts + think, "down"
        return "workload.sessions.max_think_time_s", spec.max_think_time_s or think, starts + think, "up"
    clock_s = float(workload["arrival_s"].max()) if len(workload) else 0.0
    if w.synthetic is not None:
        return "workload.synthetic.rate_per_s", w.synthetic.rate_per_s, clock_s, "down"
    if w.servegen is not None:
        return "workload.servegen.target_rate_per_s", w.servegen.target_rate_per_s, clock_s, "down"
    if w.target_rate_per_s is not None:
        return "workload.target_rate_per_s", w.target_rate_per_s, clock_s, "down"
    return "workload.time_scale", w.time_scale, clock_s, "up"
