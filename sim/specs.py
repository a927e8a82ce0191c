"""Scenario schema: model, hardware, workload, policies, SLO and run options, validated with pydantic v2.

A scenario is one YAML file (see ``scenarios/default.yaml``). Every model is frozen and rejects unknown
keys, so a typo comes back with its dotted location (``workload.time_scal: Extra inputs are not
permitted``). Derived quantities (KV bytes per token, weight bytes) are properties computed from the
fields, never hard-coded.

Units follow the key names: ``_gib`` = 2**30 bytes, ``_gbps`` = 1e9 bytes/s, ``_us`` = 1e-6 s.

These models are the *edge*: the simulator's hot loops copy what they need into plain locals once.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(_Spec):
    """Transformer shape (one model card). Source of each card is named in its YAML file.

    MoE models set ``num_experts``/``num_active_experts``/``expert_intermediate_size``; their dense
    ``intermediate_size`` is 0. Norms and biases are ignored in parameter counts (< 0.1 % of weights).
    """

    name: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_heads: PositiveInt  # query heads
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: Annotated[int, Field(ge=0)]  # dense SwiGLU MLP width; 0 for all-MoE models
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    max_seq_len: PositiveInt = 131072  # longest context served (prompt + output tokens)
    dtype: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    num_experts: Annotated[int, Field(ge=0)] = 0
    num_active_experts: Annotated[int, Field(ge=0)] = 0
    expert_intermediate_size: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.num_experts and not (0 < self.num_active_experts <= self.num_experts):
            raise ValueError(
                f"num_active_experts must be in [1, num_experts={self.num_experts}], got {self.num_active_experts}"
            )
        if self.num_experts and not self.expert_intermediate_size:
            raise ValueError("expert_intermediate_size must be > 0 for an MoE model (num_experts > 0)")
        if not self.num_experts and not self.intermediate_size:
            raise ValueError("intermediate_size must be > 0 for a dense model (num_experts = 0)")
        return self

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer: 2 × num_kv_heads × head_dim × dtype bytes."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers (REFERENCE.md §4: 160 KiB for Qwen3-14B)."""
        return self.kv_bytes_per_token_layer * self.num_layers

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and O projection weights of one layer."""
        q_dim = self.num_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        return 2 * self.hidden_size * q_dim + 2 * self.hidden_size * kv_dim

    @property
    def expert_params(self) -> int:
        """Weights of one SwiGLU expert (gate, up, down)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def dense_mlp_params_per_layer(self) -> int:
        """Dense SwiGLU MLP (gate, up, down) plus, for MoE, the router."""
        router = self.hidden_size * self.num_experts
        return 3 * self.hidden_size * self.intermediate_size + router

    @property
    def params_per_layer(self) -> int:
        """All weights of one layer (every expert counted)."""
        return self.attn_params_per_layer + self.dense_mlp_params_per_layer + self.num_experts * self.expert_params

    @property
    def active_params_per_layer(self) -> int:
        """Weights one token multiplies in one layer (active experts only)."""
        return (
            self.attn_params_per_layer + self.dense_mlp_params_per_layer + self.num_active_experts * self.expert_params
        )

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        """All weights in HBM (Qwen3-14B bf16: 29.5e9 B = 27.5 GiB; REFERENCE.md §5.1 says ≈ 27.6 GiB)."""
        return (self.num_layers * self.params_per_layer + self.embedding_params) * self.dtype_bytes


class HardwareSpec(_Spec):
    """One GPU and its share of the host. Cards in ``scenarios/hardware/`` name their sources.

    Datasheet cards carry ``measured: false``; a calibrated profile (a later issue) sets it true.
    """

    name: str
    source: str = "unspecified"
    measured: bool = False
    hbm_gib: PositiveFloat
    hbm_bandwidth_gbps: PositiveFloat
    bf16_tflops: PositiveFloat  # dense peak
    h2d_bandwidth_gbps: PositiveFloat  # PCIe host→device copy rate for large transfers
    d2h_bandwidth_gbps: PositiveFloat
    h2d_latency_us: Annotated[float, Field(ge=0)]  # fixed cost of one transfer
    host_dram_gib: PositiveFloat  # host DRAM available for offloaded KV
    reserve_gib: Annotated[float, Field(ge=0)]  # HBM kept out of the static pool (activations, graphs)
    h2d_size_table: list[tuple[PositiveInt, PositiveFloat]] | None = None  # measured (size_bytes, gbps)
    d2h_coupling: Annotated[float, Field(ge=0, lt=1)] = 0.0  # H2D slowdown while D2H writes run
    host_gather_threads: PositiveInt = 8  # CPU threads gathering blocks into the staging buffer
    host_gather_gbps_per_thread: PositiveFloat = 12.0  # memcpy rate of one thread
    host_gather_fragment_us: Annotated[float, Field(ge=0)] = 0.2  # per-fragment cost of one thread
    hbm_efficiency: Annotated[float, Field(gt=0, le=1)] = 0.8
    prefill_mfu: Annotated[float, Field(gt=0, le=1)] = 0.6
    decode_step_overhead_us: Annotated[float, Field(ge=0)] = 300.0
    # False where recall copies run on the thread that computes (the CPU engine: the "device" is host memory
    # and every copy is synchronous), so a layer's recall adds to its time instead of overlapping compute.
    io_overlaps_compute: bool = True

    @model_validator(mode="after")
    def _check_table(self) -> HardwareSpec:
        table = self.h2d_size_table
        if table is not None:
            sizes = [size for size, _ in table]
            if len(table) < 2 or sizes != sorted(set(sizes)):
                raise ValueError(f"h2d_size_table needs >= 2 points with rising size_bytes, got sizes {sizes}")
        return self

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def host_dram_bytes(self) -> int:
        return int(self.host_dram_gib * GIB)

    @property
    def reserve_bytes(self) -> int:
        return int(self.reserve_gib * GIB)


class WorkloadSpec(_Spec):
    """Which requests arrive when. ``trace`` is a shipped trace name or a file path; ``synthetic``
    generates Poisson arrivals instead (exactly one of the two).

    ``format`` picks the reader (``traces.FORMATS``; ``auto`` guesses from the name, extension and first
    line); ``csv`` and ``jsonl`` read any file through ``columns``. A session trace (``kvcache_tester``) is
    replayed closed loop with ``sessions`` (defaults if absent); the window and time-scale keys do not apply
    to it (sessions have no shared clock), the prompt-length filter does.
    """

    trace: str | None = "mooncake_conversation"
    format: Literal["auto", "mooncake", "azure", "ragpulse", "kvcache_tester", "burstgpt", "csv", "jsonl"] = "auto"
    columns: ColumnsSpec | None = None  # column mapping for format csv / jsonl
    week: PositiveInt | None = None  # RAGPulse: which week of a multi-week file (each week has its own clock)
    sessions: SessionsSpec | None = None  # closed-loop replay of a session trace
    synthetic: SyntheticSpec | None = None
    start_s: Annotated[float, Field(ge=0)] | None = None  # window on the trace's own clock
    end_s: PositiveFloat | None = None
    max_requests: PositiveInt | None = None
    time_scale: PositiveFloat = 1.0  # > 1 stretches inter-arrival times (lower load)
    target_rate_per_s: PositiveFloat | None = None  # alternative to time_scale
    min_prompt_tokens: PositiveInt | None = None
    max_prompt_tokens: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        if (self.trace is None) == (self.synthetic is None):
            raise ValueError("give exactly one of workload.trace and workload.synthetic")
        if self.target_rate_per_s is not None and self.time_scale != 1.0:
            raise ValueError("give workload.time_scale or workload.target_rate_per_s, not both")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"workload.end_s ({self.end_s}) must be > workload.start_s ({self.start_s})")
        if self.columns is not None and self.format not in ("auto", "csv", "jsonl"):
            raise ValueError(f"workload.columns applies to format csv or jsonl, not {self.format}")
        if self.format in ("csv", "jsonl") and self.columns is None:
            raise ValueError(f"workload.format {self.format} needs workload.columns (arrival, prompt_tokens, ...)")
        if self.synthetic is not None and (self.sessions is not None or self.columns is not None):
            raise ValueError("workload.sessions and workload.columns apply to a trace, not to workload.synthetic")
        return self


class ColumnsSpec(_Spec):
    """Which columns of a generic CSV / JSONL trace hold the arrival time and the token counts."""

    arrival: Annotated[str, Field(min_length=1)]
    arrival_unit: Literal["s", "ms", "us", "datetime"] = "s"  # datetime: seconds since the earliest row
    prompt_tokens: Annotated[str, Field(min_length=1)]
    output_tokens: Annotated[str, Field(min_length=1)]


class SessionsSpec(_Spec):
    """Closed-loop replay of a session trace (``sim/sessions.py``).

    Sessions start at seeded Poisson times (the first at 0 s, mean gap 1 / ``session_rate_per_s``), in the
    trace's session order; at most ``max_concurrent_sessions`` run at once (later starts wait for a free
    slot). Within a session, request k + 1 is issued its ``think_time_s`` after request k finished.
    ``max_sessions`` above the trace's session count replays its sessions again, in order (counted).
    """

    session_rate_per_s: PositiveFloat = 0.05
    max_concurrent_sessions: PositiveInt | None = None  # None = no cap
    max_sessions: PositiveInt | None = None  # first N sessions (more: replayed again); None = each once
    max_think_time_s: Annotated[float, Field(ge=0)] | None = None  # cap recorded pauses (counted); None = as recorded


class SyntheticSpec(_Spec):
    """Poisson arrivals with lognormal prompt and output lengths (mean and coefficient of variation)."""

    num_requests: PositiveInt
    rate_per_s: PositiveFloat
    prompt_tokens_mean: Annotated[float, Field(gt=0, le=10_000_000)]
    output_tokens_mean: Annotated[float, Field(gt=0, le=10_000_000)]
    prompt_tokens_cv: Annotated[float, Field(ge=0, le=10)] = 1.0
    output_tokens_cv: Annotated[float, Field(ge=0, le=10)] = 0.5


class SloSpec(_Spec):
    """Per-request service-level objective; goodput counts requests that meet every set bound."""

    tpot_ms: PositiveFloat | None = 100.0
    ttft_s: PositiveFloat | None = None


class DensePolicy(_Spec):
    """Dense serving, SGLang-like: all KV on the GPU, batch capped by the KV pool (REFERENCE.md §5).

    Shipped preset: ``scenarios/policies/sglang.yaml``.
    """

    kind: Literal["dense"] = "dense"
    block_size: PositiveInt = 1  # SGLang's page_size default is 1 token
    chunked_prefill_tokens: PositiveInt = 8192  # chunked_prefill_size on A100/H100/H200 (§5.2)
    max_running_requests: PositiveInt = 2048
    new_token_ratio_init: Annotated[float, Field(ge=0, le=1)] = 0.7  # §5.2 item 4
    new_token_ratio_min: Annotated[float, Field(ge=0, le=1)] = 0.098
    new_token_ratio_decay_steps: PositiveInt = 600
    clip_max_new_tokens: PositiveInt = 4096

    @model_validator(mode="after")
    def _check_ratio(self) -> DensePolicy:
        if self.new_token_ratio_init < self.new_token_ratio_min:
            raise ValueError(
                f"new_token_ratio_init ({self.new_token_ratio_init}) must be >= new_token_ratio_min "
                f"({self.new_token_ratio_min})"
            )
        return self


class OffloadPolicy(DensePolicy):
    """KV offloading with sparse (or full) recall. Presets in ``scenarios/policies/``: ``full_offload``,
    ``headwise`` and ``pulseinfer`` are this model with different switches.

    Requests with a prompt of at least ``offload_threshold_tokens`` are offloaded: the GPU keeps the sink,
    the recent window, a recall buffer and the block summaries; every other block lives in host DRAM.
    ``selection``: ``solohead`` (one block set per request and layer, DESIGN.md mechanism 1),
    ``headwise`` (each KV head its own set) or ``all`` (recall every offloaded block, FlexGen-like).
    ``io``: ``gather_scatter`` (host gather into a staging buffer, one H2D copy per layer, mechanism 2)
    or ``per_fragment`` (one copy per fragment).
    """

    kind: Literal["offload"] = "offload"
    block_size: PositiveInt = 32
    selection: Literal["solohead", "headwise", "all"] = "solohead"
    io: Literal["gather_scatter", "per_fragment"] = "gather_scatter"
    budget_tokens: PositiveInt = 2048  # attended tokens selected per (request, layer, step)
    sink_tokens: Annotated[int, Field(ge=0)] = 128
    recent_tokens: Annotated[int, Field(ge=0)] = 512
    recall_buffer_blocks: Annotated[int, Field(ge=0)] = 128  # per request and layer (per head: headwise)
    offload_threshold_tokens: PositiveInt = 8192
    max_offloaded_requests: PositiveInt = 256
    miss_rate: Annotated[float, Field(ge=0, le=1)] | None = None  # fixed miss rate instead of recall_stats
    # Mechanism 3, interruptible layer-wise scheduling (sim/interrupt.py); "sequential" = one-layer
    # prefetch, whole-layer FIFO copies (the baseline).
    scheduling: Literal["sequential", "interruptible"] = "sequential"
    lookahead_layers: PositiveInt = 1  # recalls issued this many layers ahead
    # Model assumption: a selection d layers ahead is wrong on late_correction_frac × (d − 1) of its
    # blocks (capped at 1); those are fetched as an urgent correction when the layer is about to run.
    late_correction_frac: Annotated[float, Field(ge=0, le=1)] = 0.05
    chunk_bytes: PositiveInt = 4 * 2**20  # pre-emption granularity of the link
    micro_batches: PositiveInt = 1  # batch split into groups interleaved layer by layer
    # Mechanism 4, IO-adaptive offloading admission (sim/admission.py); "static" = memory only.
    admission: Literal["static", "io_adaptive"] = "static"
    admission_slack: Annotated[float, Field(ge=-0.75, le=2.0)] = 0.1  # initial: recall ≤ compute × (1 + slack)
    stall_target_frac: Annotated[float, Field(gt=0, lt=1)] = 0.05  # AIMD: shrink when a step stalls more
    dense_headroom_frac: Annotated[float, Field(ge=0, le=1)] = 0.25  # run long requests dense while this
    # fraction of the KV pool would stay free after them (io_adaptive only)

    @model_validator(mode="after")
    def _check_blocks(self) -> OffloadPolicy:
        if self.micro_batches > 1 and self.scheduling != "interruptible":
            raise ValueError("micro_batches > 1 needs scheduling: interruptible")
        if self.selection == "all":
            return self
        if self.budget_tokens < self.block_size:
            raise ValueError(f"budget_tokens ({self.budget_tokens}) must be >= block_size ({self.block_size})")
        if self.recall_buffer_blocks * self.block_size < self.budget_tokens:
            raise ValueError(
                f"recall_buffer_blocks × block_size ({self.recall_buffer_blocks * self.block_size} tokens) "
                f"must hold budget_tokens ({self.budget_tokens})"
            )
        return self


PolicySpec = Annotated[DensePolicy | OffloadPolicy, Field(discriminator="kind")]


class RecallStatsSpec(_Spec):
    """How selections change from step to step, per layer (DESIGN.md "Recall model").

    The fraction of a (request, layer)'s selected blocks that changes from one step to the next is drawn
    per (request, layer, step) from a Kumaraswamy(a, b) distribution on [0, 1] whose mean follows
    ``change_mean_by_depth`` (piecewise linear in normalised depth l / (num_layers − 1), so statistics of a
    30-layer model transfer to a 40-layer one). Of the changed-in blocks, ``returning_frac`` were
    selected within the last ``working_set_steps`` steps and hit the recall buffer when it holds that
    working set; the rest are new and always recalled.

    A profile from ``pulseinfer calibrate selection`` replaces these with a real model's measurements
    (calibrate/selection_fit.py), including ``working_set_ratio``, the measured size of the working set.

    Defaults (Model assumption, placeholders until the engine measures them on a real model): the level,
    under 25 % of blocks changing per step, is NOSA's (REFERENCE.md §2.1); ``returning_frac`` 0.5 and the
    12-step window are SparseServe's working-set figures (+10.7 % overlap from 1 to 12 steps, +0.3 % beyond,
    §2.2); the higher change in early layers follows MODEL.md ("layers 0–1 attend diffusely").
    """

    change_mean_by_depth: Annotated[list[tuple[float, float]], Field(min_length=1)] = [
        (0.0, 0.30),
        (0.1, 0.22),
        (1.0, 0.16),
    ]
    change_shape_a: PositiveFloat = 2.0  # Kumaraswamy a; b follows from the mean
    returning_frac: Annotated[float, Field(ge=0, le=1)] = 0.5
    working_set_steps: PositiveInt = 12
    # Measured W / k: distinct blocks selected over the last working_set_steps steps per selected block
    # (`pulseinfer calibrate selection`). None: the model assumption W = k (1 + w · m_l). Selections that flicker
    # among a few blocks have a far smaller working set (SmolLM2, 2K context, budget 512: 1.54 vs 2.7).
    working_set_ratio: Annotated[float, Field(ge=1)] | None = None
    headwise_union_ratio: Annotated[float, Field(ge=1)] | None = None  # measured |∪_h S_h| / k; informational

    @model_validator(mode="after")
    def _check_knots(self) -> RecallStatsSpec:
        depths = [d for d, _ in self.change_mean_by_depth]
        if depths != sorted(depths) or depths[0] < 0 or depths[-1] > 1:
            raise ValueError(f"change_mean_by_depth depths must rise within [0, 1], got {depths}")
        for _, mean in self.change_mean_by_depth:
            if not 0 < mean < 1:
                raise ValueError(f"change_mean_by_depth means must be in (0, 1), got {mean}")
        return self


NonNeg = Annotated[float, Field(ge=0)]


class ComputeProfile(_Spec):
    """Measured decode compute of one model on one device (a linear fit of microbenchmarks).

    Per decoder layer and decode step, for a batch of B requests attending T KV tokens in total::

        layer_s(B, T) = (layer_base_us + layer_per_request_us · B) · 1e-6 + layer_per_token_ns · T · 1e-9

    and after the last layer (embedding, final norm, LM head, sampling, per-step bookkeeping)::

        head_s(B) = (head_base_us + head_per_request_us · B) · 1e-6

    The form is the decode roofline of sim/compute.py made linear: the base is reading the layer's
    weights, the per-token term reading KV, the per-request term the activations. It holds for dense
    models; MoE expert reads (which grow with B non-linearly) are not covered. ``mape_pct`` is the mean
    absolute percentage error of the fit over its ``points`` measurements (calibrate/fit.py).
    """

    model: str  # name of the ModelSpec the measurements ran on; a scenario must use that model
    layer_base_us: NonNeg
    layer_per_request_us: NonNeg
    layer_per_token_ns: NonNeg
    head_base_us: NonNeg
    head_per_request_us: NonNeg
    mape_pct: NonNeg = 0.0
    head_mape_pct: NonNeg = 0.0
    points: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _check_positive(self) -> ComputeProfile:
        if self.layer_base_us + self.layer_per_request_us + self.layer_per_token_ns <= 0:
            raise ValueError(
                "layer_base_us, layer_per_request_us and layer_per_token_ns are all 0: a layer would take no time"
            )
        return self


class SelectionProfile(_Spec):
    """Measured cost of block selection (Quest scores over summaries, top-k), per layer and decode step::

        select_s(C) = (base_us + per_block_ns · C · 1e-3) · 1e-6

    with C the candidate (offloaded) blocks summed over the batch's offloaded requests. When a profile has
    this section, the simulator charges it instead of counting block summaries as attended tokens.
    """

    base_us: NonNeg
    per_block_ns: NonNeg
    mape_pct: NonNeg = 0.0
    points: Annotated[int, Field(ge=0)] = 0

    def seconds(self, candidate_blocks: float) -> float:
        """Selection seconds of one layer for ``candidate_blocks`` blocks in total (0 when there are none)."""
        if candidate_blocks <= 0:
            return 0.0
        return self.base_us * 1e-6 + self.per_block_ns * 1e-9 * candidate_blocks


class Profile(_Spec):
    """A calibrated profile (format and use: sim/profile.py). Sections left out fall back to cards and defaults."""

    name: str = "profile"
    source: str = "unspecified"
    metadata: dict[str, str | int | float | bool | None] = {}
    hardware: HardwareSpec | None = None
    model: ModelSpec | None = None
    compute: ComputeProfile | None = None
    selection: SelectionProfile | None = None
    recall_stats: RecallStatsSpec | None = None
    recall_stats_source: str | None = None

    @model_validator(mode="after")
    def _check_model(self) -> Profile:
        if self.compute is not None and self.model is not None and self.compute.model != self.model.name:
            raise ValueError(
                f"compute.model {self.compute.model!r} differs from model.name {self.model.name!r}: the compute "
                "section must describe the profile's own model"
            )
        return self


class ServingSpec(_Spec):
    """Where prefill runs relative to the simulated decode GPU.

    ``colocated``: the GPU runs prefill and decode itself, SGLang's default (prefill first, chunked).
    ``disaggregated``: prefill runs on ``num_prefill_gpus`` separate GPUs of the same card (FIFO, one
    request at a time each) and finished prefills queue for the decode GPU, as in Mooncake's
    prefill/decode split and SGLang HiSparse's decode-only deployment (REFERENCE.md §5.4). Model
    assumption: KV transfer from the prefill GPU is hidden (layer-wise RDMA) and costs no time.
    ``none``: requests arrive with their prompt's KV already cached and their first token sampled (prefill
    is not simulated) — decode alone, as `pulseinfer validate` runs the engine on pre-filled caches.
    """

    prefill: Literal["colocated", "disaggregated", "none"] = "colocated"
    num_prefill_gpus: PositiveInt = 4


class RunSpec(_Spec):
    """How to run the simulation (not what is simulated)."""

    layer_model: Literal["closed_form", "events"] = "closed_form"
    horizon_s: PositiveFloat | None = None  # stop here; None = until every request is done
    debug_checks: bool = False  # expensive invariant sweeps every step (tests turn it on)
    layer_bin_s: PositiveFloat = 10.0  # time bin of layer_recall.csv (the layer × time heatmap)
    timeline_step: PositiveInt = 200  # timeline.csv shows the N-th decode step that recalls (else the first)
    progress: bool = True


class Scenario(_Spec):
    """A whole experiment: hardware × model × workload × policies, plus SLO and run options."""

    name: str = "scenario"
    seed: Annotated[int, Field(ge=0)] = 0
    model: ModelSpec
    hardware: HardwareSpec
    workload: WorkloadSpec = WorkloadSpec()
    slo: SloSpec = SloSpec()
    serving: ServingSpec = ServingSpec()
    policies: Annotated[list[str], Field(min_length=1)]  # names to run, in order
    policy: dict[str, PolicySpec]  # resolved knobs of every policy in ``policies`` (loader merges presets)
    recall_stats: RecallStatsSpec = RecallStatsSpec()
    profile: Profile | None = None  # calibrated measurements; the loader fills hardware/model/recall_stats from it
    run: RunSpec = RunSpec()

    @model_validator(mode="after")
    def _check_policies(self) -> Scenario:
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies must not repeat a name, got {self.policies}")
        missing = [p for p in self.policies if p not in self.policy]
        if missing:
            raise ValueError(f"policies {missing} have no entry under policy")
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
                f"profile.compute was measured on model {compute.model!r} but the scenario's model is "
                f"{self.model.name!r}; use that model (leave `model` out, or --set model=null, to take the "
                f"profile's) or a profile calibrated with --model {self.model.name}"
            )
        return self


WorkloadSpec.model_rebuild()
