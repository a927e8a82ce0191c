"""Model and hardware cards: the transformer's shape and one GPU with its share of the host.

Shipped cards live in ``scenarios/models/`` and ``scenarios/hardware/`` and name their sources. Derived
quantities (KV bytes per token, weight bytes) are properties computed from the fields, never hard-coded.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.config.files import short_repr
from sim.config.spec import DTYPE_BYTES, GIB, PositiveFloat, PositiveInt, Spec


class ModelSpec(Spec):
    """Transformer shape (one model card). Source of each card is named in its YAML file.

    MoE models set ``num_experts``/``num_active_experts``/``expert_intermediate_size``; their dense
    ``intermediate_size`` is 0. Norms and biases are ignored in parameter counts (< 0.1 % of weights).
    """

    name: str
    num_layers: Annotated[int, Field(ge=1, le=10_000)]  # the deepest real models have ~100-200
    hidden_size: PositiveInt
    num_heads: PositiveInt  # query heads
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: Annotated[int, Field(ge=0)]  # dense SwiGLU MLP width; 0 for all-MoE models
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    max_seq_len: Annotated[int, Field(ge=1, le=100_000_000)] = 131072  # longest context served (prompt + output)
    dtype: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"  # the weights' dtype (fp8: FP8 GEMMs at the FP8 peak)
    kv_dtype: Literal["bf16", "fp16", "fp8", "fp32"] | None = None  # the KV cache's dtype; None: the weights' dtype
    num_experts: Annotated[int, Field(ge=0)] = 0
    num_active_experts: Annotated[int, Field(ge=0)] = 0
    expert_intermediate_size: Annotated[int, Field(ge=0)] = 0
    num_shared_experts: Annotated[int, Field(ge=0)] = 0  # experts every token passes (DeepSeek, Qwen2-MoE)
    shared_expert_intermediate_size: Annotated[int, Field(ge=0)] = 0  # one shared expert's width
    first_dense_layers: Annotated[int, Field(ge=0)] = 0  # leading layers with the dense MLP (first_k_dense_replace)
    # Multi-head latent attention (DeepSeek-V2/V3; 0: none): one compressed KV latent per token and layer
    # (kv_lora_rank + qk_rope_head_dim elements) shared by every head; head_dim = qk_nope + qk_rope.
    kv_lora_rank: Annotated[int, Field(ge=0)] = 0
    q_lora_rank: Annotated[int, Field(ge=0)] = 0
    qk_rope_head_dim: Annotated[int, Field(ge=0)] = 0
    v_head_dim: Annotated[int, Field(ge=0)] = 0
    mla_cache: bool = True  # the engine caches the latent (its card's mla_cache); False: padded per-head K and V

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
        if self.first_dense_layers and not (self.num_experts and self.intermediate_size):
            raise ValueError("first_dense_layers needs an MoE model with a dense intermediate_size > 0")
        if self.first_dense_layers >= self.num_layers:
            raise ValueError(
                f"first_dense_layers must be < num_layers={self.num_layers}, got {self.first_dense_layers}"
            )
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.v_head_dim):
            raise ValueError("an MLA model (kv_lora_rank > 0) needs qk_rope_head_dim and v_head_dim > 0")
        return self

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def mla_padded_head_dim(self) -> int:
        """An engine that expands MLA (``mla_cache`` false) stores per-head K and V padded to the next power of two
        of the larger head dimension for its attention kernel (DeepSeek: qk 192, v 128 → 256; vLLM 0.5's
        deepseek_v2)."""
        return 1 << (max(self.head_dim, self.v_head_dim) - 1).bit_length()

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one weight."""
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one K or V element (``kv_dtype``, else the weights' dtype)."""
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation element: 16-bit, or 32-bit for fp32 models (FP8 models keep BF16 activations)."""
        return 4 if self.dtype == "fp32" else 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """K and V of one token in one layer: 2 × num_kv_heads × head_dim × KV dtype bytes; MLA: one latent of
        kv_lora_rank + qk_rope_head_dim elements (DeepSeek-V3: 576 × 2 B), whatever the heads or tensor parallelism."""
        if self.is_mla:
            per_token = self.kv_lora_rank + self.qk_rope_head_dim
            return (
                per_token if self.mla_cache else 2 * self.num_heads * self.mla_padded_head_dim
            ) * self.kv_dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers (docs/sources.md §4: 160 KiB for Qwen3-14B)."""
        return self.kv_bytes_per_token_per_layer * self.num_layers

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and O projection weights of one layer; MLA: the low-rank Q (when q_lora_rank), the KV down-projection
        (latent and rotary key), the per-head up-projections of the latent to keys and values, and O."""
        if self.is_mla:
            h, heads, q = self.hidden_size, self.num_heads, self.q_lora_rank
            q_params = h * q + q * heads * self.head_dim if q else h * heads * self.head_dim
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            up = self.kv_lora_rank * heads * (self.head_dim - self.qk_rope_head_dim + self.v_head_dim)
            return q_params + kv + up + heads * self.v_head_dim * h
        q_dim = self.num_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        return 2 * self.hidden_size * q_dim + 2 * self.hidden_size * kv_dim

    @property
    def expert_params(self) -> int:
        """Weights of one SwiGLU expert (gate, up, down)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def dense_mlp_params_per_layer(self) -> int:
        """The MLP weights every token of a layer reads, averaged over layers: a dense model's SwiGLU MLP (gate, up,
        down); an MoE layer's router and shared experts, with the leading ``first_dense_layers`` dense MLPs."""
        if not self.num_experts:
            return 3 * self.hidden_size * self.intermediate_size
        return (self.first_dense_layers * self.dense_layer_mlp_params + self.moe_layers * self.moe_shared_params) / (
            self.num_layers
        )

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (0 for a dense model)."""
        return self.num_layers - self.first_dense_layers if self.num_experts else 0

    @property
    def dense_layer_mlp_params(self) -> int:
        """One dense SwiGLU MLP (gate, up, down) of ``intermediate_size``."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def moe_shared_params(self) -> int:
        """What every token of an MoE layer reads besides its routed experts: the router and the shared experts."""
        shared = 3 * self.hidden_size * self.shared_expert_intermediate_size * self.num_shared_experts
        return self.hidden_size * self.num_experts + shared

    @property
    def params_per_layer(self) -> float:
        """All weights of one layer, averaged over layers (every routed expert counted)."""
        experts = self.moe_layers * self.num_experts * self.expert_params / self.num_layers
        return self.attn_params_per_layer + self.dense_mlp_params_per_layer + experts

    @property
    def active_params_per_layer(self) -> float:
        """Weights one token multiplies in one layer, averaged over layers (active routed experts only)."""
        experts = self.moe_layers * self.num_active_experts * self.expert_params / self.num_layers
        return self.attn_params_per_layer + self.dense_mlp_params_per_layer + experts

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        """All weights in HBM (Qwen3-14B bf16: 29.5e9 B = 27.5 GiB; docs/sources.md §5.1 says ≈ 27.6 GiB)."""
        return round(self.num_layers * self.params_per_layer + self.embedding_params) * self.dtype_bytes


class HardwareSpec(Spec):
    """One GPU and its share of the host. Cards in ``scenarios/hardware/`` name their sources.

    Datasheet cards carry ``measured: false``; a calibrated profile (``pulseinfer calibrate``) sets it true.
    """

    name: str
    source: str = "unspecified"
    measured: bool = False
    hbm_gib: PositiveFloat
    hbm_bandwidth_gbps: PositiveFloat
    bf16_tflops: PositiveFloat  # dense peak
    fp8_tflops: PositiveFloat | None = None  # dense FP8 peak (datasheet); None: no FP8 tensor cores (BF16 GEMMs)
    h2d_bandwidth_gbps: PositiveFloat  # PCIe host→device copy rate for large transfers
    d2h_bandwidth_gbps: PositiveFloat
    h2d_latency_us: Annotated[float, Field(ge=0)]  # fixed cost of one transfer (per-descriptor DMA, pipelined)
    # Host-side cost of issuing one cudaMemcpyAsync, serial on the issuing thread: a loop of small copies runs at
    # most one copy per h2d_call_us (io: per_fragment). H100: 3.45-3.98 µs per call (torchcomms PR #2195,
    # docs/sources.md §3.3).
    h2d_call_us: Annotated[float, Field(ge=0)] = 3.7
    host_dram_gib: PositiveFloat  # host DRAM available for offloaded KV
    # HBM per GPU that is neither weights nor KV pool (activations, CUDA graphs, context): the engine card's memory
    # rule fills it when the card leaves it out (sim/config/engine_apply.py); set it to override the engine.
    reserve_gib: Annotated[float, Field(ge=0)] | None = None
    h2d_size_table: list[tuple[PositiveInt, PositiveFloat]] | None = None  # measured (size_bytes, gbps)
    d2h_coupling: Annotated[float, Field(ge=0, lt=1)] = 0.0  # H2D slowdown while D2H writes run
    host_gather_threads: Annotated[int, Field(ge=1, le=4096)] = 8  # CPU threads gathering into the staging buffer
    host_gather_gbps_per_thread: PositiveFloat = 12.0  # memcpy rate of one thread
    host_gather_fragment_us: Annotated[float, Field(ge=0)] = 0.2  # per-fragment cost of one thread
    # io: batched (one cudaMemcpyBatchAsync-style call per layer): t = call + N · entry + bytes / BW
    # (docs/sources.md §3.3: torchcomms PR #2195 measures 2.23-2.53 µs per entry on H100; vLLM PR #40549 ~2.6).
    h2d_batch_call_us: Annotated[float, Field(ge=0)] = 5.0  # one call's submission (5-7 µs per call, §3.3)
    h2d_batch_entry_us: Annotated[float, Field(ge=0)] = 2.4  # per fragment inside the call
    # io: gpu_gather (a kernel on the GPU reads pinned host memory over UVA): t = launch + (bytes + N · half) / BW,
    # i.e. a fragment of s bytes runs at BW · s / (s + half). SparseServe FlashH2D > 20 GB/s on Gen4 for 4-32
    # token blocks; SM-driven H2D ~35 GB/s on Hopper Gen5 (nvbandwidth issue #24); docs/sources.md §3.2.
    gpu_gather_gbps: PositiveFloat = 35.0
    gpu_gather_launch_us: Annotated[float, Field(ge=0)] = 5.0  # one kernel launch (§3.3: ~5-10 µs)
    gpu_gather_half_bytes: Annotated[float, Field(ge=0, le=1e9)] = 128.0  # fragment size at half of gpu_gather_gbps
    # Model assumption: while the kernel runs it holds this fraction of the SMs, so the layer computing
    # beside it is slowed by gpu_gather_sm_frac × the overlap (sim/policies/offload.py).
    gpu_gather_sm_frac: Annotated[float, Field(ge=0, lt=1)] = 0.1
    # The compute model's efficiencies (sim/step/compute.py; fitted by `pulseinfer calibrate serving`, bounds in
    # calibrate/serving_fit.py, docs/sources.md §11): a large kernel's share of the HBM peak, the bytes at which a
    # kernel reaches half of it, attention's share relative to that and the context per request at which it reaches
    # half, grouped-GEMM (MoE expert) efficiency, the GEMMs' share of the tensor peak, the host cost of a decode step
    # (CUDA graph) and of each request in it (sampling, detokenisation, scheduling), and the per-call cost of an
    # all-reduce.
    hbm_efficiency: Annotated[float, Field(ge=0.01, le=1)] = 0.8
    hbm_half_bytes: Annotated[float, Field(ge=0, le=1e9)] = 0.0
    attn_efficiency: Annotated[float, Field(ge=0.01, le=1)] = 1.0
    attn_half_tokens: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    moe_efficiency: Annotated[float, Field(ge=0.01, le=1)] = 1.0
    # Kernel physics (sim/step/compute.py): the bytes at which one expert's share of a grouped GEMM reaches half of
    # the HBM roofline, the fixed cost of an MoE layer's routing and permutation, the split-KV work tiles per SM at
    # which decode attention fills the GPU to half, and FP8-KV attention's share relative to BF16 (dequantisation).
    moe_half_bytes: Annotated[float, Field(ge=0, le=1e10)] = 0.0
    moe_layer_us: Annotated[float, Field(ge=0, le=1e4)] = 0.0
    attn_half_tiles: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    attn_fp8_efficiency: Annotated[float, Field(ge=0.01, le=1)] = 1.0
    # The GPU architecture (its prefill efficiency is fitted per architecture) and streaming multiprocessors.
    arch: Literal["ampere", "ada", "hopper", "blackwell", "other"] = "other"
    sm_count: Annotated[int, Field(gt=0, le=1024)] = 132
    prefill_mfu: Annotated[float, Field(ge=0.01, le=1)] = 0.6
    # Prefill's other kernels (sim/step/compute.py; fitted like the above, docs/sources.md §11): FP8 GEMMs' share of
    # the FP8 peak and attention's (FlashAttention) share of the BF16 peak (None: prefill_mfu; both also bound decode
    # GEMMs and attention where those are compute-bound), and the
    # activation passes of a prefill token per layer in the memory-bound kernels between the GEMMs (norms, rotary,
    # activation, residual adds: reads and writes of hidden-size vectors at the HBM roofline; 0: free).
    fp8_mfu: Annotated[float, Field(ge=0.01, le=1)] | None = None
    attn_mfu: Annotated[float, Field(ge=0.01, le=1)] | None = None
    prefill_act_passes: Annotated[float, Field(ge=0, le=1000)] = 0.0
    decode_step_overhead_us: Annotated[float, Field(ge=0)] = 300.0
    decode_request_overhead_us: Annotated[float, Field(ge=0, le=1e4)] = 0.0  # per request per step (CPU)
    allreduce_call_us: Annotated[float, Field(ge=0, le=1e4)] = 0.0
    # False where recall copies run on the thread that computes (the CPU engine: the "device" is host memory
    # and every copy is synchronous), so a layer's recall adds to its time instead of overlapping compute.
    io_overlaps_compute: bool = True
    # Multi-GPU node (tensor parallelism, sim/config/parallel.py): GPU↔GPU link per direction and per-step
    # latency of a ring all-reduce; None on a card that cannot run tp_size > 1.
    nvlink_bandwidth_gbps: PositiveFloat | None = None
    nvlink_latency_us: Annotated[float, Field(ge=0)] = 1.0
    gpus_per_node: Annotated[int, Field(ge=1, le=1024)] = 8
    gpus_per_pcie_switch: Annotated[int, Field(ge=1, le=1024)] = 1  # GPUs sharing one host uplink of h2d_bandwidth_gbps
    gpus_per_socket: Annotated[int, Field(ge=1, le=1024)] = 4  # GPUs whose host gather reads one CPU socket's DRAM
    host_dram_gbps_per_socket: PositiveFloat | None = None  # None: gather never limited by DRAM bandwidth
    # Node-level host sharing (sim/config/parallel.py host_share). A PCIe switch's uplink to the host, per
    # direction, shared by the recalling GPUs behind it; None: the GPU's own h2d/d2h rate (model assumption: the
    # uplink is an x16 link of the GPU's generation, as each GPU's own). GBPS bounds: sim/config/checks.py.
    pcie_uplink_gbps: PositiveFloat | None = None
    # Replicas of this GPU's node that recall at the same time, its own included (model assumption, worst case:
    # they all recall at once). A fleet of N > 1 replicas (sim/serving/fleet.py) sets it from its placement; 1: alone.
    replicas_sharing_node: Annotated[int, Field(ge=1, le=64)] = 1

    @model_validator(mode="after")
    def _check_table(self) -> HardwareSpec:
        table = self.h2d_size_table
        if table is not None:
            sizes = [size for size, _ in table]
            if len(table) < 2 or sizes != sorted(set(sizes)):
                raise ValueError(
                    f"h2d_size_table needs >= 2 points with rising size_bytes, got sizes {short_repr(sizes)}"
                )
        return self

    @property
    def fp8_gemm_mfu(self) -> float:
        """FP8 GEMMs' share of the FP8 peak: ``fp8_mfu``, unset ``prefill_mfu``."""
        return self.prefill_mfu if self.fp8_mfu is None else self.fp8_mfu

    @property
    def attention_mfu(self) -> float:
        """Attention FLOPs' share of the BF16 peak: ``attn_mfu``, unset ``prefill_mfu``."""
        return self.prefill_mfu if self.attn_mfu is None else self.attn_mfu

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def host_dram_bytes(self) -> int:
        return int(self.host_dram_gib * GIB)

    @property
    def reserve_bytes(self) -> int:
        """``reserve_gib`` in bytes.

        Raises:
            ValueError: when no engine card resolved it (a card validated outside :func:`load_scenario`).
        """
        if self.reserve_gib is None:
            raise ValueError(f"hardware {self.name}: reserve_gib is unset; load the scenario so the engine sets it")
        return int(self.reserve_gib * GIB)
