"""Capacity planning: the highest request rate one replica sustains under a tail SLO, and the fewest
replicas that serve a target rate, for each hardware × policy (after Vidur-Search). The procedure, the
steady-state check (study/steady.py) and the fleet/single-replica agreement are in docs/search.md
"Capacity planning"; :func:`~study.bisection.bisect_max_rate`, :meth:`CellPlanner.fewest_replicas` and
:func:`agree_with_single` say exactly what each does.

Model assumption: feasibility falls with rate (bisection needs it; a simulator with preemption can be
non-monotone near the knee), and more replicas never miss an SLO that fewer met.

Every simulation uses the scenario's seed, so a plan is deterministic. In → out:
``run_plan(PlanConfig) -> DataFrame`` with :data:`PLAN_COLUMNS`; ``run_plan(..., points=[])`` also fills the list
with one row of :data:`POINT_COLUMNS` per single-replica simulation (every rate the bisection probed), the points
of the Pareto figure (plots/pareto.py). :func:`plan_cell` returns a :class:`CellPlan`, which indexes as the cell's
plan rows and carries its points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from sim.config import DEFAULT_ENGINE, Scenario, load_scenario
from sim.metrics import unfinished_counts
from sim.metrics.bill import deployment_gpus, usd_per_million
from sim.run import simulate_policy, summary_only
from sim.serving.cluster import ROUTERS, simulate_cluster
from sim.serving.kv import device_pool_blocks
from sim.step.gpu import GpuView
from sim.workload import load_workload
from study.bisection import bisect_max_rate
from study.executors import FieldError, run_tasks
from study.plan_notes import agree_with_single, sample_note
from study.slo import TailSlo
from study.steady import MIN_SAMPLE_REQUESTS, delivered_frac, steady_problem

PLAN_COLUMNS = [
    "hardware", "policy", "max_rate_per_s", "tpot_p99_s", "ttft_p99_s", "decode_tokens_per_s",
    "target_rate_per_s", "router", "replicas_for_target", "meets_slo", "cluster_tpot_p99_s",
    "cluster_ttft_p99_s", "cluster_decode_tokens_per_s", "num_simulations", "gpu_hour_usd",
    "usd_per_million_output_tokens", "delivered_frac", "note", "tp_size", "gpus_for_target", "gpus_billed",
    "usd_per_hour", "slo",
]  # fmt: skip
# The bill (sim/metrics/bill.py, as simulate's): ``gpus_billed`` = the replicas' decode GPUs plus, with disaggregated
# prefill, each replica's prefill pool (one replica without --target-rate, else the fleet for the target);
# ``usd_per_hour`` = gpus_billed × gpu_hour_usd; ``usd_per_million_output_tokens`` = that over the decode tokens.
# ``gpus_for_target`` counts decode GPUs only (replicas × tp_size). ``slo``: the SLO planned for (--slo's form).

POINT_COLUMNS = [
    "hardware", "policy", "tp_size", "engine", "rate_per_s", "decode_tokens_per_s", "tpot_mean_s", "tpot_p50_s",
    "tpot_p99_s", "ttft_p99_s", "gpus", "meets_slo", "gpu_hour_usd", "usd_per_million_output_tokens",
]  # fmt: skip
# One row per single-replica simulation of a cell (CellPlanner.single), in rate order: ``rate_per_s`` the offered rate,
# the latency and throughput columns the run's summary; ``tp_size`` = the replica's decode GPUs, ``gpus`` = the GPUs
# it is billed for (sim/metrics/bill.py deployment_gpus: with disaggregated prefill, its prefill pool too);
# ``engine`` = the scenario's engine line ('' for the built-in generic one); ``meets_slo`` as CellPlanner.met (the SLO
# held and the run was a steady-state sample); ``usd_per_million_output_tokens`` over ``gpus`` (None without a price).

# Progress callback: (hardware, policy, what was simulated, SLO met) after each simulation.
OnSim = Callable[[str, str, str, bool], None]


class PlanError(FieldError):
    """A bad plan setting; ``field`` names the :class:`PlanConfig` field or ``run_plan`` argument."""


@dataclass(frozen=True)
class PlanConfig:
    """What to plan. ``overrides`` are the user's ``--set`` items; the SLO's are added per run."""

    scenario: str
    slo: TailSlo
    hardware: tuple[str, ...]
    policies: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    target_rate_per_s: float | None = None
    routers: tuple[str, ...] = ROUTERS
    max_requests: int | None = 600  # requests per replica (>= 20); None = the scenario's workload as is
    rel_tol: float = 0.05  # bisection stops when hi / lo - 1 <= rel_tol; at least MIN_REL_TOL
    max_steps: int = 8  # doublings (or halvings) while bracketing: rates in [start / 2**8, start * 2**8]
    max_replicas: int = 64
    gpu_hour_usd: dict[str, float] = field(default_factory=dict)  # hardware card name → $ per GPU-hour
    swap_hardware: bool = True  # False: ``hardware`` is just the scenario's own card's name, not applied


MIN_REL_TOL = 1e-4  # a finer bisection only adds simulations whose rates differ by less than the sampling noise


class CellPlanner:
    """Simulations of one (hardware, policy) cell; results are memoised by rate and replica count."""

    def __init__(self, cfg: PlanConfig, hardware: str, policy: str, on_sim: OnSim | None = None) -> None:
        self.cfg, self.hardware, self.policy = cfg, hardware, policy
        self.on_sim = on_sim or (lambda *_: None)
        # The card goes first, so --set hardware.* tweaks apply to every card.
        card = [f"hardware={hardware}"] if cfg.swap_hardware else []
        self.base = [*card, *cfg.overrides, *cfg.slo.scenario_overrides(), f"policies={policy}"]
        self.num_simulations = 0
        self._single: dict[float, dict] = {}

    def scenario(self, num_requests: int | None, rate: float | None):
        """The cell's scenario with a request cap and (if given) the rate applied."""
        extra = [] if num_requests is None else [f"workload.max_requests={num_requests}"]
        if rate is not None:
            extra += ["workload.time_scale=1", f"workload.target_rate_per_s={rate!r}"]
        return load_scenario(self.cfg.scenario, [*self.base, *extra])

    def start_rate(self) -> float:
        """The arrival rate of the request slice as the scenario replays it, (n - 1) / span.

        Raises:
            ScenarioError: if the slice has fewer than two distinct arrival times.
        """
        arrivals = load_workload(self.scenario(self.cfg.max_requests, None))["arrival_s"]
        span = float(arrivals.iloc[-1] - arrivals.iloc[0])
        if len(arrivals) < MIN_SAMPLE_REQUESTS or span <= 0:
            raise PlanError(
                f"max_requests: the workload slice has {len(arrivals)} requests over {span:g} s; a steady-state "
                f"sample needs >= {MIN_SAMPLE_REQUESTS} requests with distinct arrivals",
                "max_requests",
            )
        return (len(arrivals) - 1) / span

    def single(self, rate: float) -> dict:
        """Summary (+ rejected, incomplete) of one replica at ``rate``."""
        if rate not in self._single:
            scenario = summary_only(self.scenario(self.cfg.max_requests, rate))  # the plan reads no step table
            result = simulate_policy(scenario, load_workload(scenario), self.policy)
            summary = {**result.summary, **unfinished_counts(result.requests)}  # as sim.run.policy_summary
            summary.update(
                steady_problem=steady_problem(result.requests), delivered_frac=delivered_frac(result.requests)
            )
            self.num_simulations += 1
            self.on_sim(self.hardware, self.policy, f"1 replica @ {rate:.3g}/s", self.met(summary))
            self._single[rate] = summary
        return self._single[rate]

    def points(self, scenario: Scenario, price: float | None) -> list[dict]:
        """One row of :data:`POINT_COLUMNS` per single-replica simulation so far, in rate order.

        Args:
            scenario: the cell's scenario (its card, serving and engine; the rate is the row's own).
            price: US$ per GPU-hour of the cell's card, or None.
        """
        gpus = deployment_gpus(scenario.serving, 1)
        engine = "" if scenario.engine.name == DEFAULT_ENGINE.name else scenario.engine.name
        rows = []
        for rate in sorted(self._single):
            summary = self._single[rate]
            tokens_per_s = summary.get("decode_tokens_per_s", math.nan)
            per_million = usd_per_million(price, gpus, tokens_per_s)
            row = {
                "hardware": self.hardware,
                "policy": self.policy,
                "tp_size": scenario.serving.tp_size,
                "engine": engine,
                "rate_per_s": rate,
                **{col: summary.get(col, math.nan) for col in POINT_COLUMNS[5:10]},
                "gpus": gpus,
                "meets_slo": self.met(summary),
                "gpu_hour_usd": price,
                "usd_per_million_output_tokens": None if math.isnan(per_million) else per_million,
            }
            rows.append(row)
        return rows

    def met(self, summary: dict) -> bool:
        """The SLO holds and the run was a steady-state sample (``steady_problem`` None or absent)."""
        return self.cfg.slo.met(summary) and not summary.get("steady_problem")

    def cluster(self, num_replicas: int, router: str) -> dict:
        """Cluster summary of ``num_replicas`` replicas behind ``router`` at the target rate."""
        per_replica = self.cfg.max_requests
        num_requests = None if per_replica is None else per_replica * num_replicas
        scenario = summary_only(self.scenario(num_requests, self.cfg.target_rate_per_s))
        result = simulate_cluster(scenario, load_workload(scenario), self.policy, num_replicas, router)
        self.num_simulations += 1
        result.summary.update(
            steady_problem=steady_problem(result.requests), delivered_frac=delivered_frac(result.requests)
        )
        self.on_sim(self.hardware, self.policy, f"{num_replicas} x {router}", self.met(result.summary))
        return result.summary

    def fewest_replicas(self, router: str, start: int) -> tuple[int | None, dict]:
        """Fewest replicas behind ``router`` meeting the SLO at the target rate, searched from ``start``.

        Gallops away from ``start`` (±1, ±2, ±4 …) until a meeting and a missing count bracket the answer,
        then bisects; assumes more replicas never miss an SLO that fewer met. None above ``max_replicas``.
        """
        cap, met = self.cfg.max_replicas, self.met
        summaries: dict[int, dict] = {}

        def meets(n: int) -> bool:
            if n not in summaries:
                summaries[n] = self.cluster(n, router)
            return met(summaries[n])

        n = min(cap, max(1, start))
        lo, hi, step = 0, None, 1  # lo: largest count known to miss (0: trivially); hi: smallest known to meet
        if meets(n):
            hi = n
            while hi - step >= 1 and meets(hi - step):
                hi, step = hi - step, step * 2
            lo = max(lo, hi - step)
        else:
            lo = n
            while hi is None:
                if lo >= cap:
                    return None, summaries[lo]
                candidate = min(cap, lo + step)
                if meets(candidate):
                    hi = candidate
                else:
                    lo, step = candidate, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if meets(mid):
                hi = mid
            else:
                lo = mid
        return hi, summaries[hi]


def check_plan(cfg: PlanConfig, jobs: int = 1) -> None:
    """Fail fast, before any simulation: every cell's scenario loads and its model fits on its hardware.

    Raises:
        ScenarioError: bad scenario, override, hardware card or policy name.
        CapacityError: the model does not fit on one of the hardware cards.
        PlanError: a bad ``routers``, ``target_rate_per_s``, ``max_requests``, ``rel_tol``, ``max_replicas`` or
            ``jobs`` (its ``field`` names which).
    """
    if not cfg.routers or any(r not in ROUTERS for r in cfg.routers):
        raise PlanError(f"routers must be names from {', '.join(ROUTERS)}, got {list(cfg.routers)!r}", "routers")
    bounds = [
        (
            "target_rate_per_s",
            cfg.target_rate_per_s,
            "a finite number > 0",
            cfg.target_rate_per_s is None or (math.isfinite(cfg.target_rate_per_s) and cfg.target_rate_per_s > 0),
        ),
        (
            "max_requests",
            cfg.max_requests,
            f">= {MIN_SAMPLE_REQUESTS}",
            cfg.max_requests is None or cfg.max_requests >= MIN_SAMPLE_REQUESTS,
        ),
        ("rel_tol", cfg.rel_tol, f"in [{MIN_REL_TOL:g}, 1]", MIN_REL_TOL <= cfg.rel_tol <= 1),
        ("max_replicas", cfg.max_replicas, ">= 1", cfg.max_replicas >= 1),
        ("jobs", jobs, ">= 1", jobs >= 1),
    ]
    for name, value, expected, ok in bounds:
        if not ok:
            raise PlanError(f"{name} must be {expected}, got {value}", name)
    for hardware in cfg.hardware:
        for policy in cfg.policies:
            scenario = CellPlanner(cfg, hardware, policy).scenario(cfg.max_requests, None)
            gpu = GpuView.of(scenario)
            device_pool_blocks(gpu.model, gpu.hardware, scenario.policy[policy].block_size)


@dataclass(frozen=True)
class CellPlan(Sequence):
    """One (hardware, policy) cell's plan. Indexes, slices and iterates as ``rows`` (what :func:`plan_cell` returned
    before it kept its points), so ``plan_cell(...)[0]`` is the cell's first plan row."""

    rows: list[dict]  # PLAN_COLUMNS: one per router with a target rate, else one
    points: list[dict]  # POINT_COLUMNS: one per single-replica simulation, in rate order

    def __getitem__(self, index):
        return self.rows[index]

    def __len__(self) -> int:
        return len(self.rows)


def plan_cell(cfg: PlanConfig, hardware: str, policy: str, on_sim: OnSim | None = None) -> CellPlan:
    """The plan of one (hardware, policy): its rows of :data:`PLAN_COLUMNS` (one per router with a target rate, else
    one) and its single-replica points (:data:`POINT_COLUMNS`).

    Raises:
        ScenarioError: bad scenario, hardware or policy name.
        CapacityError: the model does not fit on the hardware.
        PlanError: a workload slice too small for a steady-state sample.
    """
    cell = CellPlanner(cfg, hardware, policy, on_sim)
    scenario = cell.scenario(cfg.max_requests, None)  # plan sets the replica count: serving.replicas unused
    price = cfg.gpu_hour_usd.get(hardware, cfg.gpu_hour_usd.get(hardware.lower()))
    rows = _cell_rows(cell, scenario.serving, price)
    return CellPlan(rows, cell.points(scenario, price))


def _cell_rows(cell: CellPlanner, serving, price: float | None) -> list[dict]:
    """Bisect the cell's single-replica maximum, then (with a target rate) search each router's fleet; the rows of
    :data:`PLAN_COLUMNS`."""
    cfg, hardware, policy = cell.cfg, cell.hardware, cell.policy
    found = bisect_max_rate(lambda r: cell.met(cell.single(r)), cell.start_rate(), cfg.rel_tol, cfg.max_steps)
    at_max = cell.single(found.rate) if found.rate > 0 else {}
    tp = serving.tp_size  # GPUs per replica: plan counts GPUs
    base = {
        "hardware": hardware,
        "policy": policy,
        "max_rate_per_s": found.rate,
        "tpot_p99_s": at_max.get("tpot_p99_s", math.nan),
        "ttft_p99_s": at_max.get("ttft_p99_s", math.nan),
        "decode_tokens_per_s": at_max.get("decode_tokens_per_s", math.nan),
        "target_rate_per_s": cfg.target_rate_per_s,
        "gpu_hour_usd": price,
        "delivered_frac": at_max.get("delivered_frac", math.nan),
        "tp_size": tp,
        "slo": cfg.slo.describe(),  # the tail SLO planned for, as --slo takes it (tpot_p99_ms=50,ttft_p99_s=10)
    }
    single_note = sample_note(cell, found)
    if cfg.target_rate_per_s is None:
        cost = _bill(price, serving, 1, base["decode_tokens_per_s"])
        row = {**base, "router": "", "meets_slo": found.rate > 0, **cost}
        return _finish_rows([{**row, "note": single_note}], cell)
    rows = []
    # One replica misses the SLO even when idle: more replicas cannot help.
    start = math.ceil(cfg.target_rate_per_s / found.rate) if found.rate > 0 else None
    for router in cfg.routers:
        n, summary = cell.fewest_replicas(router, start) if start else (None, {})
        n, summary, fleet_note = agree_with_single(cell, router, n, summary, found.rate)
        start = n or start  # the next router starts from this one's answer
        tokens_per_s = summary.get("decode_tokens_per_s", math.nan) if n else math.nan
        row = {
            **base,
            "router": router,
            "replicas_for_target": n,
            "meets_slo": n is not None,
            "cluster_tpot_p99_s": summary.get("tpot_p99_s", math.nan),
            "cluster_ttft_p99_s": summary.get("ttft_p99_s", math.nan),
            "cluster_decode_tokens_per_s": tokens_per_s,
            **_bill(price, serving, n or 0, tokens_per_s),
            "note": "; ".join(x for x in (single_note, fleet_note) if x),
            "gpus_for_target": n * tp if n else None,
        }
        rows.append(row)
    return _finish_rows(rows, cell)


def _finish_rows(rows: list[dict], cell: CellPlanner) -> list[dict]:
    """Rows in :data:`PLAN_COLUMNS` order; ``num_simulations`` counts the whole cell."""
    return [{col: {**row, "num_simulations": cell.num_simulations}.get(col) for col in PLAN_COLUMNS} for row in rows]


def _bill(price: float | None, serving, replicas: int, tokens_per_s: float) -> dict:
    """``gpus_billed``, ``usd_per_hour`` and ``usd_per_million_output_tokens`` of ``replicas`` replicas producing
    ``tokens_per_s`` (None where undefined: no price, no replicas or no tokens)."""
    gpus = deployment_gpus(serving, replicas)
    per_million = usd_per_million(price, gpus, tokens_per_s)
    return {
        "gpus_billed": gpus or None,
        "usd_per_hour": price * gpus if price is not None and gpus else None,
        "usd_per_million_output_tokens": None if math.isnan(per_million) else per_million,
    }


def cheapest_fleets(table: pd.DataFrame) -> pd.DataFrame:
    """Per hardware card, the priced row that meets the SLO at the least cost, sorted by cost (cheapest first).

    Cost is ``usd_per_hour`` with a target rate (every fleet serves the same rate), else
    ``usd_per_million_output_tokens`` (one replica at its own maximum). Cards without a price or without a row
    that meets the SLO are left out.
    """
    key = "usd_per_hour" if table["target_rate_per_s"].notna().any() else "usd_per_million_output_tokens"
    ok = table[table["meets_slo"].astype(bool) & table[key].notna()].copy()
    ok[key] = ok[key].astype(float)
    ok = ok.sort_values([key, "usd_per_million_output_tokens", "hardware", "policy"], kind="stable")
    return ok.drop_duplicates("hardware").reset_index(drop=True)


def run_plan(
    cfg: PlanConfig,
    jobs: int = 1,
    on_sim: OnSim | None = None,
    on_cell: Callable[[str, str], None] | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    points: list[dict] | None = None,
) -> pd.DataFrame:
    """Plan every hardware × policy cell; ``jobs`` > 1 runs cells in that many worker processes, ``backend="ray"``
    as Ray tasks (:func:`study.executors.run_tasks`, which stops them on Ctrl-C, SIGTERM or a failed cell).

    Args:
        on_sim: called after each simulation (serial runs only).
        on_cell: called with (hardware, policy) as each cell finishes.
        points: a list that receives the plan's single-replica points, rows of :data:`POINT_COLUMNS` (cells in
            plan order, each in rate order); None: they are dropped.

    Returns:
        The plan table, :data:`PLAN_COLUMNS`.

    Raises:
        ScenarioError, CapacityError: from the first cell that fails. ExecutorError: a bad backend.
    """
    cells = [(h, p) for h in cfg.hardware for p in cfg.policies]
    if backend == "local" and (jobs <= 1 or len(cells) == 1):
        results = []
        for h, p in cells:
            results.append(plan_cell(cfg, h, p, on_sim))
            if on_cell:
                on_cell(h, p)
    else:  # worker processes or Ray; both stop their workers on Ctrl-C, SIGTERM or a failed cell
        done = (lambda i, _rows: on_cell(*cells[i])) if on_cell else None
        results = run_tasks(
            plan_cell, [(cfg, h, p) for h, p in cells], backend, min(jobs, len(cells)), ray_address, done
        )
    if points is not None:
        points.extend(point for cell in results for point in cell.points)
    rows = [row for cell in results for row in cell.rows]
    return pd.DataFrame(rows, columns=PLAN_COLUMNS)
