"""Calibrate the compute model from a user's own server runs (``pulseinfer calibrate --from-measured``).

The files are real benchmark outputs (:mod:`traces.measured`). Part of them is held out: the last file when there are
two or more, else the last 40 % of the one file's requests (the first 60 % are fitted, each part replayed as a run of
its own). :data:`FITTED` — the efficiencies and host costs a server's per-token time, TTFT and throughput depend on,
with the bounds of :data:`calibrate.serving_fit.FIT_PARAMETERS` — are fitted by a seeded Optuna TPE search that
minimises the mean over runs of the mean |ln(simulated / measured)| over :data:`FIT_METRICS`; the held-out runs are
then replayed once with the fitted values. The error of a run is the mean |error %| over the same metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import optuna

from calibrate.measured import measured_from_result, simulate_measured, validation_table
from calibrate.serving_fit import FIT_PARAMETERS
from sim.config import Scenario
from traces.measured import MeasuredRun

FITTED = ("hbm_efficiency", "attn_efficiency", "prefill_mfu", "decode_step_overhead_us", "decode_request_overhead_us")
FIT_METRICS = ("tpot_mean_ms", "ttft_mean_ms", "itl_p50_ms", "e2e_mean_ms", "output_throughput_tok_s")
HELD_OUT_FRACTION = 0.4
MAX_HELD_OUT_ERROR_PCT = 20.0  # a profile worse than this on held-out runs is refused unless forced


def fitted_names(scenario: Scenario) -> tuple[str, ...]:
    """:data:`FITTED` for the scenario's model: the GEMM efficiency of its weights' dtype (``fp8_mfu`` for FP8 weights
    on a card with FP8 tensor cores, else ``prefill_mfu``; sim/step/compute.py)."""
    if scenario.model.dtype == "fp8" and scenario.hardware.fp8_tflops is not None:
        return tuple("fp8_mfu" if name == "prefill_mfu" else name for name in FITTED)
    return FITTED


def _card_value(scenario: Scenario, name: str) -> float:
    return scenario.hardware.fp8_gemm_mfu if name == "fp8_mfu" else getattr(scenario.hardware, name)


@dataclass
class MeasuredFit:
    """A fit's values, its loss and the errors (mean |error %| over FIT_METRICS) of the fitted and held-out runs."""

    params: dict[str, float]
    loss: float
    fit_error_pct: float
    held_out_error_pct: float
    held_out: list[str] = field(default_factory=list)  # what was held out, in words
    tables: dict[str, object] = field(default_factory=dict)  # "fit:<name>" / "held_out:<name>" → validation table


def split_runs(runs: list[MeasuredRun]) -> tuple[list[MeasuredRun], list[MeasuredRun], str]:
    """(fit runs, held-out runs, how they were split): by file when there are several, else by request."""
    if len(runs) >= 2:
        return runs[:-1], runs[-1:], f"file {runs[-1].source_path}"
    run = runs[0]
    n = len(run.requests)
    cut = max(1, min(n - 1, int(round(n * (1 - HELD_OUT_FRACTION)))))
    return [_part(run, 0, cut)], [_part(run, cut, n)], f"requests {cut}-{n - 1} of {run.source_path}"


def _part(run: MeasuredRun, lo: int, hi: int) -> MeasuredRun:
    req = run.requests.iloc[lo:hi].reset_index(drop=True)
    if req["arrival_s"].notna().any():
        req = req.assign(arrival_s=req["arrival_s"] - req["arrival_s"].min())
    share = (hi - lo) / max(1, len(run.requests))
    return replace(run, requests=req, duration_s=run.duration_s * share, num_prompts=len(req))


def run_error(
    run: MeasuredRun, scenario: Scenario, params: dict[str, float], seed: int = 0
) -> tuple[float, float, object]:
    """Replay one run with ``params`` on the scenario's card: (log loss, mean |error %|, validation table)."""
    scn = with_params(scenario, params)
    result, workload, _ = simulate_measured(run, scn, seed)
    table = validation_table(run, measured_from_result(result, workload)).set_index("metric")
    rows = table.loc[[m for m in FIT_METRICS if m in table.index]]
    rows = rows[np.isfinite(rows["measured"]) & (rows["measured"] > 0)]
    if not len(rows):
        return math.nan, math.nan, table
    sim = rows["simulated"].to_numpy(float)
    ratios = np.where(np.isfinite(sim) & (sim > 0), sim / rows["measured"].to_numpy(float), math.e**3)
    return float(np.mean(np.abs(np.log(ratios)))), float(np.mean(np.abs(rows["error_pct"]))), table


def with_params(scenario: Scenario, params: dict[str, float]) -> Scenario:
    """The scenario with ``params`` on its hardware card."""
    if not params:
        return scenario
    hardware = scenario.hardware.model_copy(update=params)
    return scenario.model_copy(update={"hardware": hardware})


def fit_measured(
    runs: list[MeasuredRun],
    scenario: Scenario,
    trials: int = 60,
    seed: int = 0,
    on_trial: Callable[[int, float], None] | None = None,
) -> MeasuredFit:
    """Fit :func:`fitted_names` (:data:`FITTED`, with the GEMM efficiency of the model's dtype) to the runs (module
    docstring) and report fit and held-out errors.

    Raises:
        ValueError: no run has a metric to fit (nothing measured, or nothing finished in simulation).
    """
    fit_runs, held_runs, held_words = split_runs(runs)
    for run in [*fit_runs, *held_runs]:  # the card as it is: a run that cannot be replayed says why, here
        run_error(run, scenario, {}, seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True))
    names = fitted_names(scenario)
    study.enqueue_trial({k: _card_value(scenario, k) for k in names})  # the card as it is, first
    for i in range(trials):
        trial = study.ask()
        params = {k: trial.suggest_float(k, *FIT_PARAMETERS[k][:2], log=FIT_PARAMETERS[k][2]) for k in names}
        try:
            losses = [run_error(run, scenario, params, seed)[0] for run in fit_runs]
        except ValueError:  # nothing finished with these values
            losses = [math.inf]
        loss = float(np.mean(losses)) if all(math.isfinite(x) for x in losses) else math.inf
        study.tell(trial, loss)
        if on_trial is not None:
            on_trial(i, study.best_value)
    if not math.isfinite(study.best_value):
        raise ValueError("no measured metric could be compared: the runs record none of " + ", ".join(FIT_METRICS))
    params = {k: float(f"{v:.4g}") for k, v in study.best_params.items()}
    tables, fit_errors, held_errors = {}, [], []
    for kind, group, errors in (("fit", fit_runs, fit_errors), ("held_out", held_runs, held_errors)):
        for run in group:
            _, error, table = run_error(run, scenario, params, seed)
            errors.append(error)
            tables[f"{kind}:{run.source_path}"] = table
    fit_error, held_error = float(np.mean(fit_errors)), float(np.mean(held_errors))
    if not (math.isfinite(fit_error) and math.isfinite(held_error)):
        raise ValueError(f"the {'fit' if not math.isfinite(fit_error) else 'held-out'} runs have no metric to compare "
                         f"(held out: {held_words}); no profile can be checked")  # fmt: skip
    return MeasuredFit(params, study.best_value, fit_error, held_error, [held_words], tables)
