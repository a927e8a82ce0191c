"""Parameter sweeps: every point of grids × policies × seeds simulated once, cached by content.

``run_sweep(SweepConfig, out_dir, backend, jobs) -> SweepResult``. Points, the cache and its key, and the outputs
are described in docs/search.md "Sweeps": :func:`resolve_points` resolves and validates every point before anything
runs; a point's result is a pure function of its resolved scenario (:func:`sim.run.policy_summary`, generator index
0), cached under :func:`cache_key` by :class:`PointCache`; missing points run grouped by (grid values, seed) on
:func:`study.executors.run_tasks`, and only this process writes the cache, each group as it finishes.

:func:`sweep_table`: one row per (grid point, policy, seed) in grid order: the grid values, ``policy``,
``seed``, ``slo_met`` (:meth:`TailSlo.met`, and the accuracy bounds when given), every summary column,
``rejected``/``incomplete``, ``gpus`` (the GPUs the point's deployment is billed for, sim/metrics/bill.py
``deployment_gpus``), ``gpu_hour_usd`` and ``usd_per_million_output_tokens`` when some point's card has a price
(``cost.gpu_hour_usd``; empty for the others), the interpolated accuracy columns (``study.accuracy``) and ``error`` (a
point whose model does not fit: :class:`~sim.serving.kv.CapacityError`'s message, metrics NaN). The table does not
depend on the backend, the job count or the order points finish in.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

import traces
from sim.config import Scenario, load_scenario
from sim.metrics import SUMMARY_COLUMNS
from sim.metrics.bill import card_price, deployment_gpus, usd_per_million
from sim.metrics.physics import PhysicsBounds, bounds_of, physics_violations
from sim.policies import make_policy
from sim.run import policy_summary
from sim.serving.kv import CapacityError
from sim.workload import load_workload
from study.accuracy import AccuracySlo, accuracy_columns, output_columns
from study.executors import FieldError, run_tasks
from study.slo import TailSlo

METRIC_COLUMNS = [c for c in SUMMARY_COLUMNS if c != "policy"] + ["rejected", "incomplete"]
RESERVED_KEYS = {"policies": "--policies", "seed": "--seeds"}  # grid keys set by the sweep itself


class SweepError(FieldError):
    """A bad sweep setting; ``field`` names the :class:`SweepConfig` field or ``run_sweep`` argument."""


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep. ``grids``: ((dotted key, (value, ...)), ...), values as ``--set`` text."""

    scenario: str
    grids: tuple[tuple[str, tuple[str, ...]], ...]
    policies: tuple[str, ...]
    num_seeds: int = 1
    overrides: tuple[str, ...] = ()
    slo: TailSlo = field(default_factory=TailSlo)
    accuracy: AccuracySlo | None = None  # accuracy table and bounds; None: no accuracy columns

    @property
    def keys(self) -> list[str]:
        return [k for k, _ in self.grids]


@dataclass(frozen=True)
class Point:
    """One simulation: grid values (as given), policy, seed, its resolved scenario and cache key."""

    values: tuple[str, ...]
    policy: str
    seed: int
    scenario: Scenario
    key: str


@dataclass
class SweepResult:
    table: pd.DataFrame  # see sweep_table
    num_simulated: int  # points computed by this run
    num_cached: int  # points read from the cache
    files: list[Path] = field(default_factory=list)


def parse_grid(text: str) -> tuple[str, tuple[str, ...]]:
    """``KEY=V1,V2,...`` → (key, values). Raises SweepError (field ``grids``) naming the item."""
    key, sep, raw = (s.strip() for s in text.partition("="))
    values = tuple(v.strip() for v in raw.split(",") if v.strip())
    if not sep or not key or not values:
        raise SweepError(f"{text!r}: expected KEY=V1,V2,..., e.g. workload.synthetic.rate_per_s=1,2,4", "grids")
    if key in RESERVED_KEYS:
        raise SweepError(f"{key}: set by the sweep itself; use {RESERVED_KEYS[key]}", "grids")
    if len(set(values)) != len(values):
        raise SweepError(f"{text!r}: a value is repeated", "grids")
    return key, values


def num_points(cfg: SweepConfig) -> int:
    """How many points (simulations) the sweep has: grid values multiplied, × policies × seeds; nothing is resolved."""
    return math.prod(len(values) for _, values in cfg.grids) * len(cfg.policies) * cfg.num_seeds


def check_config(cfg: SweepConfig) -> None:
    """Raises SweepError for no grid, a repeated grid key, no policy or ``num_seeds`` < 1."""
    if not cfg.grids:
        raise SweepError("give at least one grid (KEY=V1,V2,...)", "grids")
    if len(set(cfg.keys)) != len(cfg.keys):
        raise SweepError(f"grid keys must differ, got {cfg.keys}", "grids")
    if not cfg.policies:
        raise SweepError("give at least one policy", "policies")
    if cfg.num_seeds < 1:
        raise SweepError(f"num_seeds must be >= 1, got {cfg.num_seeds}", "num_seeds")


@cache
def code_version() -> str:
    """``pulseinfer <version> src <digest>``: the digest covers every ``.py`` file of ``sim``, ``study`` (the sweep's
    own columns) and ``traces``."""
    digest = hashlib.sha256()
    for package in ("sim", "study", "traces"):
        root = Path(__import__(package).__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    try:
        release = version("pulseinfer")
    except PackageNotFoundError:
        release = "unknown"
    return f"pulseinfer {release} src {digest.hexdigest()[:16]}"


@cache
def _file_digest(path: str) -> str:
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


def cache_key(scenario: Scenario, policy: str, seed: int) -> str:
    """SHA-256 (hex) of the resolved scenario, policy, seed, trace bytes and :func:`code_version`."""
    trace = scenario.workload.trace
    payload = {
        "scenario": scenario.model_dump(mode="json"),
        "policy": policy,
        "seed": seed,
        "trace": _file_digest(str(traces.resolve_trace(trace))) if trace else None,
        "code": code_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def resolve_points(cfg: SweepConfig) -> list[Point]:
    """Every (grid values, policy, seed) in grid order (first key slowest), policies, then seeds.

    Raises:
        SweepError: see :func:`check_config`.
        ScenarioError: a grid value or override the scenario rejects (the message names the key).
    """
    check_config(cfg)
    first = [f"{k}={v[0]}" for k, v in cfg.grids]  # a synthetic workload may need a swept key to load
    base_seed = load_scenario(cfg.scenario, [*cfg.overrides, *first]).seed
    points = []
    for values in itertools.product(*(v for _, v in cfg.grids)):
        for policy in cfg.policies:
            for seed in range(base_seed, base_seed + cfg.num_seeds):
                items = [f"{k}={v}" for k, v in zip(cfg.keys, values)]
                overrides = [
                    *cfg.overrides,
                    *cfg.slo.scenario_overrides(),
                    *items,
                    f"seed={seed}",
                    f"policies={policy}",
                ]
                scenario = load_scenario(cfg.scenario, _for_policy(overrides, policy, cfg.policies))
                points.append(Point(tuple(values), policy, seed, scenario, cache_key(scenario, policy, seed)))
    return points


def _for_policy(overrides: list[str], policy: str, policies: tuple[str, ...] | list[str]) -> list[str]:
    """The overrides that apply when only ``policy`` runs: ``policy.OTHER.*`` keys of the sweep's other policies are
    left out (the scenario refuses keys of a policy that does not run)."""
    others = {f"policy.{p}." for p in policies if p != policy}
    return [o for o in overrides if not any(o.startswith(prefix) for prefix in others)]


def simulate_group(scenarios: tuple[Scenario, ...], policies: tuple[str, ...]) -> list[dict[str, Any]]:
    """Records ``{"metrics": {...}, "error": ""}`` of each (scenario, policy); scenarios that share a workload
    spec and seed load it once. A model that does not fit gives NaN metrics and the error message."""
    workloads: dict[str, pd.DataFrame] = {}
    records = []
    for scenario, policy in zip(scenarios, policies):
        spec = f"{scenario.seed}:{scenario.workload.model_dump_json()}"
        try:
            if spec not in workloads:
                workloads[spec] = load_workload(scenario)
            summary = policy_summary(scenario, workloads[spec], policy)
            records.append({"metrics": {k: _plain(summary.get(k)) for k in METRIC_COLUMNS}, "error": ""})
        except CapacityError as exc:
            records.append({"metrics": {k: None for k in METRIC_COLUMNS}, "error": str(exc)})
    return records


class PointCache:
    """JSON records under ``root/<key[:2]>/<key>.json``; each written to a temp file and renamed into place.

    A record is ``{"metrics": {column: number or null, ...}, "error": str}`` with every :data:`METRIC_COLUMNS`
    entry. A file that is not one (damaged, hand-edited, or not JSON), or whose metrics break a physics bound of the
    point's policy, is reported to ``on_invalid`` (default: a
    ``RuntimeWarning``) and read as missing, so its point is simulated again and the file rewritten.
    """

    def __init__(self, root: Path, on_invalid: Callable[[str], None] | None = None) -> None:
        self.root = root
        self.on_invalid = on_invalid or (lambda message: warnings.warn(message, RuntimeWarning, stacklevel=3))

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str, bounds: Callable[[], PhysicsBounds] | None = None) -> dict[str, Any] | None:
        """The record stored under ``key``; None when there is none or it is not a valid record (reported).

        Args:
            bounds: the physics bounds of the point's policy (called only for a well-formed record with metrics):
                a record whose metrics break one (:func:`physics_problem`) is not valid either.
        """
        path = self.path(key)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:  # not UTF-8, or not JSON
            problem: str | None = "is not valid JSON"
        else:
            problem = record_problem(record)
            if problem is None and bounds is not None and not record["error"]:
                problem = physics_problem(record["metrics"], bounds())
        if problem:
            self.on_invalid(f"sweep cache record {path} {problem}; simulating its point again")
            return None
        return record

    def put(self, key: str, record: dict[str, Any]) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, path)


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
              float: "a number", type(None): "null"}  # fmt: skip


def record_problem(record: Any) -> str | None:
    """Why ``record`` (parsed JSON) is not a cache record (see :class:`PointCache`), or None if it is one."""
    if not isinstance(record, dict):
        return f"is {JSON_TYPES.get(type(record), 'not an object')}, expected an object with metrics and error"
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        return "has no metrics object"
    missing = [k for k in METRIC_COLUMNS if k not in metrics]
    if missing:
        return f"lacks the metric(s) {', '.join(missing)}"
    bad = [k for k in METRIC_COLUMNS if metrics[k] is not None and not _is_number(metrics[k])]
    if bad:
        return f"has non-numeric metric(s) {', '.join(bad)}"
    if not isinstance(record.get("error"), str):
        return "has no error text"
    return None


def physics_problem(metrics: dict[str, Any], bounds: PhysicsBounds) -> str | None:
    """Why a record's ``metrics`` (null = NaN) could not come from a correct simulation
    (:func:`sim.metrics.physics.physics_violations`: fractions in [0, 1], peak HBM within the card, link rate within
    its peak, TPOT at least one decode step), or None."""
    found = physics_violations({k: math.nan if v is None else v for k, v in metrics.items()}, bounds)
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"breaks a physics bound: {found[0].check}, measured {found[0].measured:.6g}{more}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bounds(point: Point) -> PhysicsBounds:
    """The physics bounds of ``point``'s policy on its scenario (its card and compute model)."""
    return bounds_of(make_policy(point.scenario, point.policy))


def run_sweep(
    cfg: SweepConfig,
    out_dir: Path,
    backend: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    on_point: Callable[[int], None] | None = None,
    points: list[Point] | None = None,
    on_invalid: Callable[[str], None] | None = None,
) -> SweepResult:
    """Simulate the points missing from ``out_dir/cache`` and tabulate all of them (nothing else is written).

    Args:
        on_point: called with the number of points done (cached ones first, then as groups finish).
        points: :func:`resolve_points` of ``cfg`` when the caller already has them (they are not re-checked).
        on_invalid: called with one line per cache file that is not a valid record (its point is simulated
            again); default a ``RuntimeWarning``.

    Raises:
        SweepError, ScenarioError: see :func:`resolve_points`; ExecutorError: a bad backend or job count;
        AccuracyError: an accuracy bound on a point the accuracy table does not cover.
    """
    points = resolve_points(cfg) if points is None else points
    if cfg.accuracy is not None:
        cfg.accuracy.check_points([(p.scenario, p.policy) for p in points])
    cache = PointCache(out_dir / "cache", on_invalid)
    records = {p.key: cache.get(p.key, functools.partial(_bounds, p)) for p in points}
    missing = list({p.key: p for p in points if records[p.key] is None}.values())
    num_cached = len(points) - len(missing)
    if on_point:
        on_point(num_cached)
    groups: dict[tuple, list[Point]] = {}
    for p in missing:
        groups.setdefault((p.values, p.seed), []).append(p)
    group_points = list(groups.values())
    tasks = [(tuple(p.scenario for p in g), tuple(p.policy for p in g)) for g in group_points]
    done = [num_cached]

    def store(index: int, group_records: list[dict]) -> None:
        for p, record in zip(group_points[index], group_records):
            cache.put(p.key, record)
            records[p.key] = record
        done[0] += len(group_records)
        if on_point:
            on_point(done[0])

    run_tasks(simulate_group, tasks, backend, jobs, ray_address, on_done=store)
    return SweepResult(sweep_table(cfg, points, records), len(missing), num_cached)


def sweep_table(cfg: SweepConfig, points: list[Point], records: dict[str, dict]) -> pd.DataFrame:
    """One row per point (see the module docstring); grid values typed as YAML scalars (``4096`` → int)."""
    rows = []
    priced = any(card_price(p.scenario) is not None for p in points)
    for p in points:
        record = records[p.key]
        metrics = {k: math.nan if record["metrics"].get(k) is None else record["metrics"][k] for k in METRIC_COLUMNS}
        row: dict[str, Any] = {k: yaml.safe_load(v) for k, v in zip(cfg.keys, p.values)}
        row.update(policy=p.policy, seed=p.seed)
        met = not record["error"] and cfg.slo.met(metrics)
        gpus = deployment_gpus(p.scenario.serving, p.scenario.serving.replicas)
        metrics["gpus"] = gpus
        if priced:
            price = card_price(p.scenario)
            metrics.update(
                gpu_hour_usd=price,
                usd_per_million_output_tokens=usd_per_million(price, gpus, metrics["decode_tokens_per_s"]),
            )
        if cfg.accuracy is not None:
            acc = accuracy_columns(cfg.accuracy.table, p.scenario, p.policy)
            met = met and cfg.accuracy.met(acc)
            metrics.update(acc)
        rows.append({**row, "slo_met": bool(met), **metrics, "error": record["error"]})
    acc_cols = output_columns() if cfg.accuracy is not None else []
    bill_cols = ["gpus", *(["gpu_hour_usd", "usd_per_million_output_tokens"] if priced else [])]
    columns = [*cfg.keys, "policy", "seed", "slo_met", *METRIC_COLUMNS, *bill_cols, *acc_cols, "error"]
    return pd.DataFrame(rows, columns=columns)


def _plain(value: Any) -> float | int | None:
    """A JSON number (NaN → None)."""
    if value is None:
        return None
    if isinstance(value, bool | int | np.integer):
        return int(value)
    value = float(value)
    return None if math.isnan(value) else value


def compare_table(table: pd.DataFrame, keys: list[str], a: str, b: str, metric: str) -> pd.DataFrame:
    """Per grid cell (``keys``), policy ``a`` against ``b``: means over seeds of ``metric``, their ratio (inf when
    only B is 0, NaN when both are), and the fraction of seeds on which each meets the SLO.

    Raises:
        SweepError: ``a`` or ``b`` is not a swept policy (field ``compare``), ``metric`` not a column (``metric``).
    """
    for policy in (a, b):
        if policy not in set(table["policy"]):
            raise SweepError(f"{a}/{b}: {policy!r} is not a swept policy", "compare")
    if metric not in table.columns or metric in (*keys, "policy", "seed", "error"):
        raise SweepError(f"{metric!r}: not a numeric sweep.csv column", "metric")
    cells = table[keys].drop_duplicates().reset_index(drop=True)
    for policy, tag in ((a, "a"), (b, "b")):
        rows = table[table["policy"] == policy]
        grouped = rows.groupby(keys, sort=False).agg(
            **{f"{tag}_{metric}": (metric, "mean"), f"{tag}_slo_met_frac": ("slo_met", "mean")}
        )
        cells = cells.merge(grouped.reset_index(), on=keys, how="left")
    num, den = cells[f"a_{metric}"].to_numpy(dtype=float), cells[f"b_{metric}"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        cells["ratio"] = np.where(den > 0, num / den, np.where(num > 0, np.inf, np.nan))
    return cells
