"""Policy search with Optuna: one simulation per trial, tail SLO as constraints, TPE sampling (docs/search.md
"Search": spaces, objectives, outputs, resuming, several machines).

Lifecycle of ``run_search(cfg, total_trials, jobs)``:

1. :func:`prepare_study` opens the storage (a journal file or an RDB URL), creates or loads the study, and checks
   that a loaded study was made with the same objective, space, SLO and base scenario.
2. The missing trials (``total_trials`` minus the finished ones) are split over ``jobs`` worker processes
   (:class:`workers.WorkerPool`), each with its own seeded TPE sampler, stopping once the study holds
   ``total_trials`` finished trials; a trial cut short is marked failed and ``interrupted`` and not counted.
3. A trial applies the sampled parameters as ``--set`` items, simulates the searched policy once with the
   scenario's fixed seed (:func:`sim.run.policy_summary`) and records every summary metric as a user attribute.
   Constraints: :meth:`study.slo.TailSlo.violations` and :meth:`AccuracySlo.violations` (<= 0 is feasible). A
   combination the scenario rejects fails the trial (state ``FAIL``, ``error`` column).
4. :func:`study.search_results.collect_results` writes ``trials.csv``, ``pareto.csv`` and ``best.yaml``.

Determinism: a trial's metrics depend only on its parameters (fixed simulation seed). With one job on
a fresh study the sampler seed is a function of ``cfg.seed``, so the whole search repeats exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import pandas as pd

from sim.config import ScenarioError, load_scenario
from sim.metrics import SUMMARY_COLUMNS
from sim.run import policy_summary
from sim.serving.kv import CapacityError
from sim.workload import load_workload
from study.accuracy import OUTPUTS as ACCURACY_OUTPUTS
from study.accuracy import AccuracyError, AccuracySlo, accuracy_columns, policy_accuracy
from study.executors import FieldError
from study.slo import TailSlo
from study.space import SearchSpace, override
from workers import WorkerPool

# objective name → ((summary column, direction), ...)
OBJECTIVES: dict[str, tuple[tuple[str, str], ...]] = {
    "goodput": (("goodput_requests_per_s", "maximize"),),
    "throughput": (("decode_tokens_per_s", "maximize"),),
    "pareto": (("decode_tokens_per_s", "maximize"), ("tpot_p99_s", "minimize")),
    "pareto_kl": (("decode_tokens_per_s", "maximize"), ("kl_nats", "minimize")),
}
METRIC_COLUMNS = [c for c in SUMMARY_COLUMNS if c != "policy"] + ["rejected", "incomplete"]
FINISHED_STATES = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
# Optuna >= 5 records constraints per trial (Trial.set_constraint); older versions need constraints_func.
HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")
STUDY_ATTR = "pulseinfer"  # study user attribute holding the settings a resume must match
INTERRUPTED_ATTR = "interrupted"  # trial user attribute: stopped by Ctrl-C or SIGTERM (FAIL, not counted as finished)
Evaluate = Callable[[dict[str, Any]], dict[str, float]]


class InvalidTrial(ValueError):
    """The trial's parameters make an invalid scenario (or one that does not fit); the trial fails."""


class SearchError(FieldError):
    """A bad search setting; ``field`` names the :class:`SearchConfig` field or ``run_search`` argument."""


class StudyMismatch(SearchError):
    """An existing study was created with other settings (``field`` is ``study_name``)."""


@dataclass(frozen=True)
class SearchConfig:
    """Everything a worker needs (picklable; sent to worker processes)."""

    scenario: str
    space: SearchSpace
    slo: TailSlo
    storage: str  # journal file path, or an RDB URL (contains "://")
    study_name: str
    objective: str = "goodput"
    overrides: tuple[str, ...] = ()  # the user's --set items
    seed: int = 0  # sampler seed; trials always simulate with the scenario's own seed
    accuracy: AccuracySlo | None = None  # accuracy table and bounds (study/accuracy.py); None: not used

    @property
    def metric_columns(self) -> list[str]:
        """Metrics recorded per trial: the summary's, plus the interpolated accuracy with a table."""
        return METRIC_COLUMNS + (list(ACCURACY_OUTPUTS) if self.accuracy is not None else [])

    @property
    def accuracy_required(self) -> bool:
        """Accuracy bounds or a KL objective: a trial the table does not cover fails (nothing is extrapolated)."""
        return self.accuracy is not None and (bool(self.accuracy.bounds) or self.objective == "pareto_kl")

    def base_overrides(self) -> list[str]:
        """User overrides, then the SLO's (goodput uses the same bounds)."""
        return [*self.overrides, *self.slo.scenario_overrides()]

    def trial_overrides(self, params: dict[str, Any]) -> list[str]:
        """Overrides of one trial: base, searched policy only, then the parameters."""
        return [*self.base_overrides(), f"policies={self.space.policy}", *(override(k, v) for k, v in params.items())]


class SimulationEvaluator:
    """``params → metrics``: load the trial's scenario and simulate the searched policy once.

    The workload is cached by its spec (a search rarely changes it), so a trial costs one simulation.
    """

    def __init__(self, cfg: SearchConfig) -> None:
        self.cfg = cfg
        self._workloads: dict[str, pd.DataFrame] = {}

    def __call__(self, params: dict[str, Any]) -> dict[str, float]:
        try:
            scenario = load_scenario(self.cfg.scenario, self.cfg.trial_overrides(params))
        except ScenarioError as exc:
            raise InvalidTrial(str(exc)) from None
        policy, accuracy = self.cfg.space.policy, {}
        if self.cfg.accuracy is not None:
            try:  # before simulating: a budget the table does not cover fails at once when accuracy is bounded
                accuracy = (
                    policy_accuracy(self.cfg.accuracy.table, scenario, policy)
                    if self.cfg.accuracy_required
                    else accuracy_columns(self.cfg.accuracy.table, scenario, policy)
                )
            except AccuracyError as exc:
                raise InvalidTrial(str(exc)) from None
        key = f"{scenario.seed}:{scenario.workload.model_dump_json()}"
        if key not in self._workloads:
            self._workloads[key] = load_workload(scenario)
        try:
            summary = policy_summary(scenario, self._workloads[key], policy)
        except CapacityError as exc:
            raise InvalidTrial(str(exc)) from None
        return {**summary, **{k: accuracy[k] for k in ACCURACY_OUTPUTS if k in accuracy}}


def check_journal_file(path: str) -> None:
    """Raise SearchError (field ``storage``) unless ``path`` is absent, an empty file, or an Optuna journal (its first
    line a JSON object with an ``op_code``). Reads at most the first line; never creates or changes the file, so a
    file that is not a journal is left exactly as it was (Optuna would append its own lines to it)."""
    if not os.path.lexists(path):
        return
    if not os.path.isfile(path):
        raise SearchError(f"{path} is not a file; expected an Optuna journal file or an RDB URL", "storage")
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)  # a journal line is a few KiB at most
    except OSError as exc:
        raise SearchError(f"{path}: cannot read ({exc.strerror})", "storage") from None
    if not first:
        return  # empty: a fresh journal
    try:
        record = json.loads(first)
    except ValueError:  # not JSON, or not UTF-8
        record = None
    if not (isinstance(record, dict) and "op_code" in record):
        raise SearchError(
            f"{path} is not an Optuna journal (its first line is not a JSON object with an op_code); give a new or "
            "empty file, a study journal, or an RDB URL (the file is left as it is)",
            "storage",
        )


def open_storage(storage: str) -> optuna.storages.BaseStorage:
    """An Optuna storage: an RDB URL (``sqlite:///x.db``, ``postgresql://user:pw@host/db``) or a journal
    file path (created if missing; safe for several processes on one file system).

    Raises:
        SearchError: a journal path that holds something other than an Optuna journal (:func:`check_journal_file`;
            the file is left untouched).
    """
    if "://" in storage:
        return optuna.storages.RDBStorage(storage)
    check_journal_file(storage)
    try:
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # optuna < 4.0
        from optuna.storages import JournalFileStorage as JournalFileBackend
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.JournalStorage(JournalFileBackend(str(storage)))


def study_settings(cfg: SearchConfig) -> dict[str, str]:
    """What a resumed study must share: objective, space, SLO and a hash of the resolved base scenario."""
    scenario = load_scenario(cfg.scenario, [*cfg.base_overrides(), f"policies={cfg.space.policy}"])
    digest = hashlib.sha256(scenario.model_dump_json().encode()).hexdigest()[:16]
    settings = {
        "objective": cfg.objective,
        "space": cfg.space.signature(),
        "slo": cfg.slo.describe(),
        "scenario": digest,
    }
    if cfg.accuracy is not None:
        settings["accuracy"] = f"table {cfg.accuracy.table.signature()} bounds {cfg.accuracy.describe() or 'none'}"
    return settings


def prepare_study(cfg: SearchConfig) -> optuna.Study:
    """Create the study, or load it and check its settings.

    Raises:
        StudyMismatch: the existing study has other settings (the message names the first that differs).
    """
    directions = [d for _, d in OBJECTIVES[cfg.objective]]
    settings = study_settings(cfg)
    study = optuna.create_study(
        storage=open_storage(cfg.storage), study_name=cfg.study_name, directions=directions, load_if_exists=True
    )
    recorded = study.user_attrs.get(STUDY_ATTR)
    if recorded is None:
        if [d.name.lower() for d in study.directions] != directions:
            raise StudyMismatch(
                f"study {cfg.study_name!r} exists with other directions; use another study_name", "study_name"
            )
        study.set_user_attr(STUDY_ATTR, settings)
        return study
    for name, value in settings.items():
        if recorded.get(name) != value:
            raise StudyMismatch(
                f"study {cfg.study_name!r} was created with another {name} "
                f"({recorded.get(name)!r} vs {value!r}); resume with the same settings or use another study_name",
                "study_name",
            )
    return study


def num_finished(study: optuna.Study) -> int:
    """Trials that ran to an end (complete, failed or pruned); a trial cut short by Ctrl-C or SIGTERM (failed,
    :data:`INTERRUPTED_ATTR`) does not count, so a resumed search runs it again."""
    trials = study.get_trials(deepcopy=False, states=FINISHED_STATES)
    return sum(1 for t in trials if not t.user_attrs.get(INTERRUPTED_ATTR))


def make_sampler(cfg: SearchConfig, num_existing: int, worker_index: int) -> optuna.samplers.TPESampler:
    """A TPE sampler with the SLO constraints; its seed mixes cfg.seed, the study's size at start and the
    worker, so resumed runs and parallel workers draw different startup points."""
    seed = int(np.random.SeedSequence([cfg.seed, num_existing, worker_index]).generate_state(1)[0])
    if HAS_SET_CONSTRAINT:
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True, constraints_func=_recorded_constraints)


def _recorded_constraints(trial: optuna.trial.FrozenTrial) -> list[float]:
    return trial.user_attrs["constraints"]


def objective(trial: optuna.Trial, cfg: SearchConfig, evaluate: Evaluate) -> float | tuple[float, ...]:
    """One trial: draw parameters, simulate, record metrics and constraints, return the objective(s).

    Raises:
        InvalidTrial: the parameters make an invalid scenario (the trial fails; ``error`` user attribute).
    """
    params = {p.key: p.suggest(trial) for p in cfg.space.params}
    try:
        metrics = evaluate(params)
    except InvalidTrial as exc:
        trial.set_user_attr("error", str(exc))
        raise
    except KeyboardInterrupt:  # Optuna marks the trial failed; this mark keeps it out of the finished count
        trial.set_user_attr(INTERRUPTED_ATTR, True)
        trial.set_user_attr("error", "interrupted (Ctrl-C or SIGTERM); not counted, a resumed search runs another")
        raise
    metrics = {k: _plain(metrics.get(k)) for k in cfg.metric_columns}
    trial.set_user_attr("metrics", metrics)
    values_nan = {k: nan_float(v) for k, v in metrics.items()}
    constraints = cfg.slo.violations(values_nan)
    if cfg.accuracy is not None:
        constraints.update(cfg.accuracy.violations(values_nan))
    trial.set_user_attr("constraints", list(constraints.values()))
    if HAS_SET_CONSTRAINT:
        for name, value in constraints.items():
            trial.set_constraint(name, value)
    values = []
    for col, direction in OBJECTIVES[cfg.objective]:
        value = nan_float(metrics[col])
        values.append((math.inf if direction == "minimize" else -math.inf) if math.isnan(value) else value)
    return values[0] if len(values) == 1 else tuple(values)


def run_worker(
    cfg: SearchConfig,
    num_trials: int,
    total_trials: int,
    num_existing: int,
    worker_index: int = 0,
    evaluate: Evaluate | None = None,
    on_trial: Callable[[int], None] | None = None,
) -> None:
    """Run up to ``num_trials`` trials on the study, stopping once it holds ``total_trials`` finished ones.

    Args:
        evaluate: ``params -> metrics``; default :class:`SimulationEvaluator` (tests pass toy functions).
        on_trial: called with the study's finished-trial count after each trial.
    """
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    evaluate = evaluate or SimulationEvaluator(cfg)
    sampler = make_sampler(cfg, num_existing, worker_index)
    study = optuna.load_study(study_name=cfg.study_name, storage=open_storage(cfg.storage), sampler=sampler)
    for _ in range(num_trials):
        if num_finished(study) >= total_trials:
            break
        study.optimize(lambda t: objective(t, cfg, evaluate), n_trials=1, catch=(InvalidTrial,))
        if on_trial:
            on_trial(num_finished(study))


def trials_to_run(storage: str, study_name: str, total_trials: int) -> int:
    """How many trials :func:`run_search` would run: ``total_trials`` minus the finished trials of ``study_name``
    in ``storage`` (all of them when there is no such study; a journal file that does not exist is not created).
    The study's settings are not checked here (the search does that)."""
    if "://" not in storage and not os.path.exists(storage):
        return total_trials
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
    except KeyError:  # no study of that name yet
        return total_trials
    return max(0, total_trials - num_finished(study))


def check_run_args(total_trials: int, jobs: int) -> None:
    """Raise SearchError (``field`` = the argument's name) unless ``total_trials`` and ``jobs`` are >= 1."""
    for name, value in (("total_trials", total_trials), ("jobs", jobs)):
        if value < 1:
            raise SearchError(f"{name} must be >= 1, got {value}", name)


def run_search(
    cfg: SearchConfig,
    total_trials: int,
    jobs: int = 1,
    evaluate: Evaluate | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> optuna.Study:
    """Bring the study to ``total_trials`` finished trials with ``jobs`` worker processes (1 = in process).

    Args:
        on_progress: called with the finished-trial count as it grows.

    Raises:
        StudyMismatch: resuming a study made with other settings.
        SearchError: ``total_trials`` or ``jobs`` < 1 (see :func:`check_run_args`); objective ``pareto_kl``
            without an accuracy table (field ``objective``).
    """
    check_run_args(total_trials, jobs)
    if cfg.objective == "pareto_kl" and cfg.accuracy is None:
        raise SearchError("objective pareto_kl needs an accuracy table (SearchConfig.accuracy)", "objective")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = prepare_study(cfg)
    existing = len(study.get_trials(deepcopy=False))
    missing = max(0, total_trials - num_finished(study))
    if on_progress:
        on_progress(num_finished(study))
    shares = [missing // jobs + (i < missing % jobs) for i in range(jobs)]
    if jobs == 1 or missing <= 1:
        run_worker(cfg, missing, total_trials, existing, 0, evaluate, on_progress)
        return study
    poll = (lambda: on_progress(num_finished(study))) if on_progress else None
    # the pool stops its workers on Ctrl-C, SIGTERM or a failed worker (study/executors.py)
    with WorkerPool(min(jobs, missing)) as pool:
        futures = [
            pool.submit(run_worker, cfg, share, total_trials, existing, i, evaluate)
            for i, share in enumerate(shares)
            if share
        ]
        pool.wait(futures, on_wait=poll)
    if on_progress:
        on_progress(num_finished(study))
    return study


def _plain(value: Any) -> float | int | None:
    """A JSON-friendly number (NaN → None) for a trial's user attributes."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | np.integer):
        return int(value)
    value = float(value)
    return None if math.isnan(value) else value


def nan_float(value: Any) -> float:
    """NaN for a missing (None) metric, else the value."""
    return math.nan if value is None else value
