"""Policy section: the knobs of dense (SGLang-like) and offloading policies (presets in ``scenarios/policies/``)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from sim.config.spec import PositiveInt, Spec

# A policy's ``io`` (how a layer's recall crosses to the GPU; costs in sim/step/link.py).
IoMode = Literal["gather_scatter", "per_fragment", "batched", "gpu_gather"]
IO_MODES: tuple[str, ...] = get_args(IoMode)


class DensePolicy(Spec):
    """Dense serving, SGLang-like: all KV on the GPU, batch capped by the KV pool (docs/sources.md §5).

    Shipped preset: ``scenarios/policies/sglang.yaml``.
    """

    kind: Literal["dense"] = "dense"
    block_size: PositiveInt = 1  # SGLang's page_size default is 1 token
    # The scheduler's knobs below default to the engine card's values (sim/config/engine_apply.py): the token budget
    # of one forward (SGLang chunked_prefill_size, vLLM max_num_batched_tokens) and the running-request cap.
    chunked_prefill_tokens: PositiveInt = 8192
    max_running_requests: PositiveInt = 2048
    new_token_ratio_init: Annotated[float, Field(ge=0, le=1)] = 0.7  # §5.2 item 4
    new_token_ratio_min: Annotated[float, Field(ge=0, le=1)] = 0.098
    new_token_ratio_decay_steps: PositiveInt = 600
    clip_max_new_tokens: PositiveInt = 4096
    # Radix prefix cache over the trace's hash_ids (sim/serving/prefix.py): shared prompt prefixes held once;
    # on in the sglang preset, as SGLang's radix cache is on by default (docs/sources.md §5.6).
    prefix_cache: bool = False
    hicache: bool = False  # keep evicted prefix KV in host DRAM and reload it on a hit (needs prefix_cache)
    # HiCache's host-tier bookkeeping on the scheduler's CPU, per prefix-cache node (one hash block of the trace)
    # backed up to, evicted to or reloaded from host DRAM, charged to the next prefill forward
    # (sim/serving/prefix.py). Model assumption: no public per-node figure; 0 = off (docs/sources.md §10.2).
    hicache_node_op_us: Annotated[float, Field(ge=0, le=1000)] = 0.0
    # SGLang's scheduler rules (docs/design.md §10, docs/sources.md §5.7). ``decode_scheduler``: with
    # disaggregated prefill, ``sglang_pd`` admits to the decode batch by SGLang's decode-side budget
    # (sim/serving/decode_admission.py), ``prefill_adder`` by the colocated PrefillAdder reservation.
    decode_scheduler: Literal["prefill_adder", "sglang_pd"] = "prefill_adder"
    num_reserved_decode_tokens: Annotated[int, Field(ge=0)] = 512  # SGLang --num-reserved-decode-tokens
    # What a preempted (retracted) request costs: ``recompute`` (KV freed, prefilled again) or, in a
    # disaggregated deployment, ``swap`` (KV copied to host and loaded back, as SGLang's decode side does).
    retract: Literal["recompute", "swap"] = "recompute"
    # new_token_ratio after a preemption: ``reset`` to the initial value, or SGLang's ``estimate``:
    # min(1, (Σ generated + retract_decode_steps · n) / (Σ max_new_tokens + 1)) over the surviving batch.
    retract_ratio: Literal["reset", "estimate"] = "reset"
    retract_decode_steps: PositiveInt = 20  # SGLANG_RETRACT_DECODE_STEPS
    # Which running request a full pool pre-empts: SGLang's ``fewest_decoded`` (fewest output tokens, then the
    # longest prompt) or vLLM's ``newest`` (the most recently admitted). Default: the engine card's.
    preempt_victim: Literal["fewest_decoded", "newest"] = "fewest_decoded"

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
    ``selection``: ``solohead`` (one block set per request and layer, docs/design.md mechanism 1),
    ``headwise`` (each KV head its own set) or ``all`` (recall every offloaded block, FlexGen-like).
    ``io``: ``gather_scatter`` (host gather into a staging buffer, one H2D copy per layer, mechanism 2),
    ``per_fragment`` (one copy per fragment), ``batched`` (one batched-copy call per layer for all its
    fragments, as ``cudaMemcpyBatchAsync``) or ``gpu_gather`` (a GPU kernel reads the fragments from pinned
    host memory; no staging copy, costs SM time). Costs in sim/step/link.py.
    """

    kind: Literal["offload"] = "offload"
    block_size: PositiveInt = 32
    selection: Literal["solohead", "headwise", "all"] = "solohead"
    io: IoMode = "gather_scatter"
    budget_tokens: PositiveInt = 2048  # attended tokens selected per (request, layer, step)
    sink_tokens: Annotated[int, Field(ge=0)] = 128
    recent_tokens: Annotated[int, Field(ge=0)] = 512
    recall_buffer_blocks: Annotated[int, Field(ge=0)] = 128  # per request and layer (per head: headwise)
    # Where recalled blocks stay on the GPU between steps: a private LRU buffer of recall_buffer_blocks per
    # (request, layer), or one HBM cache per GPU, LRU over (request, layer, block), whose misses rise when the
    # batch's working sets exceed it (sim/step/recall.py ``shared_hit``).
    recall_cache: Literal["per_request", "shared"] = "per_request"
    # Size of the shared cache; None = whatever the KV pool leaves free at each step (after weights, reserve,
    # dense requests, resident windows and summaries), so admitting more requests shrinks it.
    recall_cache_gib: Annotated[float, Field(gt=0)] | None = None
    offload_threshold_tokens: PositiveInt = 8192
    max_offloaded_requests: PositiveInt = 256
    # Fixed fraction of the selection recalled each step, instead of drawing it from recall_stats.
    miss_frac: Annotated[float, Field(ge=0, le=1)] | None = None
    # Mechanism 3, interruptible layer-wise scheduling (sim/step/pipeline.py); "sequential" = one-layer
    # prefetch, whole-layer FIFO copies (the baseline).
    scheduling: Literal["sequential", "interruptible"] = "sequential"
    lookahead_layers: PositiveInt = 1  # recalls issued this many layers ahead
    # Model assumption: a selection d layers ahead is wrong on late_correction_frac × (d − 1) of its
    # blocks (capped at 1); those are fetched as an urgent correction when the layer is about to run.
    late_correction_frac: Annotated[float, Field(ge=0, le=1)] = 0.05
    chunk_bytes: PositiveInt = 4 * 2**20  # pre-emption granularity of the link
    micro_batches: Annotated[int, Field(ge=1, le=64)] = 1  # batch split into groups interleaved layer by layer
    # What a step that recalls pays beyond compute and copies (OffloadServing.step_costs; docs/sources.md §10.1).
    # A decode step that recalls with host-issued copies (every ``io`` but ``gpu_gather``, on a GPU) runs its layers
    # eagerly, as a graph cannot capture data-dependent copies: each layer pays its kernel launches. 28 µs: eager vs
    # CUDA-graph decode of Qwen2.5 measured per layer, 135 vs 107 µs (paiml/realizar issue #201); PyTorch eager
    # with Python dispatch pays ~10× more (vllm-project/vllm-omni issue #7960). Steps that recall nothing keep
    # the graph.
    eager_launch_us_per_layer: Annotated[float, Field(ge=0, le=1000)] = 28.0
    # Model assumption (0 = off): per (layer, micro-batch) that recalls, the compute stream's wait on the copy's
    # event (cudaStreamWaitEvent, or a host sync).
    event_wait_us: Annotated[float, Field(ge=0, le=1000)] = 0.0
    # Selection (Quest scores over the block summaries, then top-k), per layer and micro-batch group with C
    # candidate blocks: selection_launch_us + selection_per_block_ns · C (sim/config/measured.py
    # SelectionProfile; a profile's measured ``selection`` section replaces both). Model assumption (0 = off):
    # Quest (arXiv 2406.10774) and ShadowKV (arXiv 2410.21465) report selection as a small share of decode
    # without a per-block figure. Block summaries count as attended tokens unless a profile measured selection.
    selection_launch_us: Annotated[float, Field(ge=0, le=1000)] = 0.0
    selection_per_block_ns: Annotated[float, Field(ge=0, le=1000)] = 0.0
    # Mechanism 4, IO-adaptive offloading admission (sim/serving/admission.py); "static" = memory only.
    admission: Literal["static", "io_adaptive"] = "static"
    admission_slack: Annotated[float, Field(ge=-0.75, le=2.0)] = 0.1  # initial: recall ≤ compute × (1 + slack)
    stall_target_frac: Annotated[float, Field(gt=0, lt=1)] = 0.05  # AIMD: shrink when a step stalls more
    dense_headroom_frac: Annotated[float, Field(ge=0, le=1)] = 0.25  # run long requests dense while this
    # fraction of the KV pool would stay free after them (io_adaptive only)

    @model_validator(mode="after")
    def _check_blocks(self) -> OffloadPolicy:
        if self.prefix_cache:
            raise ValueError("prefix_cache is modelled for dense policies only (kind: dense); set it false")
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
