"""The serving engine: one card per release line of vLLM, SGLang or TensorRT-LLM (``scenarios/engines/``).

A scenario names its engine as the engine prints itself (``engine: vllm-0.11.0``, ``sglang-0.5.5.post1``,
``trtllm-1.2.0rc1``) or by name alone (``engine: vllm``: the newest line). :func:`resolve_engine` finds the card of
the release line whose ``versions`` (a PEP 440 specifier set) covers the version's release (a pre-, post- or dev
release belongs to the line of its release number: ``0.11.0rc2`` and ``0.11.2.dev358`` to the 0.11 line);
a version older than every line runs on the oldest line, with a ``note``; an unknown name, or a version newer than
every line, is refused in one line that lists the lines.

A card states, from the engine's source at the release it was read from (docs/sources.md §12, file and line):
the step (``mixed_prefill``: prefill chunks ride in decode steps, after the running decodes; otherwise a prefill
forward runs first whenever one can be formed), per GPU (:class:`GpuTier`) the token budget, running cap and largest
CUDA-graph batch, the KV pool (:class:`KvMemory`) and page size, the admission reserve (``new_token_ratio_*``:
SGLang's decaying estimate, vLLM's none, TensorRT-LLM's all), pre-emption and its victim, prefix caching, the
CUDA-graph sizes a decode batch is padded to, and the host costs of a step (fitted per line where the serving suite
has cases of it, docs/sources.md §11; else the hardware card's catch-all).

:func:`engine_defaults` evaluates a card for one GPU, TP and usage context: the numbers the loader writes into the
scenario's ``serving``, ``policy`` and ``hardware`` sections wherever the scenario does not set them itself
(sim/config/loader.py), so a run's resolved ``scenario.yaml`` shows them.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import Field, field_validator, model_validator

from sim.config.files import ScenarioError, read_yaml, scenarios_dir, short_repr
from sim.config.spec import NonNeg, PositiveFloat, PositiveInt, Spec

ENGINE_DIR = "engines"  # under scenarios/
# How engines spell their own name in the files benchmark clients write (bench_serving's backend, vLLM's metadata).
ENGINE_ALIASES = {
    "vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm",
    "trt-llm": "trtllm", "tensorrtllm": "trtllm",
}  # fmt: skip
# NAME, or NAME and a version after a separator (``vllm-0.9.2``, ``vllm 0.9.2``, ``TensorRT-LLM v1.2.0rc1``)
_NAME_VERSION = re.compile(
    r"^\s*([a-z](?:[a-z_-]*[a-z])?)(?:(?:[-_ ]+v?|v?(?=\d))(\d[0-9a-z.+!-]*))?\s*$", re.IGNORECASE
)


class GpuTier(Spec):
    """One GPU class's scheduler defaults. A tier matches a GPU with less than ``below_hbm_gib`` of memory (None:
    any) whose card name contains ``name_contains`` (None: any; vLLM ≥ 0.9 singles out A100s by device name);
    a card's tiers are tried in order and the first match wins (the last tier should match every GPU)."""

    below_hbm_gib: PositiveFloat | None = None
    name_contains: str | None = None
    # Tokens per forward (vLLM max_num_batched_tokens, SGLang chunked_prefill_size, TensorRT-LLM max_num_tokens);
    # ``max_seq_len``: the model's longest context (vLLM V0 without chunked prefill)
    token_budget: PositiveInt | Literal["max_seq_len"]
    offline_token_budget: PositiveInt | None = None  # the budget in offline use (vLLM's LLM class); None: the same
    max_running_requests: PositiveInt  # vLLM max_num_seqs, SGLang max_running_requests, TensorRT-LLM max_batch_size
    cuda_graph_max_batch: Annotated[int, Field(ge=0)] = 0  # largest captured decode batch; 0: no CUDA graphs
    reserve_gib: NonNeg | None = None  # this tier's fixed HBM reserve (None: the card's kv_memory.reserve_gib)
    reserve_floor_gib: NonNeg | None = None  # this tier's floor on the reserve (None: kv_memory.reserve_floor_gib)

    def matches(self, hbm_gib: float, card_name: str) -> bool:
        """Whether a GPU of ``hbm_gib`` GiB named ``card_name`` is in this tier."""
        small = self.below_hbm_gib is None or hbm_gib < self.below_hbm_gib
        return small and (self.name_contains is None or self.name_contains.lower() in card_name.lower())


class KvMemory(Spec):
    """How the engine sizes its KV pool on one GPU (GiB = 2**30 bytes)::

        reserve = max(floor, reserve_gib + reserve_per_tp_gib · tp
                             + reserve_per_budget_token_kib · max(budget, budget_floor_tokens) / 2**20
                             + reserve_per_graph_batch_mib · cuda_graph_max_batch / 2**10)
        of total: pool = utilization · hbm − weights − reserve        (vLLM gpu_memory_utilization; SGLang: 1)
        of free:  pool = utilization · (hbm − weights − reserve)      (TensorRT-LLM kv_cache_free_gpu_mem_fraction)

    ``utilization_by_tp`` (SGLang ≤ 0.3): the utilization at the largest listed TP ≤ the scenario's. The simulator
    keeps ``hbm − pool − weights`` as the hardware's ``reserve_gib`` (sim/serving/kv.py).
    """

    utilization: Annotated[float, Field(gt=0, le=1)] = 1.0
    utilization_by_tp: dict[PositiveInt, Annotated[float, Field(gt=0, le=1)]] = {}
    of: Literal["total", "free"] = "total"
    reserve_gib: NonNeg = 0.0
    reserve_per_tp_gib: NonNeg = 0.0
    reserve_per_budget_token_kib: NonNeg = 0.0
    budget_floor_tokens: Annotated[int, Field(ge=0)] = 0
    reserve_per_graph_batch_mib: NonNeg = 0.0
    reserve_floor_gib: NonNeg = 0.0


class EngineSpec(Spec):
    """One release line of a serving engine (module docstring); shipped cards in ``scenarios/engines/``.

    Host path: ``step_serial_us`` (µs per step) and ``request_serial_us`` (µs per request per step), CPU work in
    series with the GPU step (None: the card's catch-all ``decode_step_overhead_us`` / ``decode_request_overhead_us``);
    ``request_overlapped_us``, work beside it: a step lasts ``max(serial step, B · request_overlapped_us)``
    (sim/step/pipeline.py ``host_bound_s``). Bounds: 0 to 1e5 µs per step and 0 to 1e4 µs per request.
    """

    name: str = "generic"
    engine: Literal["vllm", "sglang", "trtllm", "generic"] = "generic"
    versions: str = ""  # PEP 440 specifier set of the releases this line covers ("" : no release, e.g. generic)
    built_from: list[str] = []  # the releases whose source the card was read from
    version: str = ""  # the release the scenario asked for ("": the line itself)
    note: str = ""  # how the scenario's name was resolved where it was not exact
    source: str = "the simulator's SGLang-like scheduler and the card's host costs"
    mixed_prefill: bool = False
    tiers: Annotated[list[GpuTier], Field(min_length=1)] = [GpuTier(token_budget=8192, max_running_requests=2048)]
    kv_memory: KvMemory = KvMemory(reserve_gib=9.5, reserve_per_tp_gib=0.5)
    block_tokens: PositiveInt = 1  # the dense KV pool's block (page) size
    new_token_ratio_init: Annotated[float, Field(ge=0, le=1)] = 0.7
    new_token_ratio_min: Annotated[float, Field(ge=0, le=1)] = 0.098
    preemption: Literal["recompute", "swap"] = "recompute"
    preempt_victim: Literal["fewest_decoded", "newest"] = "fewest_decoded"
    prefix_cache: bool = True
    # MLA models (DeepSeek-V2/V3): the engine caches the compressed latent; False: it expands MLA into per-head K
    # and V padded for its kernel (vLLM before 0.7.1: 2 × heads × 256 per token and layer; ModelSpec).
    mla_cache: bool = True
    cuda_graph_sizes: list[list[PositiveInt]] = []  # [n] or [start, stop, step] (stop included); [] = none
    # The largest captured decode batch on the scenario's GPU (None: its tier's; the loader writes it).
    cuda_graph_max_batch: Annotated[int, Field(ge=0)] | None = None
    # vLLM V0: chunked prefill (mixed steps, chunked_token_budget) turns itself on above this max_model_len
    chunked_above_max_seq_len: PositiveInt | None = None
    chunked_token_budget: PositiveInt = 2048
    running_within_budget: bool = False  # vLLM >= 0.11: max_num_seqs = min(max_num_seqs, max_num_batched_tokens)
    cuda_graph_per_running: Annotated[int, Field(ge=0)] = 0  # vLLM >= 0.11: graphs up to min(max, this × max_num_seqs)
    step_serial_us: Annotated[float, Field(ge=0, le=1e5)] | None = None
    request_serial_us: Annotated[float, Field(ge=0, le=1e4)] | None = None
    request_overlapped_us: Annotated[float, Field(ge=0, le=1e4)] = 0.0

    @field_validator("versions")
    @classmethod
    def _check_versions(cls, value: str) -> str:
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError("expected a PEP 440 specifier set such as '>=0.8,<0.9'") from None
        return value

    @field_validator("cuda_graph_sizes")
    @classmethod
    def _check_sizes(cls, value: list[list[int]]) -> list[list[int]]:
        for item in value:
            if len(item) not in (1, 3) or (len(item) == 3 and item[1] < item[0]):
                raise ValueError(f"each entry is [n] or [start, stop, step] with stop >= start, got {item}")
        return value

    @model_validator(mode="after")
    def _check_ratio(self) -> EngineSpec:
        init, low = self.new_token_ratio_init, self.new_token_ratio_min
        if init < low:
            raise ValueError(f"new_token_ratio_init ({init}) must be >= new_token_ratio_min ({low})")
        return self

    def tier(self, hbm_gib: float, card_name: str) -> GpuTier:
        """The first tier that matches the GPU (the last one when none does)."""
        return next((t for t in self.tiers if t.matches(hbm_gib, card_name)), self.tiers[-1])

    def graph_batches(self, hbm_gib: float, card_name: str) -> tuple[int, ...]:
        """The decode batch sizes captured as CUDA graphs on this GPU, ascending, up to ``cuda_graph_max_batch``
        (None: the GPU's tier's); empty without graphs. A batch runs at the next one that holds it."""
        top = self.cuda_graph_max_batch
        top = self.tier(hbm_gib, card_name).cuda_graph_max_batch if top is None else top
        ranges = [[i[0]] if len(i) == 1 else range(i[0], i[1] + 1, i[2]) for i in self.cuda_graph_sizes]
        return tuple(sorted({s for r in ranges for s in r if s <= top}))

    def step_serial_us_on(self, hardware) -> float:
        """Serial host µs of one decode step: this engine's, else the card's ``decode_step_overhead_us``."""
        return self.step_serial_us if self.step_serial_us is not None else hardware.decode_step_overhead_us

    def request_serial_us_on(self, hardware) -> float:
        """Serial host µs per request per decode step: this engine's, else the card's ``decode_request_overhead_us``."""
        return self.request_serial_us if self.request_serial_us is not None else hardware.decode_request_overhead_us


DEFAULT_ENGINE = EngineSpec()  # direct construction only: the loader's default is the newest SGLang line


@dataclass(frozen=True)
class EngineDefaults:
    """A card evaluated for one GPU, TP and usage context (:func:`engine_defaults`)."""

    token_budget: int  # tokens per forward
    max_running_requests: int
    mixed_prefill: bool
    cuda_graph_max_batch: int
    reserve_gib: float  # hbm − pool − weights, per GPU (the hardware section's reserve_gib)


# fmt: off
def engine_defaults(
    engine: EngineSpec, hbm_gib: float, card_name: str, tp: int, weight_gib: float, max_seq_len: int, usage: str,
    budget: int | None = None, running: int | None = None,
) -> EngineDefaults:
    # fmt: on
    """The card's defaults on one GPU.

    Args:
        engine: the release line's card.
        hbm_gib: the GPU's memory (GiB, as the engine reads it); card_name: the hardware card's name.
        tp: GPUs per replica; weight_gib: the model's weights on one GPU (GiB); max_seq_len: the longest context.
        usage: ``serve`` (an OpenAI-compatible server) or ``offline`` (vLLM's ``LLM`` class).
        budget, running: the scenario's own token budget and running cap where it sets them (the reserve, the
            cap and the CUDA graphs follow them as the engine does); None: the card's.
    """
    tier = engine.tier(hbm_gib, card_name)
    auto = engine.chunked_above_max_seq_len is not None and max_seq_len > engine.chunked_above_max_seq_len
    if budget is None:
        budget = max_seq_len if tier.token_budget == "max_seq_len" else tier.token_budget
        if usage == "offline" and tier.offline_token_budget is not None:
            budget = tier.offline_token_budget
        budget = engine.chunked_token_budget if auto else budget
    cap = tier.max_running_requests if running is None else running
    if engine.running_within_budget and running is None:
        cap = min(cap, budget)
    graphs = tier.cuda_graph_max_batch
    if engine.cuda_graph_per_running:
        graphs = min(graphs, engine.cuda_graph_per_running * cap)
    mem = engine.kv_memory
    fixed = mem.reserve_gib if tier.reserve_gib is None else tier.reserve_gib
    floor = mem.reserve_floor_gib if tier.reserve_floor_gib is None else tier.reserve_floor_gib
    per_budget = mem.reserve_per_budget_token_kib * max(budget, mem.budget_floor_tokens) / 2**20
    reserve = max(
        floor, fixed + mem.reserve_per_tp_gib * tp + per_budget + mem.reserve_per_graph_batch_mib * graphs / 2**10
    )
    by_tp = mem.utilization_by_tp
    util = by_tp[max((k for k in by_tp if k <= tp), default=min(by_tp))] if by_tp else mem.utilization
    pool = util * hbm_gib - weight_gib - reserve if mem.of == "total" else util * (hbm_gib - weight_gib - reserve)
    return EngineDefaults(budget, cap, engine.mixed_prefill or auto, graphs, hbm_gib - weight_gib - pool)


# ---- release lines ------------------------------------------------------------------------------------------------
def _lines() -> list[tuple[str, dict[str, Any]]]:
    """Every shipped card (``scenarios/engines/``) as (file stem, raw dict), sorted; read once per process, so
    read-only: :func:`resolve_engine` hands out copies."""
    return _read_lines(str(scenarios_dir() / ENGINE_DIR))


@functools.lru_cache(maxsize=4)
def _read_lines(folder: str) -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, read_yaml(p)) for p in sorted(Path(folder).glob("*.yaml"))]


def release_lines(kind: str | None = None) -> list[tuple[str, SpecifierSet]]:
    """The shipped release lines (card name, the releases it covers) of one engine kind (None: all), oldest first."""
    out = [(n, SpecifierSet(r["versions"])) for n, r in _lines() if r.get("versions") and kind in (None, r["engine"])]
    return sorted(out, key=lambda item: (item[0].split("-")[0], _lowest(item[1])))


def _lowest(spec: SpecifierSet) -> Version:
    return min([Version(s.version) for s in spec if s.operator in (">=", "==", "~=")], default=Version("0"))


def known_lines() -> str:
    """The lines in one phrase: ``vllm-0.5 (>=0.5,<0.8), ...`` plus the named cards without releases."""
    lines = [f"{name} ({_spec_text(spec)})" for name, spec in release_lines()]
    return ", ".join(lines + [name for name, raw in _lines() if not raw.get("versions")])


def _spec_text(spec: SpecifierSet) -> str:  # lower bound first: >=0.5,<0.8
    return ",".join(sorted((str(s) for s in spec), key=lambda s: (not s.startswith(">"), s)))


def parse_engine_name(text: str) -> tuple[str, str | None] | None:
    """``(kind, version)`` of an engine as it prints itself (``vllm-0.9.2``; ``vllm``: version None), or None."""
    match = _NAME_VERSION.match(text)
    kind = ENGINE_ALIASES.get(match.group(1).lower()) if match else None
    return None if kind is None else (kind, match.group(2))


def resolve_engine(name: str) -> dict[str, Any]:
    """The card (a raw dict) of an engine name: a shipped card's own name (``generic``, ``vllm-0.11``), or
    ``NAME[-VERSION]`` resolved to its release line (module docstring), with ``version`` and ``note`` filled in.

    Raises:
        ScenarioError: one line naming the value and listing the known lines (an unknown name, a version that is
            not PEP 440, or one newer than every line of its engine).
    """
    cards = copy.deepcopy(dict(_lines()))  # the caller may edit what it gets (--set engine.kv_memory...)
    if name.lower() in cards and not cards[name.lower()].get("versions"):
        return engine_card(cards[name.lower()])
    parsed = parse_engine_name(name)
    if parsed is None:
        raise ScenarioError(
            f"engine: unknown engine {short_repr(name)}; expected vllm, sglang or trtllm with the version as the "
            f"engine prints it (vllm-0.11.0, sglang-0.5.5.post1, trtllm-1.2.0rc1), or a card: {known_lines()}"
        )
    kind, text = parsed
    lines = release_lines(kind)
    if text is None:
        line, note = lines[-1][0], f"{kind} without a version: the newest line, {lines[-1][0]}"
        return {**cards[line], "version": "", "note": note}
    try:
        version = Version(text)
    except InvalidVersion:
        raise ScenarioError(
            f"engine: {short_repr(name)} has no version PEP 440 can read ({short_repr(text)}); expected e.g. "
            f"{lines[-1][0]}.0 (known lines: {known_lines()})"
        ) from None
    release = Version(version.base_version)  # 0.11.0rc2 and 0.11.2.dev358 belong to the 0.11 line
    for line, spec in lines:
        if spec.contains(release, prereleases=True):
            return {**cards[line], "version": text, "note": ""}
    oldest, spec = lines[0]
    if release < _lowest(spec):
        note = f"{kind} {text} is older than every line; it runs on the oldest, {oldest} ({_spec_text(spec)})"
        return {**cards[oldest], "version": text, "note": note}
    raise ScenarioError(
        f"engine: {short_repr(name)} is outside every {kind} release line (known lines: {known_lines()}); "
        f"name the nearest line (e.g. engine={lines[-1][0]}) or give a card file of your own"
    )


def engine_card(value: str | dict[str, Any]) -> dict[str, Any]:
    """An engine value as a full card dict: a name (:func:`resolve_engine`), or a dict (a card file of your own, a
    profile's engine section, a resolved scenario.yaml's). A dict without ``tiers`` holds values of a line (its
    host costs, say): it is laid over the card its ``inherits`` key names, else the card its ``name`` resolves to
    (calibrate writes ``engine-<line>.yaml`` this way).

    Raises:
        ScenarioError: as :func:`resolve_engine`, naming ``engine.inherits`` or ``engine.name``; or a dict without
            tiers that names no line.
    """
    if isinstance(value, str):
        return resolve_engine(value)
    if not isinstance(value, dict) or "tiers" in value:
        return value
    base = value.get("inherits") or value.get("name")
    if not isinstance(base, str) or not base.strip():
        raise ScenarioError(
            "engine: a card without tiers lays its values over a release line; give it `inherits: LINE` or a `name` "
            f"that resolves to one (known lines: {known_lines()})"
        )
    try:
        card = resolve_engine(base)
    except ScenarioError as exc:
        where = "inherits" if "inherits" in value else "name"
        raise ScenarioError(f"engine.{where}: {exc.args[0].removeprefix('engine: ')}") from None
    if "inherits" in value:
        card = {**card, "version": "", "note": ""}  # a card of its own, built on the line
    return {**card, **{k: v for k, v in value.items() if k != "inherits"}}
