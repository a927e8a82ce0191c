"""Fit the compute model's efficiencies to the serving suite's fit set (``pulseinfer calibrate serving``).

The compute model (sim/step/compute.py) has physically meaningful parameters on the hardware card
(:data:`FIT_PARAMETERS`, each with bounds) and on the serving engine's card (:data:`ENGINE_FIT_PARAMETERS`: the host
path's serial and overlapped costs, for each engine the fit set has cases of and that has its own card values; the
other engines take the card's serial costs, scenarios/engines/). One set of card values is fitted for every card —
the cards differ by their datasheet peaks, the parameters are shares of those peaks and per-kernel or per-step
costs — jointly with the engine values, by an Optuna TPE search
(seeded) that minimises the mean over the fit-set cases of the mean over each case's metrics of |ln(simulated /
measured)| (each case counts once, however many metrics its source gives; a log error treats 2× too fast and 2× too
slow alike). The check set is never read by the fit: it is run once afterwards with the fitted values, and both
sets' errors are reported (:func:`calibrate.serving_cases.suite_report`). The result is written as one profile per
card (``<card>.yaml``: the card with the fitted values, usable as ``--set profile=DIR/<card>.yaml``) and
``fit.yaml`` (values, bounds, loss, trials, provenance), and one engine card per fitted engine
(``engine-<name>.yaml``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna

from calibrate.serving_cases import ServingCase, engine_card, load_suite, run_serving_case, suite_table
from workers import WorkerPool

# HardwareSpec field: (low, high, log scale). Bounds are physical: a share of a peak in (0, 1]; per-kernel and per-step
# costs from "none" to well past what any public profile shows (docs/sources.md §11 gives the reasoning per bound).
FIT_PARAMETERS: dict[str, tuple[float, float, bool]] = {
    "hbm_efficiency": (0.5, 0.95, False),  # STREAM-like copies reach ~90 % of HBM peak on Hopper
    "hbm_half_bytes": (1e4, 6.4e7, True),  # 10 KB .. 64 MB: a kernel reading H bytes runs at half of the above
    "attn_efficiency": (0.3, 1.0, False),  # decode attention relative to a large GEMM's weight read
    "attn_half_tokens": (1.0, 16384.0, True),  # context per request at which attention reaches half of it
    "moe_efficiency": (0.1, 1.0, False),  # grouped GEMMs of touched experts
    "prefill_mfu": (0.2, 0.85, False),  # BF16 GEMMs' share of the BF16 tensor peak
    "fp8_mfu": (0.2, 0.85, False),  # FP8 GEMMs' share of the FP8 tensor peak
    "attn_mfu": (0.2, 0.85, False),  # attention FLOPs' share of the BF16 tensor peak (prefill, mostly)
    "prefill_act_passes": (0.0, 48.0, False),  # hidden-size activation reads/writes of a prefill token per layer
    "decode_step_overhead_us": (20.0, 20000.0, True),  # scheduler and launches of one decode step
    "decode_request_overhead_us": (0.1, 300.0, True),  # sampling, detokenisation, scheduling of one request
    "allreduce_call_us": (0.5, 500.0, True),  # launch and synchronisation of one all-reduce
}
# Engine card → EngineSpec field: (low, high, log scale), for the engines with fit cases whose host path is their own
# (sim/config/cards.py EngineSpec; docs/sources.md §11). vLLM 0.8.x (V1): the engine core's serial step and
# per-request work, and the API-server process's per-request work overlapped with the GPU step.
ENGINE_FIT_PARAMETERS: dict[str, dict[str, tuple[float, float, bool]]] = {
    "vllm-0.8": {
        "step_serial_us": (20.0, 20000.0, True),  # scheduling, input preparation, piecewise-graph launches
        "request_serial_us": (0.1, 300.0, True),  # per request in the engine core's loop
        "request_overlapped_us": (0.1, 1000.0, True),  # detokenising and streaming in the API server
    },
    # vLLM 0.11 and later (V1 with full CUDA graphs): the engine core's serial step and per-request work; its fit
    # cases run at low concurrency, which cannot tell an overlapped per-request cost from none, so none is fitted.
    "vllm-0.11": {
        "step_serial_us": (20.0, 20000.0, True),
        "request_serial_us": (0.1, 300.0, True),
    },
    # TensorRT-LLM: a C++ runtime (0.x) or, from 1.0, the PyTorch backend with its overlap scheduler (the host
    # prepares step n + 1 while the GPU runs step n) and CUDA graphs: its host path is its own, not a Python server's;
    # one pair of costs per release line.
    "trtllm-0.5": {
        "step_serial_us": (20.0, 20000.0, True),  # what the overlap leaves of scheduling and launches per step
        "request_serial_us": (0.1, 300.0, True),  # per request per step, serial
    },
    "trtllm-1.0": {
        "step_serial_us": (20.0, 20000.0, True),
        "request_serial_us": (0.1, 300.0, True),
    },
}
ENGINE_PREFIX = "engine."  # a fitted engine value's name: engine.<card>.<field>
PARAMETERS: dict[str, tuple[float, float, bool]] = {
    **FIT_PARAMETERS,
    **{
        f"{ENGINE_PREFIX}{card}.{name}": b
        for card, fields in ENGINE_FIT_PARAMETERS.items()
        for name, b in fields.items()
    },
}  # every fitted value's name → bounds
MISSING_LOSS = 3.0  # a metric the simulation could not produce (e.g. nothing finished) counts as e^3 ≈ 20× off


@dataclass
class FitResult:
    """What a fit found: the values, the fit loss, and the rows of both sets simulated with them."""

    params: dict[str, float]
    loss: float
    trials: int
    history: list[float] = field(default_factory=list)  # best loss after each trial


def overrides_for(params: dict[str, float], engine: str | None = None) -> list[str]:
    """``--set`` overrides putting ``params`` on the scenario's hardware card, and the values named
    ``engine.<engine>.<field>`` on its engine card when it is ``engine`` (other engines' values are left out)."""
    out = []
    for name, value in params.items():
        if not name.startswith(ENGINE_PREFIX):
            out.append(f"hardware.{name}={value!r}")
        elif engine is not None and name.startswith(f"{ENGINE_PREFIX}{engine}."):
            out.append(f"engine.{name.rsplit('.', 1)[1]}={value!r}")
    return out


def card_params(params: dict[str, float]) -> dict[str, float]:
    """The hardware card's values of ``params``."""
    return {k: v for k, v in params.items() if not k.startswith(ENGINE_PREFIX)}


def engine_params(params: dict[str, float]) -> dict[str, dict[str, float]]:
    """The engine cards' values of ``params``: engine card → field → value."""
    out: dict[str, dict[str, float]] = {}
    for name, value in params.items():
        if name.startswith(ENGINE_PREFIX):
            card, field_name = name[len(ENGINE_PREFIX) :].rsplit(".", 1)
            out.setdefault(card, {})[field_name] = value
    return out


def case_loss(rows: list[dict]) -> float:
    """Mean |ln(simulated / measured)| over one case's compared rows (:data:`MISSING_LOSS` for a missing value)."""
    losses = []
    for row in rows:
        sim, meas = row["simulated"], row["measured"]
        losses.append(abs(math.log(sim / meas)) if math.isfinite(sim) and sim > 0 else MISSING_LOSS)
    return sum(losses) / len(losses) if losses else 0.0


def _case_rows(name: str, params: dict[str, float]) -> list[dict]:
    (case,) = load_suite([name])
    return run_serving_case(case, overrides_for(params, engine_card(case.engine)))


def evaluate(
    cases: list[ServingCase], params: dict[str, float], pool: WorkerPool | None = None
) -> tuple[float, list[dict]]:
    """Simulate ``cases`` with ``params``: (mean case loss, every row). Cases not modelled add rows, no loss."""
    names = [c.name for c in cases]
    if pool is None:
        per_case = [_case_rows(n, params) for n in names]
    else:
        futures = [pool.submit(_case_rows, n, params) for n in names]
        pool.wait(futures)
        per_case = [f.result() for f in futures]
    losses = [case_loss(rows) for c, rows in zip(cases, per_case, strict=True) if not c.not_modelled]
    rows = [row for rows in per_case for row in rows]
    return (sum(losses) / len(losses) if losses else math.nan), rows


def shipped_start(card: str = "h200") -> dict[str, float]:
    """The shipped values of :data:`PARAMETERS` (the ``card``'s — every shipped card carries the same fitted values
    — and each fitted engine card's), as the simulator reads them (an unset efficiency or serial cost takes the
    value the compute model falls back to), clipped to the bounds: the search's first trial, so a fit with more
    parameters starts where the last one ended."""
    from sim.config import EngineSpec, HardwareSpec
    from sim.config.loader import load_card

    hw = HardwareSpec.model_validate(load_card("hardware", card))
    resolved = {"fp8_mfu": hw.fp8_gemm_mfu, "attn_mfu": hw.attention_mfu}  # the compute model's fallbacks
    start = {name: float(resolved.get(name, getattr(hw, name))) for name in FIT_PARAMETERS}
    for engine, fields in ENGINE_FIT_PARAMETERS.items():
        spec = EngineSpec.model_validate(load_card("engine", engine))
        resolved = {
            "step_serial_us": spec.step_serial_us_on(hw),
            "request_serial_us": spec.request_serial_us_on(hw),
        }
        for name in fields:
            start[f"{ENGINE_PREFIX}{engine}.{name}"] = float(resolved.get(name, getattr(spec, name)))
    return {k: min(max(v, PARAMETERS[k][0]), PARAMETERS[k][1]) for k, v in start.items()}


def fit_serving(
    trials: int = 120,
    seed: int = 0,
    jobs: int = 1,
    on_trial: Callable[[int, float], None] | None = None,
    start: dict[str, float] | None = None,
    only: list[str] | None = None,
) -> FitResult:
    """Fit :data:`PARAMETERS` (the card's and the engines') to the fit set (module docstring); deterministic for a
    seed and ``jobs``.

    ``start``: values tried first (e.g. :func:`shipped_start`), within the bounds. ``only``: the names to fit; the
    others stay at their ``start`` values (required then), e.g. the engines' host costs alone on the shipped cards.

    Raises:
        ServingCaseError: a bad case file.
        ValueError: ``only`` without ``start``, or naming a parameter :data:`PARAMETERS` lacks.
    """
    free = dict(PARAMETERS) if only is None else {name: PARAMETERS[name] for name in only if name in PARAMETERS}
    if only is not None and (start is None or len(free) != len(only)):
        raise ValueError(f"only: needs start values and names among {sorted(PARAMETERS)}, got {only}")
    fixed = {k: v for k, v in (start or {}).items() if k not in free}
    cases = [c for c in load_suite(sets=("fit",)) if not c.not_modelled]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=min(20, trials))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if start:
        study.enqueue_trial({k: v for k, v in start.items() if k in free})
    history: list[float] = []
    with WorkerPool(jobs) if jobs > 1 else _NoPool() as pool:
        for i in range(trials):
            trial = study.ask()
            params = {name: trial.suggest_float(name, lo, hi, log=log) for name, (lo, hi, log) in free.items()}
            params.update(fixed)
            loss, _ = evaluate(cases, params, pool if jobs > 1 else None)
            study.tell(trial, loss)
            history.append(study.best_value)
            if on_trial is not None:
                on_trial(i, study.best_value)
    return FitResult({**dict(study.best_params), **fixed}, study.best_value, trials, history)


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


__all__ = ["ENGINE_FIT_PARAMETERS", "FIT_PARAMETERS", "PARAMETERS", "FitResult", "card_params", "case_loss",
           "engine_params", "evaluate", "fit_serving", "overrides_for", "shipped_start", "suite_rows",
           "suite_table"]  # fmt: skip
