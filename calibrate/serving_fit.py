"""Fit the compute model's efficiencies to the serving suite's fit set (``pulseinfer calibrate serving``).

The compute model (sim/step/compute.py) has physically meaningful parameters on the hardware card
(:data:`FIT_PARAMETERS`, each with bounds). One set of values is fitted for every card — the cards differ by their
datasheet peaks, the parameters are shares of those peaks and per-kernel or per-step costs — by an Optuna TPE search
(seeded) that minimises the mean over the fit-set cases of the mean over each case's metrics of |ln(simulated /
measured)| (each case counts once, however many metrics its source gives; a log error treats 2× too fast and 2× too
slow alike). The check set is never read by the fit: it is run once afterwards with the fitted values, and both
sets' errors are reported (:func:`calibrate.serving_cases.suite_report`). The result is written as one profile per
card (``<card>.yaml``: the card with the fitted values, usable as ``--set profile=DIR/<card>.yaml``) and
``fit.yaml`` (values, bounds, loss, trials, provenance).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna

from calibrate.serving_cases import ServingCase, load_suite, run_serving_case, suite_table
from sim.study.executors import WorkerPool

# HardwareSpec field: (low, high, log scale). Bounds are physical: a share of a peak in (0, 1]; per-kernel and per-step
# costs from "none" to well past what any public profile shows (docs/sources.md §11 gives the reasoning per bound).
FIT_PARAMETERS: dict[str, tuple[float, float, bool]] = {
    "hbm_efficiency": (0.5, 0.95, False),  # STREAM-like copies reach ~90 % of HBM peak on Hopper
    "hbm_half_bytes": (1e4, 6.4e7, True),  # 10 KB .. 64 MB: a kernel reading H bytes runs at half of the above
    "attn_efficiency": (0.3, 1.0, False),  # decode attention relative to a large GEMM's weight read
    "attn_half_tokens": (1.0, 16384.0, True),  # context per request at which attention reaches half of it
    "moe_efficiency": (0.1, 1.0, False),  # grouped GEMMs of touched experts
    "prefill_mfu": (0.2, 0.85, False),  # GEMM share of the tensor peak
    "decode_step_overhead_us": (20.0, 20000.0, True),  # scheduler and launches of one decode step
    "decode_request_overhead_us": (0.1, 300.0, True),  # sampling, detokenisation, scheduling of one request
    "allreduce_call_us": (0.5, 500.0, True),  # launch and synchronisation of one all-reduce
}
MISSING_LOSS = 3.0  # a metric the simulation could not produce (e.g. nothing finished) counts as e^3 ≈ 20× off


@dataclass
class FitResult:
    """What a fit found: the values, the fit loss, and the rows of both sets simulated with them."""

    params: dict[str, float]
    loss: float
    trials: int
    history: list[float] = field(default_factory=list)  # best loss after each trial


def overrides_for(params: dict[str, float]) -> list[str]:
    """``--set`` overrides putting ``params`` on the scenario's hardware card."""
    return [f"hardware.{name}={value!r}" for name, value in params.items()]


def case_loss(rows: list[dict]) -> float:
    """Mean |ln(simulated / measured)| over one case's compared rows (:data:`MISSING_LOSS` for a missing value)."""
    losses = []
    for row in rows:
        sim, meas = row["simulated"], row["measured"]
        losses.append(abs(math.log(sim / meas)) if math.isfinite(sim) and sim > 0 else MISSING_LOSS)
    return sum(losses) / len(losses) if losses else 0.0


def _case_rows(name: str, overrides: list[str]) -> list[dict]:
    (case,) = load_suite([name])
    return run_serving_case(case, overrides)


def evaluate(
    cases: list[ServingCase], params: dict[str, float], pool: WorkerPool | None = None
) -> tuple[float, list[dict]]:
    """Simulate ``cases`` with ``params``: (mean case loss, every row). Cases not modelled add rows, no loss."""
    overrides = overrides_for(params)
    names = [c.name for c in cases]
    if pool is None:
        per_case = [_case_rows(n, overrides) for n in names]
    else:
        futures = [pool.submit(_case_rows, n, overrides) for n in names]
        pool.wait(futures)
        per_case = [f.result() for f in futures]
    losses = [case_loss(rows) for c, rows in zip(cases, per_case, strict=True) if not c.not_modelled]
    rows = [row for rows in per_case for row in rows]
    return (sum(losses) / len(losses) if losses else math.nan), rows


def fit_serving(
    trials: int = 120, seed: int = 0, jobs: int = 1, on_trial: Callable[[int, float], None] | None = None
) -> FitResult:
    """Fit :data:`FIT_PARAMETERS` to the fit set (module docstring); deterministic for a seed and ``jobs``.

    Raises:
        ServingCaseError: a bad case file.
    """
    cases = [c for c in load_suite(sets=("fit",)) if not c.not_modelled]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=min(20, trials))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    history: list[float] = []
    with WorkerPool(jobs) if jobs > 1 else _NoPool() as pool:
        for i in range(trials):
            trial = study.ask()
            params = {
                name: trial.suggest_float(name, lo, hi, log=log) for name, (lo, hi, log) in FIT_PARAMETERS.items()
            }
            loss, _ = evaluate(cases, params, pool if jobs > 1 else None)
            study.tell(trial, loss)
            history.append(study.best_value)
            if on_trial is not None:
                on_trial(i, study.best_value)
    return FitResult(dict(study.best_params), study.best_value, trials, history)


class _NoPool:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def suite_rows(params: dict[str, float] | None = None, jobs: int = 1) -> list[dict]:
    """Every case of both sets simulated (with ``params`` on the card when given): the rows of
    :func:`calibrate.serving_cases.run_serving_case`."""
    cases = load_suite()
    with WorkerPool(jobs) if jobs > 1 else _NoPool() as pool:
        _, rows = evaluate(cases, params or {}, pool if jobs > 1 else None)
    return rows


__all__ = ["FIT_PARAMETERS", "FitResult", "case_loss", "evaluate", "fit_serving", "overrides_for", "suite_rows",
           "suite_table"]  # fmt: skip
