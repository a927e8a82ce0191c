"""Fit the compute model's physical constants to the serving suite (``pulseinfer calibrate serving``).

The compute model (sim/step/compute.py) has physically meaningful constants on the hardware card
(:data:`FIT_PARAMETERS`, each with physical bounds; ``prefill_mfu`` fitted per GPU architecture,
:data:`ARCH_PARAMETERS`, so every card of one architecture carries one value) and on the serving engine's card
(:data:`ENGINE_FIT_PARAMETERS`: the host path's serial and overlapped costs of the engine lines with their own
values; the other engines take the card's serial costs, scenarios/engines/). They are fitted jointly by bounded
robust least squares (scipy's trust-region reflective ``least_squares``, soft-L1 loss) on the residuals
ln(simulated / measured) of every compared metric, each weighted by 1/√(the case's metrics) so each case counts
once; each parameter is searched on [0, 1] between its bounds (log-scaled where its range spans decades). The
Jacobian is taken by forward differences, re-simulating only the cases a parameter can affect (:func:`affects`:
an engine's values its cases, an architecture's MFU its cards' cases, MoE constants the MoE cases, ...); a case's
result is cached by the values that affect it. The search starts at :data:`PRIOR` (physically typical values, never
fitted ones), so a cross-validation fold (calibrate/serving_cv.py) learns nothing from the cases it leaves out.
A parameter that ends within 1 % of a bound is reported (:attr:`FitResult.at_bound`): it stands for a mechanism the
model lacks. The result is written as one profile per card (``<card>.yaml``), ``fit.yaml`` (values, bounds, loss,
provenance) and one engine card per fitted engine line (``engine-<name>.yaml``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from calibrate.lsq import AT_BOUND, DIFF_STEP, from_unit, to_unit
from calibrate.serving_cases import ServingCase, engine_card, load_suite, run_serving_case, suite_table
from workers import WorkerPool

# HardwareSpec field: (low, high, log scale). Bounds are physical: a share of a peak in (0, 1]; per-kernel and per-step
# costs from "none" to well past what any public profile shows (docs/sources.md §11 gives the reasoning per bound).
FIT_PARAMETERS: dict[str, tuple[float, float, bool]] = {
    "hbm_efficiency": (0.5, 0.95, False),  # STREAM-like copies reach ~90 % of HBM peak on Hopper
    "hbm_half_bytes": (1e4, 6.4e7, True),  # 10 KB .. 64 MB: a kernel reading H bytes runs at half of the above
    "attn_efficiency": (0.3, 1.0, False),  # decode attention relative to a large GEMM's weight read
    "attn_half_tokens": (1.0, 16384.0, True),  # context per request at which attention reaches half of it
    "attn_half_tiles": (0.01, 32.0, True),  # split-KV work tiles per SM at which decode attention fills half the GPU
    "attn_fp8_efficiency": (0.3, 1.0, False),  # FP8-KV decode attention relative to BF16 (dequantisation)
    "moe_half_bytes": (1e4, 1e9, True),  # bytes at which one expert's grouped GEMM reaches half the HBM roofline
    "moe_layer_us": (0.5, 500.0, True),  # routing, top-k and token permutation of one MoE layer
    "prefill_mfu": (0.2, 0.85, False),  # BF16 GEMMs' share of the BF16 tensor peak (fitted per architecture)
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
    # vLLM 0.5-0.7 (V0): one process schedules, prepares inputs and detokenises between steps, all serial.
    "vllm-0.5": {
        "step_serial_us": (20.0, 20000.0, True),
        "request_serial_us": (0.1, 300.0, True),
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
ARCHES = ("ampere", "ada", "hopper", "blackwell")
# Fitted once per GPU architecture (HardwareSpec.arch): name@arch, e.g. prefill_mfu@hopper. Tensor-core generations
# differ in what share of their peak a long prefill reaches (an H100 and an A100 at 32K prompts imply ~33 % and ~56 %).
ARCH_PARAMETERS = ("prefill_mfu",)
PARAMETERS: dict[str, tuple[float, float, bool]] = {
    **{k: b for k, b in FIT_PARAMETERS.items() if k not in ARCH_PARAMETERS},
    **{f"{k}@{arch}": FIT_PARAMETERS[k] for k in ARCH_PARAMETERS for arch in ARCHES},
    **{
        f"{ENGINE_PREFIX}{card}.{name}": b
        for card, fields in ENGINE_FIT_PARAMETERS.items()
        for name, b in fields.items()
    },
}  # every fitted value's name → bounds
# Where every search starts: typical values from public kernel profiles (docs/sources.md §11), the same for every
# fold of a cross-validation; never a fitted value.
PRIOR: dict[str, float] = {
    "hbm_efficiency": 0.8, "hbm_half_bytes": 1e6, "attn_efficiency": 0.8, "attn_half_tokens": 64.0,
    "attn_half_tiles": 0.5, "attn_fp8_efficiency": 0.8, "moe_half_bytes": 2e6, "moe_layer_us": 20.0,
    "prefill_mfu": 0.5, "fp8_mfu": 0.5, "attn_mfu": 0.5, "prefill_act_passes": 8.0,
    "decode_step_overhead_us": 1000.0, "decode_request_overhead_us": 10.0, "allreduce_call_us": 20.0,
    "step_serial_us": 1000.0, "request_serial_us": 10.0, "request_overlapped_us": 10.0,
}  # fmt: skip
MISSING_LOSS = 3.0  # a metric the simulation could not produce (e.g. nothing finished) counts as e^3 ≈ 20× off


def prior_start() -> dict[str, float]:
    """:data:`PRIOR` for every name of :data:`PARAMETERS` (an architecture's or engine's value by its field)."""
    return {name: PRIOR[name.split("@")[0].rsplit(".", 1)[-1]] for name in PARAMETERS}


@dataclass
class FitResult:
    """What a fit found: the values, the fit loss (mean case |ln error|), the evaluations it took, the names fitted
    within 1 % of a bound, and the names no fitted case could inform (left at their start)."""

    params: dict[str, float]
    loss: float
    trials: int
    history: list[float] = field(default_factory=list)  # loss after each evaluation of every case
    at_bound: list[str] = field(default_factory=list)
    uninformed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CaseKey:
    """What decides which fitted values reach a case: its engine line, its card's architecture, whether it is MoE,
    uses FP8 KV or FP8 weights on FP8 tensor cores, runs tensor-parallel, and whether its engine has its own serial
    host costs."""

    name: str
    engine: str
    arch: str
    moe: bool
    fp8_kv: bool
    fp8_gemm: bool
    tp: bool
    own_step: bool
    own_request: bool


def case_key(case: ServingCase) -> CaseKey:
    """The :class:`CaseKey` of a case, from its setup and cards."""
    from sim.config.engine import resolve_engine
    from sim.config.loader import load_card

    hw = load_card("hardware", case.setup.hardware)
    model = load_card("model", case.setup.model)
    engine = resolve_engine(case.engine)
    s = case.setup
    return CaseKey(
        case.name, engine_card(case.engine), str(hw.get("arch", "other")), bool(model.get("num_experts")),
        s.kv_dtype == "fp8", s.weight_dtype == "fp8" and hw.get("fp8_tflops") is not None, s.tp_size > 1,
        *(engine.get(f) is not None or f in ENGINE_FIT_PARAMETERS.get(engine_card(case.engine), {})
          for f in ("step_serial_us", "request_serial_us")),
    )  # fmt: skip


def affects(name: str, key: CaseKey) -> bool:
    """Whether the fitted value ``name`` can change the simulation of the case with ``key``."""
    if name.startswith(ENGINE_PREFIX):
        return name[len(ENGINE_PREFIX) :].rsplit(".", 1)[0] == key.engine
    base, _, arch = name.partition("@")
    rules = {
        "moe_half_bytes": key.moe, "moe_layer_us": key.moe, "attn_fp8_efficiency": key.fp8_kv,
        "fp8_mfu": key.fp8_gemm, "prefill_mfu": not key.fp8_gemm,  # FP8 weights' GEMMs take fp8_mfu alone
        "allreduce_call_us": key.tp, "decode_step_overhead_us": not key.own_step,
        "decode_request_overhead_us": not key.own_request,
    }  # fmt: skip
    return (not arch or arch == key.arch) and rules.get(base, True)


def overrides_for(params: dict[str, float], engine: str | None = None, arch: str | None = None) -> list[str]:
    """``--set`` overrides putting ``params`` on the scenario's hardware card (a value named ``NAME@ARCH`` only when
    the card's architecture is ``arch``), and the values named ``engine.<engine>.<field>`` on its engine card when
    it is ``engine`` (other engines' values are left out)."""
    out = []
    for name, value in params.items():
        if name.startswith(ENGINE_PREFIX):
            if engine is not None and name.startswith(f"{ENGINE_PREFIX}{engine}."):
                out.append(f"engine.{name.rsplit('.', 1)[1]}={value!r}")
            continue
        base, _, on = name.partition("@")
        if not on or on == arch:
            out.append(f"hardware.{base}={value!r}")
    return out


def card_params(params: dict[str, float], arch: str | None = None) -> dict[str, float]:
    """The hardware card's values of ``params`` for a card of architecture ``arch`` (``NAME@ARCH`` as ``NAME``)."""
    out = {}
    for name, value in params.items():
        base, _, on = name.partition("@")
        if not name.startswith(ENGINE_PREFIX) and (not on or on == arch):
            out[base] = value
    return out


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
    residuals = case_residuals(rows)
    return float(np.mean(np.abs(residuals))) * math.sqrt(len(residuals)) if len(residuals) else 0.0


def case_residuals(rows: list[dict]) -> np.ndarray:
    """ln(simulated / measured) of each compared row, over √(rows) so that a case's squares sum as one metric's."""
    logs = [
        math.log(r["simulated"] / r["measured"])
        if math.isfinite(r["simulated"]) and r["simulated"] > 0
        else MISSING_LOSS
        for r in rows
        if r["verdict"] in ("compared", "by_construction")
    ]
    return np.asarray(logs, float) / math.sqrt(max(len(logs), 1))


class CaseRunner:
    """Simulates cases with fitted values, each case once per distinct set of values that can affect it."""

    def __init__(self, cases: list[ServingCase], pool: WorkerPool | None = None) -> None:
        self.cases = cases
        self.keys = [None if c.not_modelled else case_key(c) for c in cases]  # a case not modelled is not run
        self.pool = pool
        self._cache: dict[tuple, list[dict]] = {}
        self.simulations = 0

    def _cache_key(self, i: int, params: dict[str, float]) -> tuple:
        key = self.keys[i]
        if key is None:
            return (self.cases[i].name,)
        return (key.name, *sorted((k, v) for k, v in params.items() if affects(k, key)))

    def rows(self, params: dict[str, float]) -> list[list[dict]]:
        """Every case's rows with ``params`` (from the cache where the values that reach the case were run)."""
        todo = {}
        for i, case in enumerate(self.cases):
            ck = self._cache_key(i, params)
            if ck not in self._cache and ck not in todo:
                key = self.keys[i]
                todo[ck] = (case, [] if key is None else overrides_for(params, key.engine, key.arch))
        if self.pool is None:
            results = [run_serving_case(*args) for args in todo.values()]
        else:
            futures = [self.pool.submit(run_serving_case, *args) for args in todo.values()]
            self.pool.wait(futures)
            results = [f.result() for f in futures]
        self._cache.update(zip(todo, results, strict=True))
        self.simulations += len(todo)
        return [self._cache[self._cache_key(i, params)] for i in range(len(self.cases))]


def _to_unit(name: str, value: float) -> float:
    return to_unit(PARAMETERS[name], value)


def _from_unit(name: str, u: float) -> float:
    return from_unit(PARAMETERS[name], u)


def fit_serving(
    iterations: int = 8,
    jobs: int = 1,
    on_step: Callable[[int, float], None] | None = None,
    start: dict[str, float] | None = None,
    only: list[str] | None = None,
    cases: list[ServingCase] | None = None,
) -> FitResult:
    """Fit :data:`PARAMETERS` to ``cases`` (default: every modelled case of the suite) by bounded robust least
    squares (module docstring), deterministic: no randomness, the same cases and start give the same values.

    ``iterations``: the most Jacobians taken (each one simulation of the cases a parameter affects, per free
    parameter). ``start``: where the search starts (default :func:`prior_start`). ``only``: the names to fit; the
    others stay at their ``start`` values. A name no case can affect is not fitted (``uninformed``).

    Raises:
        ServingCaseError: a bad case file.
        ValueError: ``only`` naming a parameter :data:`PARAMETERS` lacks.
    """
    from scipy.optimize import least_squares

    if only is not None and not set(only) <= set(PARAMETERS):
        raise ValueError(f"only: expected names among {sorted(PARAMETERS)}, got {only}")
    start = {**prior_start(), **(start or {})}
    cases = [c for c in (cases if cases is not None else load_suite()) if not c.not_modelled]
    with WorkerPool(jobs) if jobs > 1 else _NoPool() as pool:
        runner = CaseRunner(cases, pool if jobs > 1 else None)
        wanted = list(PARAMETERS) if only is None else list(only)
        free = [n for n in wanted if any(affects(n, k) for k in runner.keys if k is not None)]
        history: list[float] = []

        def values(u: np.ndarray) -> dict[str, float]:
            return {**start, **{n: _from_unit(n, x) for n, x in zip(free, u, strict=True)}}

        def residuals(u: np.ndarray) -> np.ndarray:
            per_case = runner.rows(values(u))
            history.append(float(np.mean([case_loss(r) for r in per_case])))
            if on_step is not None:
                on_step(len(history), history[-1])
            return np.concatenate([case_residuals(r) for r in per_case])

        def jacobian(u: np.ndarray) -> np.ndarray:
            base = residuals(u)
            columns = []
            for j in range(len(free)):
                h = DIFF_STEP if u[j] + DIFF_STEP <= 1.0 else -DIFF_STEP
                moved = u.copy()
                moved[j] += h
                columns.append((np.concatenate([case_residuals(r) for r in runner.rows(values(moved))]) - base) / h)
            return np.stack(columns, axis=1) if columns else np.zeros((len(base), 0))

        u0 = np.array([_to_unit(n, start[n]) for n in free])
        if free:
            found = least_squares(
                residuals, u0, jac=jacobian, bounds=(0.0, 1.0), loss="soft_l1", f_scale=0.1, max_nfev=iterations,
                method="trf", x_scale=1.0,
            )  # fmt: skip
            u = found.x
        else:
            u = u0
        params = values(u)
        per_case = runner.rows(params)
    loss = float(np.mean([case_loss(r) for r in per_case])) if per_case else math.nan
    at_bound = [n for n, x in zip(free, u, strict=True) if x < AT_BOUND or x > 1 - AT_BOUND]
    uninformed = [n for n in wanted if n not in free]
    return FitResult(params, loss, runner.simulations, history, at_bound, uninformed)


class _NoPool:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def sensitivity(
    params: dict[str, float], cases: list[ServingCase] | None = None, jobs: int = 1, step: float = 0.1
) -> list[dict]:
    """How much each fitted value matters: the mean case loss with the value ×(1 − ``step``) and ×(1 + ``step``)
    (clipped to its bounds), re-simulating only the cases the value can reach. One row per name:
    name, value, bounds, loss at the value, at the lower and upper move, and the larger change."""
    cases = [c for c in (cases if cases is not None else load_suite()) if not c.not_modelled]
    rows = []
    with WorkerPool(jobs) if jobs > 1 else _NoPool() as pool:
        runner = CaseRunner(cases, pool if jobs > 1 else None)

        def loss(p: dict[str, float]) -> float:
            return float(np.mean([case_loss(r) for r in runner.rows(p)]))

        base = loss(params)
        for name in (n for n in PARAMETERS if n in params):
            lo, hi, _ = PARAMETERS[name]
            down = loss({**params, name: max(lo, params[name] * (1 - step))})
            up = loss({**params, name: min(hi, params[name] * (1 + step))})
            rows.append({
                "parameter": name, "value": params[name], "low": lo, "high": hi, "loss": base, "loss_down": down,
                "loss_up": up, "change": max(down, up) - base,
            })  # fmt: skip
    return rows


def shipped_start(card: str = "h200") -> dict[str, float]:
    """The shipped values of :data:`PARAMETERS` (each architecture's from a card of that architecture — ``card``
    for its own — and each fitted engine card's), as the simulator reads them (an unset efficiency or serial cost
    takes the value the compute model falls back to), clipped to the bounds."""
    from sim.config import EngineSpec, HardwareSpec
    from sim.config.loader import card_names, load_card

    hw = HardwareSpec.model_validate(load_card("hardware", card))
    resolved = {"fp8_mfu": hw.fp8_gemm_mfu, "attn_mfu": hw.attention_mfu}  # the compute model's fallbacks
    start = {
        name: float(resolved.get(name, getattr(hw, name))) for name in FIT_PARAMETERS if name not in ARCH_PARAMETERS
    }
    by_arch = {}
    for name in card_names("hardware"):
        other = HardwareSpec.model_validate(load_card("hardware", name))
        by_arch.setdefault(other.arch, other)
    by_arch[hw.arch] = hw
    for base in ARCH_PARAMETERS:
        for arch in ARCHES:
            start[f"{base}@{arch}"] = float(getattr(by_arch.get(arch, hw), base))
    for engine, fields in ENGINE_FIT_PARAMETERS.items():
        spec = EngineSpec.model_validate(load_card("engine", engine))
        resolved = {
            "step_serial_us": spec.step_serial_us_on(hw),
            "request_serial_us": spec.request_serial_us_on(hw),
        }
        for name in fields:
            start[f"{ENGINE_PREFIX}{engine}.{name}"] = float(resolved.get(name, getattr(spec, name)))
    return {k: min(max(v, PARAMETERS[k][0]), PARAMETERS[k][1]) for k, v in start.items()}


def suite_rows(params: dict[str, float] | None = None, jobs: int = 1) -> list[dict]:
    """Every case simulated (with ``params`` on the cards when given): the rows of
    :func:`calibrate.serving_cases.run_serving_case`."""
    return suite_rows_for(load_suite(), params, jobs)


def suite_rows_for(cases: list[ServingCase], params: dict[str, float] | None = None, jobs: int = 1) -> list[dict]:
    """``cases`` simulated with ``params`` (each case gets the values for its card's architecture and engine)."""
    with WorkerPool(jobs) if jobs > 1 else _NoPool() as pool:
        per_case = CaseRunner(cases, pool if jobs > 1 else None).rows(params or {})
    return [row for rows in per_case for row in rows]


__all__ = ["ARCHES", "ENGINE_FIT_PARAMETERS", "FIT_PARAMETERS", "PARAMETERS", "PRIOR", "CaseRunner", "FitResult",
           "affects", "card_params", "case_key", "case_loss", "engine_params", "fit_serving",
           "overrides_for", "prior_start", "sensitivity", "shipped_start", "suite_rows", "suite_rows_for",
           "suite_table"]  # fmt: skip
