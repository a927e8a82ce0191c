"""The serving-measurement suite: public real-GPU serving benchmarks, each rebuilt as a scenario and compared.

A serving case (``scenarios/cases/serving/<name>.yaml``, schema :class:`ServingCase`) is one published benchmark
run: its exact setup (model, weight and KV dtype, card, TP, engine, scheduler, lengths, load), what it measured
(per-token latency — TPOT or ITL, with the statistic —, TTFT, throughput, or a decode step at a fixed batch) and
its source. :func:`case_overrides` turns the setup into ``--set`` overrides of the shipped default scenario;
:func:`run_serving_case` simulates it and returns one row per measured metric (:data:`SERVING_COLUMNS`);
:func:`suite_report` summarises rows per set (fit, check) and metric group: MAPE, mean signed error and the worst
case. Cases are split once, before any fitting, into a ``fit`` set (at most 60 %) and a ``check`` set
(docs/sources.md §11). A case whose card figure came from the same source is ``by_construction`` (left out of the
error figures); a case the simulator cannot model stays in the suite with its reason in ``not_modelled``.

How each metric is computed from a simulation (the benchmark tools' definitions: vLLM ``benchmark_serving`` /
``bench serve``, SGLang ``bench_serving``):

- ``tpot_ms``: per request (e2e − TTFT) / (output − 1), then mean, median or p99 over requests (the client's
  view: ``tpot_client_s``);
- ``itl_ms``: the gaps between a request's successive tokens, pooled over requests (every decode step's end minus
  the previous decode step's end, weighted by its batch size), then mean, median or p99;
- ``ttft_ms``: arrival to first token (``ttft_client_s``), mean, median or p99;
- ``output_throughput_tok_s`` / ``request_throughput_req_s``: output tokens (requests) over the benchmark's
  duration, first arrival to last finish;
- ``decode_step_ms``: the mean decode step with the case's batch (static-batch papers).
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, ValidationError

from sim.config import ScenarioError, read_yaml, scenarios_dir
from sim.config.cards import ModelSpec
from sim.config.engine import resolve_engine
from sim.config.files import format_validation_error
from sim.config.loader import card_names, load_card
from sim.config.spec import Spec

SERVING_COLUMNS = [
    "case", "set", "engine", "metric", "group", "stat", "measured", "simulated", "error_pct", "by_construction",
    "verdict", "note",
]  # fmt: skip
METRIC_GROUPS = {  # metric → the group the report's error figures are taken over
    "tpot_ms": "per_token", "itl_ms": "per_token", "decode_step_ms": "per_token", "ttft_ms": "ttft",
    "output_throughput_tok_s": "throughput", "request_throughput_req_s": "throughput",
}  # fmt: skip
TAIL_GROUPS = {"tpot_ms": "per_token_tail", "itl_ms": "per_token_tail", "ttft_ms": "ttft_tail"}
ALL_AT_ONCE_RATE_PER_S = 1e5  # requests sent at once: arrivals 10 µs apart on average
SETS = ("fit", "check", "saturation")
TAIL_STAT = re.compile(r"^(median|p99)_(tpot|ttft|itl)_ms$")  # extra statistics compared in the *_tail groups
# ShareGPT's length spread has no published figure (docs/sources.md §12.3): the proxy is a real chat service's, the
# shipped Azure LLM inference conversation trace (2023), whose coefficients of variation the lognormal lengths take.
SHAREGPT_PROXY_TRACE = "azure_conv_2023"


@functools.lru_cache(maxsize=1)
def sharegpt_cv() -> tuple[float, float]:
    """(prompt, output) coefficients of variation of the ShareGPT proxy trace's lengths (population std / mean)."""
    from traces.registry import load_trace

    table = load_trace(SHAREGPT_PROXY_TRACE)
    prompt, output = table["prompt_tokens"].to_numpy(float), table["output_tokens"].to_numpy(float)
    return float(prompt.std() / prompt.mean()), float(output.std() / output.mean())


class ServingCaseError(ValueError):
    """A bad serving case file or name; the message is one line naming the file (and key)."""


class _Strict(Spec):
    """The scenario schema's base (sim/config/spec.py): unknown keys, booleans as numbers and inf/NaN refused."""


class Stat(_Strict):
    """A latency figure and the statistic over requests (or pooled tokens) it is."""

    value: Annotated[float, Field(gt=0)]
    stat: Literal["mean", "median", "p99"]


class Load(_Strict):
    """How requests were offered: a Poisson ``rate`` (req/s, optionally with ``max_concurrency``), a closed loop at
    ``concurrency``, ``all_at_once``, or a static ``batch`` decoding together from cached prompts."""

    kind: Literal["rate", "concurrency", "all_at_once", "batch"]
    value: Annotated[float, Field(gt=0)] | None = None  # req/s for rate, clients for concurrency, size for batch
    max_concurrency: Annotated[int, Field(gt=0)] | None = None  # rate only: the client's in-flight cap


class Setup(_Strict):
    """The benchmark's setup, in the simulator's terms (cards in scenarios/models and scenarios/hardware)."""

    model: str
    hardware: str
    tp_size: Literal[1, 2, 4, 8] = 1
    weight_dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    kv_dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    input_tokens: Annotated[int, Field(gt=0)]
    output_tokens: Annotated[int, Field(gt=0)]
    # The source's lengths vary uniformly within ± this share of the stated ones (a benchmark's random range); rebuilt
    # as the simulator's lognormal lengths with the same coefficient of variation, spread / √3. 0: fixed lengths.
    length_spread: Annotated[float, Field(ge=0, le=1)] = 0.0
    num_requests: Annotated[int, Field(gt=0, le=20_000)]
    load: Load
    # colocated: the engine prefills on the decode GPU (its card says whether chunks ride in decode steps);
    # disaggregated: remote prefill; none: prompts cached (static-batch decode)
    prefill: Literal["colocated", "disaggregated", "none"] = "colocated"
    # The prompt and output length distribution: ``random`` (the stated lengths, ± length_spread) or ``sharegpt``
    # (bench_serving's ShareGPT sample: lognormal lengths with the stated means and a chat trace's spread, sharegpt_cv).
    dataset: Literal["random", "sharegpt"] = "random"
    # Scheduler flags only where the published launch command set them (the engine card gives the rest):
    # --chunked-prefill-size / --max-num-batched-tokens, --max-running-requests / --max-num-seqs,
    # --enable-mixed-chunk / --enable-chunked-prefill.
    chunked_prefill_tokens: Annotated[int, Field(gt=0)] | None = None
    max_running_requests: Annotated[int, Field(gt=0)] | None = None
    mixed_prefill: bool | None = None
    policy: str = "sglang"
    overrides: list[str] = []  # further --set overrides (e.g. an offload policy's budget)


class Source(_Strict):
    url: str
    title: str
    quote: str


class Measured(_Strict):
    """What the source states (only those; each checked against the simulation)."""

    tpot_ms: Stat | None = None
    itl_ms: Stat | None = None
    ttft_ms: Stat | None = None
    output_throughput_tok_s: Annotated[float, Field(gt=0)] | None = None
    request_throughput_req_s: Annotated[float, Field(gt=0)] | None = None
    decode_step_ms: Annotated[float, Field(gt=0)] | None = None
    # Every other statistic the source prints, by its own key (``median_tpot_ms``, ``p99_ttft_ms``,
    # ``benchmark_duration_s``, ...): the median and p99 of TPOT, TTFT and ITL are compared too, in the ``*_tail``
    # groups (TAIL_STAT); the rest are kept as published.
    extra: dict[str, float] = {}


class ServingCase(_Strict):
    """One serving case file."""

    name: str
    # The report's groups: fit and check (issue 32's split), saturation (all-at-once or closed-loop >= 64 clients
    # runs). Since issue 46 the shipped fit reads every modelled case, so these figures are in-sample; held-out
    # figures come from cross-validation (calibrate/serving_cv.py).
    set: Literal["fit", "check", "saturation"]
    source: Source
    # The engine as it prints itself, NAME-VERSION (vllm-0.8.2, sglang-0.4.3.post4, trtllm-1.0), resolved to its
    # release line's card (sim/config/engine.py); ``generic`` for prototypes and unknown engines.
    engine: str
    engine_note: str = ""  # how the source states the engine, where it is not NAME-VERSION
    setup: Setup
    measured: Measured
    by_construction: bool = False
    not_modelled: str = ""  # why the simulator cannot model it ("" = it can)
    offloaded: bool = False  # an offloaded or sparse-attention point
    notes: str = ""


def serving_cases_dir() -> Path:
    """Folder of the shipped serving cases."""
    return scenarios_dir() / "cases" / "serving"


def serving_case_names() -> list[str]:
    """Names of the shipped serving cases (file stems), sorted."""
    return sorted(p.stem for p in serving_cases_dir().glob("*.yaml"))


def load_serving_case(path: Path) -> ServingCase:
    """Read and validate one serving case file.

    Raises:
        ServingCaseError: one line naming the file and the bad key.
    """
    try:
        case = ServingCase.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise ServingCaseError(f"{path}: {format_validation_error(exc)}") from None
    except ValueError as exc:
        message = str(exc)
        raise ServingCaseError(message if str(path) in message else f"{path}: {message}") from None
    if not any(getattr(case.measured, k) is not None for k in METRIC_GROUPS):
        raise ServingCaseError(f"{path}: measured: no metric given; expected one of {list(METRIC_GROUPS)}")
    if case.setup.load.kind != "all_at_once" and case.setup.load.value is None:
        raise ServingCaseError(f"{path}: setup.load.value: missing for load kind {case.setup.load.kind!r}")
    try:
        resolve_engine(case.engine)
    except ScenarioError as exc:
        raise ServingCaseError(f"{path}: {exc}") from None
    return case


def load_suite(only: list[str] | None = None, sets: tuple[str, ...] = SETS) -> list[ServingCase]:
    """The shipped serving cases (or the named ones, in that order) of the given sets.

    Raises:
        ServingCaseError: an unknown name, or a bad file.
    """
    names = serving_case_names()
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise ServingCaseError(f"--only: unknown serving case {unknown[0]!r}, expected some of {', '.join(names)}")
    cases = [load_serving_case(serving_cases_dir() / f"{n}.yaml") for n in (only or names)]
    return [c for c in cases if c.set in sets]


def engine_card(engine: str) -> str:
    """The release line (engine card name in ``scenarios/engines/``) a case's ``engine`` resolves to:
    ``vllm-0.8.2`` → ``vllm-0.8``, ``trtllm-0.6.1`` → ``trtllm-0.5``, ``generic`` → ``generic``.

    Raises:
        ScenarioError: an engine no line covers (load_serving_case refuses such a file first).
    """
    return str(resolve_engine(engine)["name"])


def case_overrides(case: ServingCase) -> list[str]:
    """``--set`` overrides of the default scenario that rebuild the case's benchmark (module docstring), on its
    engine card (:func:`engine_card`)."""
    s, load = case.setup, case.setup.load
    prompt_cv = output_cv = 0 if not s.length_spread else s.length_spread / math.sqrt(3)  # a uniform spread's cv
    if s.dataset == "sharegpt":
        prompt_cv, output_cv = sharegpt_cv()
    # The server's longest context: the model card's (the engine's max_model_len default), raised where the case's
    # lengths need more (lognormal lengths: a generous tail).
    longest = (s.input_tokens + s.output_tokens) * (1 + 10 * max(prompt_cv, output_cv))
    card_longest = (
        ModelSpec.model_validate(load_card("model", s.model)).max_seq_len if s.model in card_names("model") else 0
    )
    out = [
        f"model={s.model}", f"hardware={s.hardware}", f"serving.tp_size={s.tp_size}", f"policies={s.policy}",
        f"model.dtype={s.weight_dtype}", f"model.kv_dtype={s.kv_dtype}", f"serving.prefill={s.prefill}",
        "workload.trace=null", "workload.time_scale=1",
        f"workload.synthetic.num_requests={s.num_requests}", f"workload.synthetic.prompt_tokens_cv={prompt_cv!r}",
        f"workload.synthetic.prompt_tokens_mean={s.input_tokens}", f"workload.synthetic.output_tokens_cv={output_cv!r}",
        f"workload.synthetic.output_tokens_mean={s.output_tokens}", "run.progress=false",
        f"model.max_seq_len={max(int(longest), card_longest, 4096)}", f"engine={case.engine}",
    ]  # fmt: skip
    if s.mixed_prefill is not None:
        out.append(f"serving.mixed_prefill={s.mixed_prefill}")
    rate = load.value if load.kind == "rate" else ALL_AT_ONCE_RATE_PER_S
    out.append(f"workload.synthetic.rate_per_s={rate}")
    cap = load.max_concurrency if load.kind == "rate" else (int(load.value) if load.kind == "concurrency" else None)
    if cap is not None:
        out.append(f"workload.synthetic.max_concurrency={cap}")
    if load.kind == "batch":
        out.append(f"policy.{s.policy}.max_running_requests={int(load.value)}")
    elif s.max_running_requests is not None:
        out.append(f"policy.{s.policy}.max_running_requests={s.max_running_requests}")
    if s.chunked_prefill_tokens is not None:
        out.append(f"policy.{s.policy}.chunked_prefill_tokens={s.chunked_prefill_tokens}")
    return [*out, *s.overrides]


def compared_metrics(case: ServingCase) -> list[tuple[str, str, Stat | float]]:
    """What the case compares: ``(metric, group, published value)`` for each metric of :class:`Measured` it gives,
    then the median and p99 TPOT, TTFT and ITL among its ``extra`` statistics (groups ``per_token_tail`` and
    ``ttft_tail``)."""
    m = case.measured
    out: list[tuple[str, str, Stat | float]] = [
        (key, METRIC_GROUPS[key], getattr(m, key)) for key in METRIC_GROUPS if getattr(m, key) is not None
    ]
    for name, value in m.extra.items():
        match = TAIL_STAT.match(name)
        if match:
            key = f"{match.group(2)}_ms"
            out.append((key, TAIL_GROUPS[key], Stat(value=value, stat=match.group(1))))
    return out


def simulated_metrics(case: ServingCase, result) -> list[float]:
    """The values of :func:`compared_metrics` computed from one simulated policy result (module docstring), in order."""
    req = result.requests
    done = req[np.isfinite(req["finish_s"])]
    duration_s = float(done["finish_s"].max() - req["arrival_s"].min()) if len(done) else math.nan
    gaps = None
    out: list[float] = []
    for key, _, value in compared_metrics(case):
        if key in ("tpot_ms", "ttft_ms"):
            column = "tpot_client_s" if key == "tpot_ms" else "ttft_client_s"
            out.append(_stat(done[column].dropna().to_numpy(), None, value.stat) * 1e3)
        elif key == "itl_ms":
            gaps = _token_gaps(result.steps) if gaps is None else gaps
            out.append(_stat(*gaps, value.stat) * 1e3)
        elif key == "output_throughput_tok_s":
            out.append(float(done["output_tokens"].sum()) / duration_s)
        elif key == "request_throughput_req_s":
            out.append(len(done) / duration_s)
        else:  # decode_step_ms
            steps = result.steps[result.steps["phase"] == "decode"]
            full = steps[steps["batch_size"] == int(case.setup.load.value or 0)]
            out.append(float((full if len(full) else steps)["duration_s"].mean()) * 1e3)
    return out


def _token_gaps(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Inter-token gaps (s) of every decode step — its end minus the previous decode step's end, so prefill forwards
    in between count — and their weights (the step's batch size); the first decode step has no gap."""
    decode = steps[steps["phase"] == "decode"]
    ends = (decode["start_s"] + decode["duration_s"]).to_numpy()
    return np.diff(ends), decode["batch_size"].to_numpy()[1:].astype(float)


def _stat(values: np.ndarray, weights: np.ndarray | None, stat: str) -> float:
    if not len(values):
        return math.nan
    if stat == "mean":
        return float(np.average(values, weights=weights))
    q = 0.5 if stat == "median" else 0.99
    if weights is None:
        return float(np.quantile(values, q))
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


def run_serving_case(case: ServingCase, overrides: list[str] | None = None) -> list[dict]:
    """Simulate one case (with extra ``overrides``, e.g. fitted parameters) and compare: one row per metric.

    Raises:
        ScenarioError: the setup's overrides are refused by the scenario schema (a bad card name, say).
        ServingCaseError: the simulated server refused some of the case's requests (longer than ``max_seq_len``,
            larger than the KV pool): its metrics would silently leave them out.
    """
    from sim.config import load_scenario
    from sim.metrics import rejected_by_reason
    from sim.run import simulate

    compared = compared_metrics(case)
    if case.not_modelled:
        return [
            _row(case, key, group, value, math.nan, "not_modelled", case.not_modelled) for key, group, value in compared
        ]
    scenario = load_scenario("default", [*case_overrides(case), *(overrides or [])])
    result = simulate(scenario).policies[scenario.policies[0]]
    rejected = rejected_by_reason(result.requests)
    if rejected:  # the rebuilt benchmark refused requests its source served: the metrics would leave them out
        why = ", ".join(f"{count} {reason}" for reason, count in rejected.items())
        raise ServingCaseError(
            f"{case.name}: the simulated server refused requests ({why}; max_seq_len {scenario.model.max_seq_len}, "
            f"KV pool of {result.kv_pool_gib:.2f} GiB)"
        )
    verdict = "by_construction" if case.by_construction else "compared"
    cached = cached_ttft_note(case, scenario)
    simulated = simulated_metrics(case, result)
    return [
        _row(case, key, group, value, sim, "cache_hits" if cached and key == "ttft_ms" else verdict, cached)
        for (key, group, value), sim in zip(compared, simulated, strict=True)
    ]


def cached_ttft_note(case: ServingCase, scenario) -> str:
    """Why the case's TTFTs cannot be compared, or "": its first wave of requests (all of them sent at once, or the
    closed loop's first ``concurrency``) could not have been prefilled by the published p99 TTFT without prefix-cache
    hits (sibling runs of one benchmark send the same seeded prompts to one server, which the replay cannot know).
    Bound: at least the wave less 1 % of the requests had their first token by the p99, their prompts (at the mean
    length, less the same share) at 2 FLOPs per active weight each, against the replica's dense tensor peak."""
    load, p99 = case.setup.load, case.measured.extra.get("p99_ttft_ms")
    if load.kind not in ("all_at_once", "concurrency") or p99 is None:
        return ""
    n = case.setup.num_requests
    wave = n if load.kind == "all_at_once" else min(int(load.value or n), n)
    late = math.ceil(0.01 * n)
    if wave <= late:
        return ""
    tokens = (wave - late) * case.setup.input_tokens * (1 - late / wave)
    model, hw = scenario.model, scenario.hardware
    flops = 2.0 * model.num_layers * model.active_params_per_layer * tokens
    fp8 = model.dtype == "fp8" and hw.fp8_tflops is not None
    peak = (hw.fp8_tflops if fp8 else hw.bf16_tflops) * 1e12 * scenario.serving.tp_size
    need = flops / (p99 * 1e-3) / peak
    if need <= 1:
        return ""
    return (
        f"TTFT p99 {p99:g} ms: the first {wave} prompts (~{tokens:,.0f} tokens by then) would need {need:.1f}x the "
        f"{scenario.serving.tp_size} GPUs' dense peak without prefix-cache hits"
    )


def _row(case: ServingCase, key: str, group: str, value, simulated: float, verdict: str, note: str) -> dict:
    stat = value.stat if isinstance(value, Stat) else ""
    measured = value.value if isinstance(value, Stat) else float(value)
    error = (simulated - measured) / measured * 100 if math.isfinite(simulated) else math.nan
    return {
        "case": case.name, "set": case.set, "engine": engine_card(case.engine), "metric": key, "group": group,
        "stat": stat,
        "measured": measured,
        "simulated": simulated, "error_pct": error, "by_construction": case.by_construction, "verdict": verdict,
        "note": note,
    }  # fmt: skip


def suite_table(rows: list[dict]) -> pd.DataFrame:
    """Rows of :func:`run_serving_case` as a table with :data:`SERVING_COLUMNS`."""
    return pd.DataFrame(rows, columns=SERVING_COLUMNS)


def suite_report(table: pd.DataFrame, offloaded: set[str] | None = None) -> pd.DataFrame:
    """Per set (fit, check) and metric group (per_token, ttft, throughput, and ``offloaded`` for the offloaded and
    sparse cases' every metric): compared rows, MAPE (%), mean signed error (%), the worst case and its error.
    Cases ``by_construction`` or ``not_modelled`` and TTFTs only prefix-cache hits explain (``cache_hits``,
    :func:`cached_ttft_note`) are left out (counted in ``left_out``)."""
    offloaded = offloaded or set()
    t = table.copy()
    t.loc[t["case"].isin(offloaded), "group"] = "offloaded"
    rows = []
    for (set_name, group), part in t.groupby(["set", "group"], sort=True):
        used = part[(part["verdict"] == "compared") & np.isfinite(part["error_pct"])]
        worst = used.loc[used["error_pct"].abs().idxmax()] if len(used) else None
        rows.append({
            "set": set_name, "group": group, "compared": len(used), "left_out": len(part) - len(used),
            "mape_pct": float(used["error_pct"].abs().mean()) if len(used) else math.nan,
            "mean_signed_pct": float(used["error_pct"].mean()) if len(used) else math.nan,
            "worst_case": "" if worst is None else f"{worst['case']} ({worst['metric']})",
            "worst_pct": math.nan if worst is None else float(worst["error_pct"]),
        })  # fmt: skip
    return pd.DataFrame(rows)
