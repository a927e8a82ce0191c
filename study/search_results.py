"""Search results: a finished (or resumed) study → ``trials.csv``, ``pareto.csv`` and ``best.yaml``.

``trials.csv`` has one row per trial (state, feasibility, violation, parameters, every summary metric, error);
``pareto.csv`` the feasible trials not dominated in (decode tokens/s up, TPOT p99 down); ``best.yaml`` the
scenario of the best feasible trial (or the least-violating one, marked so), runnable with ``pulseinfer simulate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import yaml

from sim.config.loader import load_scenario, policy_presets
from study.search import OBJECTIVES, SearchConfig, nan_float
from study.space import override


@dataclass
class SearchResult:
    """Tables of a study."""

    trials: pd.DataFrame  # one row per trial: trial, state, feasible, violation, objective, params, metrics, error
    pareto: pd.DataFrame  # feasible, non-dominated trials (rows of ``trials``)
    best: pd.Series | None  # the chosen trial (None if no trial completed)
    best_feasible: bool = False
    files: list[Path] = field(default_factory=list)


def trials_table(study: optuna.Study, cfg: SearchConfig) -> pd.DataFrame:
    """One row per trial of the study, by trial number."""
    keys = [p.key for p in cfg.space.params]
    rows = []
    for t in study.get_trials(deepcopy=False):
        metrics = t.user_attrs.get("metrics") or {}
        constraints = t.user_attrs.get("constraints")
        complete = t.state == optuna.trial.TrialState.COMPLETE
        row = {
            "trial": t.number,
            "state": t.state.name,
            "feasible": bool(complete and constraints is not None and all(c <= 0 for c in constraints)),
            "violation": sum(max(c, 0.0) for c in constraints) if constraints is not None else math.nan,
        }
        row.update({k: t.params.get(k) for k in keys})
        row.update({k: nan_float(metrics.get(k)) for k in cfg.metric_columns})
        row["error"] = t.user_attrs.get("error", "")
        rows.append(row)
    columns = ["trial", "state", "feasible", "violation", *keys, *cfg.metric_columns, "error"]
    return pd.DataFrame(rows, columns=columns).sort_values("trial", kind="stable").reset_index(drop=True)


def pareto_front(trials: pd.DataFrame, lower: str = "tpot_p99_s") -> pd.DataFrame:
    """Feasible trials not dominated in (decode_tokens_per_s higher, ``lower`` lower: TPOT p99, or ``kl_nats``
    for the ``pareto_kl`` objective), by throughput."""
    ok = trials[trials["feasible"] & trials["decode_tokens_per_s"].notna() & trials[lower].notna()]
    thr, tpot = ok["decode_tokens_per_s"].to_numpy(), ok[lower].to_numpy()
    keep = [
        not np.any((thr >= thr[i]) & (tpot <= tpot[i]) & ((thr > thr[i]) | (tpot < tpot[i]))) for i in range(len(ok))
    ]
    front = ok[np.array(keep, dtype=bool)] if len(ok) else ok
    return front.sort_values(["decode_tokens_per_s", "trial"], ascending=[False, True]).reset_index(drop=True)


def pick_best(trials: pd.DataFrame, cfg: SearchConfig) -> tuple[pd.Series | None, bool]:
    """The best feasible trial (objective; pareto: highest throughput on the front; ties: lower TPOT p99,
    then earlier trial), or, when none is feasible, the completed trial with the least SLO violation.

    Returns:
        (row or None if nothing completed, whether it is feasible)
    """
    done = trials[trials["state"] == "COMPLETE"]
    if done.empty:
        return None, False
    feasible = done[done["feasible"]]
    if feasible.empty:
        return done.sort_values(["violation", "trial"]).iloc[0], False
    col = OBJECTIVES[cfg.objective][0][0]
    ranked = feasible.assign(_tpot=feasible["tpot_p99_s"].fillna(math.inf))
    ranked = ranked.sort_values([col, "_tpot", "trial"], ascending=[False, True, True])
    return ranked.drop(columns="_tpot").iloc[0], True


def best_scenario_yaml(cfg: SearchConfig, params: dict[str, Any], trial: int, feasible: bool) -> str:
    """A complete scenario with the best trial's parameters applied, keeping *all* of the scenario's
    policies with the tuned one first, so ``pulseinfer simulate best.yaml`` reproduces the trial's numbers
    and compares them with the baselines. Policies that are not shipped presets get a ``preset`` of their
    kind; every knob is written out, so the preset contributes nothing."""
    base = load_scenario(cfg.scenario, cfg.base_overrides())
    # The tuned policy goes first: each policy's generator is seeded by its position, so position 0
    # reproduces the trial (which simulated that policy alone) exactly.
    policies = [cfg.space.policy, *(p for p in base.policies if p != cfg.space.policy)]
    scenario = load_scenario(
        cfg.scenario,
        [*cfg.base_overrides(), f"policies={','.join(policies)}", *(override(k, v) for k, v in params.items())],
    )
    data = scenario.model_dump(mode="json")
    presets = set(policy_presets())
    for name, entry in data["policy"].items():
        if name not in presets:
            data["policy"][name] = {"preset": "sglang" if entry["kind"] == "dense" else "pulseinfer", **entry}
    verdict = "meets the SLO" if feasible else "NO trial met the SLO; this is the least-violating one"
    accuracy = f", accuracy {cfg.accuracy.describe()} on {cfg.accuracy.table.source}" if cfg.accuracy else ""
    header = [
        f"# pulseinfer search: best trial {trial} of study {cfg.study_name!r} "
        f"(objective {cfg.objective}, SLO {cfg.slo.describe()}{accuracy}): {verdict}.",
        f"# Tuned policy: {cfg.space.policy}; " + ", ".join(f"{k}={v}" for k, v in params.items()),
        "# All of the scenario's policies are kept, the tuned one first (it reproduces the trial exactly).",
        "# Run: pulseinfer simulate best.yaml",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False)


def collect_results(study: optuna.Study, cfg: SearchConfig, out_dir: Path | None = None) -> SearchResult:
    """Tables of the study; with ``out_dir``, write trials.csv, pareto.csv and (if a trial completed) best.yaml."""
    trials = trials_table(study, cfg)
    lower = "kl_nats" if cfg.objective == "pareto_kl" else "tpot_p99_s"
    result = SearchResult(trials, pareto_front(trials, lower), *pick_best(trials, cfg))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        trials.to_csv(out_dir / "trials.csv", index=False)
        result.pareto.to_csv(out_dir / "pareto.csv", index=False)
        result.files = [out_dir / "trials.csv", out_dir / "pareto.csv"]
        if result.best is not None:
            number = int(result.best["trial"])
            params = next(t.params for t in study.get_trials(deepcopy=False) if t.number == number)
            (out_dir / "best.yaml").write_text(best_scenario_yaml(cfg, params, number, result.best_feasible))
            result.files.append(out_dir / "best.yaml")
    return result
