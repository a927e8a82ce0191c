"""Calibrate the compute model from a user's own server runs (``pulseinfer calibrate --from-measured``).

The files are real benchmark outputs (:mod:`traces.measured`). Every run is replayed whole, every time; what is held
out is which requests are scored (:func:`split_runs`): the last file when there are two or more, else the late
window of the one file (its last :data:`HELD_OUT_FRACTION` of requests by when they happened,
:func:`calibrate.measured.window_ids`). A subset of a run is never replayed on its own: a closed-loop or all-at-once
run's late requests replayed cold from t = 0 would be another load.

What is fitted (:func:`fitted_bounds`) is what the scenario's model, card and engine make count: the card's HBM and
attention efficiencies, the GEMM efficiency of the weights' dtype, and the host costs of a step and of a request
where the replay takes them from — the engine card's (``engine.step_serial_us``, ``engine.request_serial_us``,
``engine.request_overlapped_us``) when the engine release line has its own, else the hardware card's catch-alls.
A value without effect on these runs (a zero column of the first Jacobian) is left at the card's value and never
listed as fitted (calibrate/lsq.py).

The fit is bounded robust least squares (calibrate/lsq.py) on the log ratios simulated / measured of
:data:`FIT_METRICS` over the fit requests of every run, with a weak pull to the card's values
(:data:`PRIOR_WEIGHT` per unit of search range) so that values the runs barely inform stay near the card. The
error of a run is the mean |error %| over the same metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from calibrate.lsq import Bounds, fit_bounded, to_unit
from calibrate.measured import measured_from_result, simulate_measured, validation_table, window_ids
from calibrate.measured_server import chunked_stream, pool_note, roofline_check
from calibrate.serving_fit import ENGINE_FIT_PARAMETERS, FIT_PARAMETERS
from sim.config import Scenario
from traces.measured import MeasuredRun

FIT_METRICS = ("tpot_mean_ms", "tpot_p50_ms", "ttft_mean_ms", "ttft_p50_ms", "itl_p50_ms", "e2e_mean_ms",
               "output_throughput_tok_s")  # fmt: skip
HELD_OUT_FRACTION = 0.4
MAX_HELD_OUT_ERROR_PCT = 20.0  # a profile worse than this on held-out requests is refused unless forced
PRIOR_WEIGHT = 0.02  # residual per unit of search range a value moves from the card (≈ a 2 % error per full range)
MOVED_PCT = 10.0  # a value that moved more than this from the card is named in the verdict
ENGINE_PREFIX = "engine."
# The engine's host costs: their bounds are the serving fit's (every release line has the same ones)
ENGINE_BOUNDS: dict[str, Bounds] = {
    name: bounds for fields in ENGINE_FIT_PARAMETERS.values() for name, bounds in fields.items()
}


def fitted_bounds(scenario: Scenario) -> dict[str, Bounds]:
    """The values a fit on ``scenario`` moves, with their bounds (module docstring): hardware-card names, and
    ``engine.<field>`` for the engine card's own host costs.

    - the GEMM efficiency of the weights' dtype: ``fp8_mfu`` for FP8 weights on a card with FP8 tensor cores, else
      ``prefill_mfu`` (sim/step/compute.py);
    - a step's and a request's serial host cost: the engine card's where it sets one, else the hardware card's;
    - the engine's overlapped per-request cost where its card has one (> 0).
    """
    engine = scenario.engine
    gemm = "fp8_mfu" if scenario.model.dtype == "fp8" and scenario.hardware.fp8_tflops is not None else "prefill_mfu"
    names = ["hbm_efficiency", "attn_efficiency", gemm]
    names.append(f"{ENGINE_PREFIX}step_serial_us" if engine.step_serial_us is not None else "decode_step_overhead_us")
    names.append(
        f"{ENGINE_PREFIX}request_serial_us" if engine.request_serial_us is not None else "decode_request_overhead_us"
    )
    if engine.request_overlapped_us > 0:
        names.append(f"{ENGINE_PREFIX}request_overlapped_us")
    return {n: ENGINE_BOUNDS[n[len(ENGINE_PREFIX) :]] if n.startswith(ENGINE_PREFIX) else FIT_PARAMETERS[n]
            for n in names}  # fmt: skip


def card_value(scenario: Scenario, name: str) -> float:
    """The scenario's value of a fitted name (:func:`fitted_bounds`)."""
    if name.startswith(ENGINE_PREFIX):
        return float(getattr(scenario.engine, name[len(ENGINE_PREFIX) :]))
    return float(scenario.hardware.fp8_gemm_mfu if name == "fp8_mfu" else getattr(scenario.hardware, name))


def with_params(scenario: Scenario, params: dict[str, float]) -> Scenario:
    """The scenario with ``params`` on its hardware card and, for ``engine.<field>`` names, its engine card."""
    if not params:
        return scenario
    hardware = {k: v for k, v in params.items() if not k.startswith(ENGINE_PREFIX)}
    engine = {k[len(ENGINE_PREFIX) :]: v for k, v in params.items() if k.startswith(ENGINE_PREFIX)}
    update = {}
    if hardware:
        update["hardware"] = scenario.hardware.model_copy(update=hardware)
    if engine:
        update["engine"] = scenario.engine.model_copy(update=engine)
    return scenario.model_copy(update=update)


@dataclass
class Part:
    """One run replayed whole, and which of its measured requests are scored for the fit and held out (None: none)."""

    run: MeasuredRun
    fit_ids: np.ndarray | None
    held_ids: np.ndarray | None


@dataclass
class MeasuredFit:
    """A fit's values (every name of :func:`fitted_bounds`, moved or not), its loss, the errors (mean |error %| over
    FIT_METRICS) of the fit and held-out requests, what was held out, the validation tables, the names fitted, at a
    bound and without effect, and the table of what moved (:func:`moved_table`)."""

    params: dict[str, float]
    loss: float
    fit_error_pct: float
    held_out_error_pct: float
    held_out: list[str] = field(default_factory=list)  # what was held out, in words
    tables: dict[str, object] = field(default_factory=dict)  # "fit:<name>" / "held_out:<name>" → validation table
    fitted: list[str] = field(default_factory=list)
    at_bound: list[str] = field(default_factory=list)
    without_effect: list[str] = field(default_factory=list)
    moved: pd.DataFrame | None = None
    evaluations: int = 0
    trade_offs: list[tuple[str, str, float]] = field(default_factory=list)  # calibrate/lsq.py BoundedFit.trade_offs
    card_fit_error_pct: float = math.nan  # the card as it is, on the fit requests
    card_held_out_error_pct: float = math.nan  # ... and on the held-out ones
    notes: list[str] = field(default_factory=list)  # what the replays of the card noted and flagged


def split_runs(runs: list[MeasuredRun], seed: int = 0) -> tuple[list[Part], str]:
    """(the runs with their scored requests, what is held out in words): the last file when there are two or more,
    else the late window of the one file (:func:`calibrate.measured.window_ids`). Every run is replayed whole."""
    if len(runs) >= 2:
        parts = [Part(r, None, np.empty(0, np.int64)) for r in runs[:-1]]
        last = runs[-1].source_path
        same_file = any(r.source_path.split("#")[0] == last.split("#")[0] for r in runs[:-1])
        what = "run" if "#" in last and same_file else "file"
        return [*parts, Part(runs[-1], np.empty(0, np.int64), None)], f"{what} {last}"
    early, late, words = window_ids(runs[0], HELD_OUT_FRACTION, seed)
    if not len(early) or not len(late):
        raise ValueError(f"{runs[0].source_path}: {len(early) + len(late)} request(s) to score: too few to fit on "
                         "some and hold out the rest; give a second file (or run)")  # fmt: skip
    return [Part(runs[0], early, late)], words


def _scored(ids: np.ndarray | None) -> bool:
    return ids is None or len(ids) > 0


def _table_errors(table: pd.DataFrame) -> tuple[np.ndarray, float]:
    """(log ratios simulated / measured of FIT_METRICS the table has, mean |error %| over them)."""
    rows = table.loc[[m for m in FIT_METRICS if m in table.index]]
    rows = rows[np.isfinite(rows["measured"]) & (rows["measured"] > 0)]
    if not len(rows):
        return np.zeros(0), math.nan
    sim = rows["simulated"].to_numpy(float)
    ratios = np.where(np.isfinite(sim) & (sim > 0), sim / rows["measured"].to_numpy(float), math.e**3)
    return np.log(ratios), float(np.mean(np.abs(rows["error_pct"].fillna(100 * (math.e**3 - 1)))))


def replay_tables(
    part: Part, scenario: Scenario, params: dict[str, float], seed: int = 0, prefix_share: float | None = None
) -> dict[str, pd.DataFrame]:
    """Replay a part's run whole with ``params`` and score it: {"fit": table, "held_out": table} for the windows it
    has (a table over every request where a window is None)."""
    return replay_scored(part, scenario, params, seed, prefix_share)[0]


def replay_scored(
    part: Part, scenario: Scenario, params: dict[str, float], seed: int = 0, prefix_share: float | None = None
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """:func:`replay_tables` and what the replay noted, with the lines a user must see about the run (the cache-hit
    roofline flag, a chunked stream, a KV pool unlike the server's)."""
    scn = with_params(scenario, params)
    result, workload, notes = simulate_measured(part.run, scn, seed, prefix_share)
    simulated = measured_from_result(result, workload)
    tables = {}
    for kind, ids in (("fit", part.fit_ids), ("held_out", part.held_ids)):
        if _scored(ids):
            tables[kind] = validation_table(part.run, simulated, ids).set_index("metric")
    flag = roofline_check(part.run, scn) if workload.attrs.get("hash_block_tokens") is None else None
    extra = (chunked_stream(part.run, scn.model.max_seq_len), pool_note(part.run, scn, result.kv_pool_gib), flag)
    return tables, [*notes, *filter(None, extra)]


def run_error(
    run: MeasuredRun, scenario: Scenario, params: dict[str, float], seed: int = 0, prefix_share: float | None = None
) -> tuple[float, float, pd.DataFrame]:
    """Replay one whole run with ``params``: (mean |log ratio|, mean |error %| over FIT_METRICS, validation table)."""
    table = replay_tables(Part(run, None, np.empty(0, np.int64)), scenario, params, seed, prefix_share)["fit"]
    logs, error = _table_errors(table)
    return (float(np.mean(np.abs(logs))) if len(logs) else math.nan), error, table


def moved_table(scenario: Scenario, fit: MeasuredFit, bounds: dict[str, Bounds]) -> pd.DataFrame:
    """One row per fitted name: name, card value, fitted value, change %, bounds, status (fitted, at lower / upper
    bound, without effect)."""
    rows = []
    for name, (lo, hi, _) in bounds.items():
        card, value = card_value(scenario, name), fit.params[name]
        if name in fit.without_effect:
            status = "without effect"
        elif name in fit.at_bound:
            status = "at upper bound" if to_unit(bounds[name], value) > 0.5 else "at lower bound"
        else:
            status = "fitted"
        change = (value / card - 1) * 100 if card else math.nan
        rows.append({"name": name, "card": card, "fitted": value, "change_pct": change, "low": lo, "high": hi,
                     "status": status})  # fmt: skip
    return pd.DataFrame(rows)


def verdict(fit: MeasuredFit) -> str:
    """One line on what the fit did to the card: what moved by more than :data:`MOVED_PCT`, what landed at a bound
    (a curve fit there, not the card's physics), what had no effect."""
    moved = fit.moved
    big = moved[(moved["status"] != "without effect") & (moved["change_pct"].abs() > MOVED_PCT)]
    parts = []
    if len(big):
        parts.append("moved " + ", ".join(f"{r.name} {r.change_pct:+.0f} %" for r in big.itertuples()))
    else:
        parts.append(f"nothing moved more than {MOVED_PCT:g} %: the card holds for these runs")
    if fit.at_bound:
        parts.append(f"at a bound: {', '.join(fit.at_bound)} (the runs push past the physical range: a curve fit, "
                     "not the card; check the scenario's model, card, TP and engine)")  # fmt: skip
    if fit.trade_offs:
        pairs = ", ".join(f"{a} and {b} (r = {r:+.2f})" for a, b, r in fit.trade_offs)
        parts.append(f"the runs cannot tell apart {pairs}: a curve fit along that line, not each value")
    if fit.held_out_error_pct >= fit.card_held_out_error_pct:
        parts.append(f"no better than the card on the held-out requests ({fit.held_out_error_pct:.1f} % against "
                     f"{fit.card_held_out_error_pct:.1f} %): keep the card")  # fmt: skip
    if fit.without_effect:
        parts.append(f"without effect on these runs, left at the card: {', '.join(fit.without_effect)}")
    return "; ".join(parts)


def fit_measured(
    runs: list[MeasuredRun],
    scenario: Scenario,
    iterations: int = 8,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    prefix_share: float | None = None,
) -> MeasuredFit:
    """Fit :func:`fitted_bounds` to the runs (module docstring) and report fit and held-out errors.

    Args:
        runs: measured runs (files or runs of files), in order; the last is held out when there are two or more.
        scenario: the scenario they are replayed on (model, card, TP, serving mode, engine, one policy).
        iterations: the most steps the least squares takes.
        seed: seed of Poisson arrivals where a file records a rate but no send times.
        on_step: called with (evaluations so far, loss of the latest) after each replay of the fit runs.
        prefix_share: as :func:`calibrate.measured.replay_workload`.

    Raises:
        ValueError: a run that cannot be replayed (the message says why), or no metric to compare.
    """
    parts, held_words = split_runs(runs, seed)
    card_errors: dict[str, list[float]] = {"fit": [], "held_out": []}
    notes: list[str] = []
    for part in parts:  # the card as it is: a run that cannot be replayed says why, here
        tables, part_notes = replay_scored(part, scenario, {}, seed, prefix_share)
        notes.extend(f"{part.run.source_path}: {n}" if len(parts) > 1 else n for n in part_notes)
        for kind, table in tables.items():
            card_errors[kind].append(_table_errors(table)[1])
    bounds = fitted_bounds(scenario)
    start = {n: min(max(card_value(scenario, n), lo), hi) for n, (lo, hi, _) in bounds.items()}
    start_unit = np.array([to_unit(bounds[n], start[n]) for n in bounds])
    fit_parts = [p for p in parts if _scored(p.fit_ids)]
    history: list[float] = []
    lengths: list[int] = []  # each fit part's residual count (what the file measured; the same at every value)

    def residuals(values: dict[str, float]) -> np.ndarray:
        logs = []
        for i, part in enumerate(fit_parts):
            try:
                table = replay_tables(Part(part.run, part.fit_ids, np.empty(0)), scenario, values, seed, prefix_share)
                part_logs, _ = _table_errors(table["fit"])
            except ValueError:  # nothing finished with these values: as far off as a missing metric
                part_logs = np.full(lengths[i] if i < len(lengths) else len(FIT_METRICS), 3.0)
            if len(lengths) < len(fit_parts):
                lengths.append(len(part_logs))
            logs.append(part_logs)
        logs = np.concatenate(logs) if logs else np.zeros(0)
        history.append(float(np.mean(np.abs(logs))) if len(logs) else math.nan)
        if on_step is not None:
            on_step(len(history), history[-1])
        unit = np.array([to_unit(bounds[n], values[n]) for n in bounds])
        return np.concatenate([logs, PRIOR_WEIGHT * (unit - start_unit)])

    if not len(residuals(start)) > len(bounds):
        raise ValueError("no measured metric could be compared: the runs record none of " + ", ".join(FIT_METRICS))
    found = fit_bounded(residuals, bounds, start, iterations, prior_rows=len(bounds))
    params = {k: float(f"{v:.4g}") for k, v in found.values.items()}
    tables, errors = {}, {"fit": [], "held_out": []}
    for part in parts:
        for kind, table in replay_tables(part, scenario, params, seed, prefix_share).items():
            errors[kind].append(_table_errors(table)[1])
            tables[f"{kind}:{part.run.source_path}"] = table
    fit_error, held_error = float(np.mean(errors["fit"])), float(np.mean(errors["held_out"]))
    if not (math.isfinite(fit_error) and math.isfinite(held_error)):
        raise ValueError(f"the {'fit' if not math.isfinite(fit_error) else 'held-out'} runs have no metric to compare "
                         f"(held out: {held_words}); no profile can be checked")  # fmt: skip
    loss = float(np.mean(np.abs(residuals(params)[: -len(bounds)])))
    fit = MeasuredFit(params, loss, fit_error, held_error, [held_words], tables, found.fitted, found.at_bound,
                      found.without_effect, evaluations=found.evaluations, trade_offs=found.trade_offs)  # fmt: skip
    fit.notes = list(dict.fromkeys(notes))
    fit.card_fit_error_pct = float(np.mean(card_errors["fit"]))
    fit.card_held_out_error_pct = float(np.mean(card_errors["held_out"]))
    fit.moved = moved_table(scenario, fit, bounds)
    return fit
