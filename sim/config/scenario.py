"""The whole experiment: hardware × model × workload × policies, plus SLO, serving layout and run options."""

from __future__ import annotations

import importlib.util
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.cards import HardwareSpec, ModelSpec
from sim.config.checks import geometry_problems
from sim.config.engine import DEFAULT_ENGINE, EngineSpec
from sim.config.files import scenarios_dir, short_repr, table_format_problem
from sim.config.measured import Profile, RecallStatsSpec
from sim.config.parallel import shard_error
from sim.config.policy import PolicySpec
from sim.config.spec import PositiveFloat, PositiveInt, Spec
from sim.config.workload_spec import WorkloadSpec

# A scenario's name is the folder results/<name> (pulseinfer simulate without --out): a name, never a path.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
NAME_RULE = "must be 1 to 100 ASCII letters, digits, '.', '_' or '-', not starting with '.' (it names results/<name>)"


class SloSpec(Spec):
    """Per-request service-level objective; goodput counts requests that meet every set bound."""

    tpot_ms: PositiveFloat | None = 100.0
    ttft_s: PositiveFloat | None = None


class ServingSpec(Spec):
    """Where prefill runs relative to the simulated decode GPU.

    ``colocated``: the GPU runs prefill and decode itself, SGLang's default (prefill first, chunked).
    ``disaggregated``: prefill runs on ``num_prefill_gpus`` separate GPUs of the same card (FIFO, one
    request at a time each) and finished prefills queue for the decode GPU, as in Mooncake's
    prefill/decode split and SGLang HiSparse's decode-only deployment (docs/sources.md §5.4). Model
    assumption: KV transfer from the prefill GPU is hidden (layer-wise RDMA) and costs no time.
    ``none``: requests arrive with their prompt's KV already cached and their first token sampled (prefill
    is not simulated) — decode alone, as `pulseinfer validate` runs the engine on pre-filled caches.

    ``tp_size``: GPUs per replica (tensor parallelism, sim/config/parallel.py); every decode and prefill GPU
    figure (KV pool, step time, link) is per GPU of the group, request and throughput figures per replica.

    ``replicas``: decode replicas of ``tp_size`` GPUs each behind ``router`` (sim/serving/cluster.py: ``round_robin``,
    ``least_tokens``, fewest outstanding prompt + output tokens, or ``prefix_aware``, longest cached prefix); 1 is
    the single-replica simulation. With ``disaggregated`` prefill each replica has its own pool of
    ``num_prefill_gpus`` (as ``plan``'s fleets).
    """

    prefill: Literal["colocated", "disaggregated", "none"] = "colocated"
    # colocated only: a forward carries the prefill chunk and the running batch's decode tokens together (vLLM
    # V1's default scheduler, TensorRT-LLM's in-flight batching with chunked context, SGLang --enable-mixed-chunk);
    # false: prefill first, decode waits (SGLang's default). sim/serving/prefill.py.
    mixed_prefill: bool = False  # default: the engine card's (sim/config/engine_apply.py)
    # How the engine is driven: ``serve`` (an OpenAI-compatible server, as every public serving benchmark) or
    # ``offline`` (vLLM's LLM class): vLLM's token budget depends on it (sim/config/engine.py GpuTier).
    usage_context: Literal["serve", "offline"] = "serve"
    num_prefill_gpus: Annotated[int, Field(ge=1, le=100_000)] = 4  # prefill replicas (each of tp_size GPUs)
    tp_size: Literal[1, 2, 4, 8] = 1
    replicas: Annotated[int, Field(ge=1, le=100_000)] = 1  # decode replicas of tp_size GPUs (≤ any real cluster)
    router: Literal["round_robin", "least_tokens", "prefix_aware"] = "round_robin"  # cluster.py ALL_ROUTERS


class CostSpec(Spec):
    """What a GPU-hour costs, as the user gives it (no price is shipped as fact): hardware card name → US dollars
    per GPU-hour, positive. Only the scenario's own card's price is used (sim/metrics/bill.py); the names must be
    shipped cards (scenarios/hardware/) or the scenario's own card."""

    gpu_hour_usd: dict[str, PositiveFloat] = {}


class RunSpec(Spec):
    """How to run the simulation (not what is simulated).

    ``tables``: ``all`` keeps and writes every table; ``summary`` keeps no per-step rows, per-layer records or
    timeline at all (the summary comes from the recorder's running totals, the same numbers) and writes only
    summary.csv, the requests table and scenario.yaml (``pulseinfer simulate --summary-only``; sweeps, searches
    and plans run their points this way). ``table_format``: file format of the requests/steps/layer tables
    (summary.csv is always CSV); ``auto`` = Parquet when ``pyarrow`` imports, else CSV; ``parquet`` needs
    ``pyarrow`` (``pip install 'pulseinfer[parquet]'``).
    """

    horizon_s: PositiveFloat | None = None  # stop here; None = until every request is done
    debug_checks: bool = False  # expensive invariant sweeps every step (tests turn it on)
    layer_bin_s: PositiveFloat = 10.0  # time bin of layer_recall.csv (the layer × time heatmap)
    timeline_step: PositiveInt = 200  # timeline.csv shows the N-th decode step that recalls (else the first)
    progress: bool = True
    # Hot loops: "auto" compiles them with numba when it is installed (the `fast` extra), "python" runs the same
    # source as Python, "numba" requires numba (sim/step/pipeline.py; every table is tested equal either way).
    kernels: Literal["auto", "python", "numba"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _no_layer_model(cls, data: object) -> object:
        """``run.layer_model`` is retired: ``closed_form`` (the model) is accepted and dropped, so old scenarios
        load; ``events`` is refused."""
        if isinstance(data, dict) and "layer_model" in data:
            if data["layer_model"] != "closed_form":
                raise ValueError(
                    f"layer_model {data['layer_model']!r} is retired: the SimPy-events layer pipeline is now a test "
                    "oracle (tests/sim/oracles/step_timing.py); remove the key (closed_form is the only model)"
                )
            data = {key: value for key, value in data.items() if key != "layer_model"}
        return data

    @field_validator("kernels")
    @classmethod
    def _numba_installed(cls, value: str) -> str:
        if value == "numba" and importlib.util.find_spec("numba") is None:
            raise ValueError(
                "'numba' needs the numba package, which is not installed: pip install 'pulseinfer[fast]', "
                "or use 'auto' (numba when installed) or 'python'"
            )
        return value

    tables: Literal["all", "summary"] = "all"
    # Compute runs of decode steps in which nothing but the step index changes at once (sim/serving/replica.py
    # ``_decode_run``, sim/serving/decode_run.py; tested equal to stepping one by one, which ``false`` does).
    skip_ahead: bool = True
    table_format: Literal["auto", "csv", "parquet"] = "auto"
    # Worker processes for a fleet whose replicas are independent (serving.router: round_robin; sim/serving/
    # fleet_pool.py): a whole number >= 1 (1 = one SimPy environment in this process), or "auto": the idle CPUs
    # (CPUs less the load average) for fleets of 2+ replicas and 2,000+ requests, 1 inside a worker process. The
    # tables are the same either way (tests/sim/test_fleet_scale.py); load-aware routers always use one environment.
    workers: int | Literal["auto"] = "auto"

    @field_validator("workers", mode="before")
    @classmethod
    def _whole_workers(cls, value: object) -> object:
        text = value.strip().lower() if isinstance(value, str) else value
        if text == "auto":
            return "auto"
        try:
            number = int(text) if isinstance(text, (int, str)) and not isinstance(text, bool) else None
        except ValueError:
            number = None
        if number is None or number < 1:
            raise ValueError("workers must be 'auto' or a whole number >= 1 (worker processes)")
        return number

    @field_validator("table_format")
    @classmethod
    def _parquet_needs_pyarrow(cls, table_format: str) -> str:
        problem = table_format_problem(table_format)
        if problem:
            raise ValueError(problem)
        return table_format


class Scenario(Spec):
    """A whole experiment: hardware × model × workload × policies, plus SLO and run options."""

    name: str = "scenario"  # NAME_PATTERN
    seed: Annotated[int, Field(ge=0)] = 0
    model: ModelSpec
    hardware: HardwareSpec
    engine: EngineSpec = DEFAULT_ENGINE  # the serving engine's release line (a name such as vllm-0.11.0, or a card)
    workload: WorkloadSpec = WorkloadSpec()
    slo: SloSpec = SloSpec()
    serving: ServingSpec = ServingSpec()
    cost: CostSpec = CostSpec()
    policies: Annotated[list[str], Field(min_length=1)]  # names to run, in order
    policy: dict[str, PolicySpec]  # resolved knobs of every policy in ``policies`` (loader merges presets)
    recall_stats: RecallStatsSpec = RecallStatsSpec()
    profile: Profile | None = None  # calibrated measurements; the loader fills hardware/model/recall_stats from it
    run: RunSpec = RunSpec()

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(NAME_RULE)
        return name

    @model_validator(mode="after")
    def _check_policies(self) -> Scenario:
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: must not repeat a name, got {short_repr(self.policies)}")
        missing = [p for p in self.policies if p not in self.policy]
        if missing:
            raise ValueError(f"policies: {short_repr(missing)} have no entry under policy")
        self._check_tp()
        self._check_cost()
        policies = {p: self.policy[p] for p in self.policies}
        problems = geometry_problems(self.model, self.hardware, policies, self.serving.tp_size)
        if problems:
            raise ValueError(problems[0])
        compute = self.profile.compute if self.profile else None
        measured = self.profile.model if self.profile else None
        same_layers = (
            measured is not None
            and measured.model_copy(
                update={
                    "name": self.model.name,
                    "num_layers": self.model.num_layers,
                    "max_seq_len": self.model.max_seq_len,
                }
            )
            == self.model
        )  # per-layer compute of a few layers of this very model (a GPU calibration runs 4)
        if compute is not None and compute.model != self.model.name and not same_layers:
            raise ValueError(
                f"profile.compute was measured on model {short_repr(compute.model)} but the scenario's model is "
                f"{short_repr(self.model.name)}; use that model (leave `model` out, or --set model=null, to take "
                f"the profile's) or a profile calibrated with --model {self.model.name}"
            )
        return self

    def _check_cost(self) -> None:
        """``cost.gpu_hour_usd`` names shipped hardware cards or the scenario's own (a typo would price nothing)."""
        known = sorted({p.stem for p in (scenarios_dir() / "hardware").glob("*.yaml")} | {self.hardware.name})
        unknown = [card for card in self.cost.gpu_hour_usd if card not in known]
        if unknown:
            raise ValueError(f"cost.gpu_hour_usd: unknown card {short_repr(unknown[0])} (cards: {', '.join(known)})")

    def _check_tp(self) -> None:
        """``serving.tp_size`` > 1 needs a splittable model, a card with NVLink and room in one node."""
        tp, hw = self.serving.tp_size, self.hardware
        if tp == 1:
            return
        reason = shard_error(self.model, tp)
        if reason:
            raise ValueError(f"serving.tp_size: {reason}")
        if hw.nvlink_bandwidth_gbps is None:
            raise ValueError(
                f"serving.tp_size: {tp} needs hardware.nvlink_bandwidth_gbps (card {hw.name} has none); "
                f"set it or use tp_size 1"
            )
        if tp > hw.gpus_per_node:
            raise ValueError(f"serving.tp_size ({tp}) must be <= hardware.gpus_per_node ({hw.gpus_per_node})")
        if self.profile is not None and self.profile.compute is not None:
            raise ValueError(
                f"serving.tp_size: {tp} cannot use profile.compute (a calibration of one GPU at TP 1); "
                f"drop the profile's compute or use tp_size 1"
            )
