"""GPU compute-time model: decode layers as memory-bound kernels with size-dependent efficiency, prefill as FLOPs.

Decode, one layer, batch of B requests attending T tokens in total (sum over the batch); B' the CUDA-graph batch::

    shared = max((W_shared + n_gemm · H) / (BW · η_hbm), 2 · B' · P_shared / (peak_w · mfu_w))
    experts = E_t(B') · max((W_expert + H_moe) / (BW · η_hbm · η_moe), 2 · (B'·k / E_t) · P_expert / (peak_w · mfu_w))
              + t_route                                                                   (MoE layers only)
    attn   = max(kv_bytes_per_token_per_layer · (T + B · h_attn) / (BW · η_hbm · η_attn · η_kv · fill),
                 attn_flops_per_token · T / (peak_bf16 · mfu_attn))
    layer  = shared + (share of MoE layers) · experts + attn + 2 · (all-reduce of B tokens' activations + c_ar)

``W_shared``/``P_shared``: what every token reads — attention projections and the dense MLP, or an MoE layer's
router and shared experts (a model's leading ``first_dense_layers`` count their dense MLP; sim/config/cards.py
averages over layers) —, read by ``n_gemm`` GEMMs (4 dense, 3 MoE, 5 with shared experts). A kernel that reads b
bytes runs at ``η_hbm · b / (b + H)`` of the HBM peak (``hbm_efficiency``, ``hbm_half_bytes``: launch and tail
effects), the same as reading H extra bytes.

MoE (``num_experts`` E, ``num_active_experts`` k): the B' tokens' top-k choices touch ``E_t(B') = E · (1 − (1 −
k/E)^B')`` distinct experts (uniform routing), each read once by the grouped GEMM and given B'·k/E_t tokens; an
expert's GEMMs take their weight read — with ``moe_half_bytes`` H_moe for the grouped kernel's per-expert tile and
launch overhead, so a small expert (Qwen3-30B-A3B: 9.4 MB; a 235B expert split eight ways: 4.7 MB) runs below the
roofline and a large one (Mixtral: 352 MB) near it — or their FLOPs at the GEMM peak, whichever is longer; the
layer adds its routing, top-k and token permutation ``moe_layer_us`` t_route. Tensor parallelism splits each expert's
width (sim/config/parallel.py); expert parallelism is not modelled.

Decode attention: a request reads its KV (MLA: one latent of ``kv_lora_rank + qk_rope_head_dim`` elements per
token and layer, sim/config/cards.py) at ``η_attn`` of the roofline, plus ``attn_half_tokens`` h_attn tokens' worth
per request (short contexts cannot fill a kernel); FP8 KV at ``attn_fp8_efficiency`` η_kv of that (dequantisation);
and split-KV work tiles fill the GPU: ``fill = tiles / (tiles + attn_half_tiles · sm_count)``, tiles = B · KV heads
(1 for MLA) · ⌈T / (B · 256)⌉ — flash-decoding splits a request's KV into 256-token chunks (:data:`ATTN_SPLIT_TOKENS`),
so a small batch with few KV heads per GPU (a 70B model at TP8: one) fills little of it. The FLOPs side holds for
large GQA groups and MLA (absorbed: ``heads · (4 · kv_lora_rank + 2 · qk_rope_head_dim)`` per KV token; else
``4 · heads · head_dim``). GEMMs run at the weights' dtype peak times its efficiency (``fp8_tflops`` × ``fp8_mfu``
for FP8 weights on a card with FP8 tensor cores, else ``bf16_tflops`` × ``prefill_mfu``, fitted per GPU
architecture); attention FLOPs at the BF16 peak × ``attn_mfu``.
Sources: the bandwidth roofline of docs/sources.md §6 item 5; peaks, bandwidth and SM counts from the hardware
card; every efficiency and cost above fitted to public serving measurements by ``pulseinfer calibrate serving``
(docs/sources.md §11, §13; cross-validated by ``pulseinfer cases --suite serving --cv``). With H = H_moe = h_attn =
t_route = attn_half_tiles = 0 and every η = 1 this is a plain bandwidth roofline.

Each decode step adds the serving engine's serial host cost (sim/config/engine.py ``EngineSpec``: ``step_serial_us``,
else the card's ``decode_step_overhead_us``: scheduler and launches of a CUDA-graph step; timed by
sim/step/pipeline.py before layer 0) and, after the last layer, the LM head ``max((lm_head_bytes + H) / (BW · η_hbm),
2·B·V·hidden / (peak_w · mfu_w))`` plus ``B · request_serial_us`` (else the card's ``decode_request_overhead_us``: each
request's host work done in series with the GPU). The engine's overlapped host work ``B · request_overlapped_us``
(:meth:`ComputeModel.overlapped_host_s`: detokenisation and streaming in another process, an overlap scheduler)
does not add: the step lasts max(serial step, overlapped host work), applied where steps are timed
(sim/step/pipeline.py ``host_bound_s``), so a host-bound engine's small-GPU-work, large-batch steps stretch while
large-GPU-work steps do not notice (docs/sources.md §11).

CUDA graphs: a decode step of B requests runs its GEMMs and LM head at the engine's next captured batch size ≥ B
(:meth:`ComputeModel.padded_batch`; B itself above the largest captured size or on an engine without graphs), so
the compute-bound terms above use the padded B; the weight reads do not change.

Prefill, one forward over chunks (c new tokens after p cached tokens each)::

    flops = Σ [2 · c · L · P_active_layer] / (peak_w · mfu_w) + Σ [a · L · (c·p + c·(c+1)/2)] / (peak_bf16 · mfu_attn)
            + 2 · hidden · vocab / (peak_w · mfu_w) per request whose prompt completes
            + Σ c · L · passes · hidden · activation_bytes / (BW · η_hbm) + L_moe · t_route
    time  = max(flops, weight_bytes / (BW · η_hbm)) + L · 2 · all-reduce of the chunk tokens (tp_size > 1)

with a = 4 · heads · head_dim FLOPs per query-key pair (MLA, computed per head: 2 · heads · (qk + v head dims)).
The last term is the memory-bound kernels between the GEMMs (RMSNorm, rotary, SiLU-and-multiply, residual adds):
``prefill_act_passes`` reads and writes of a hidden-size activation per token and layer, at the HBM roofline. It
makes a compute-poor, bandwidth-rich card (H20: 148 TFLOP/s, 4 TB/s) reach a larger share of its tensor peak in
prefill than a compute-rich one (H100: 989 TFLOP/s, 3.35 TB/s), as the roofline says it should.

A prefill chunk that rides in a decode step (``serving.mixed_prefill``) adds only its FLOPs and all-reduces
(:meth:`ComputeModel.prefill_extra_s`): the step reads the weights anyway.

Tensor parallelism (``serving.tp_size`` = n > 1): the model handed in is one GPU's shard
(sim/config/parallel.py ``shard_model``), so the formulas above give one GPU's time; each layer adds two ring
all-reduces of the layer's activations, ``tokens · hidden_size · 2`` bytes (``parallel.allreduce_s``: 2(n−1)/n ·
bytes / nvlink bandwidth + 2(n−1) · nvlink_latency_us), each plus a per-call cost c_ar = ``allreduce_call_us``
(launch and synchronisation), not overlapped with compute (Model assumption).

Calibrated on the project's own engine: with a profile's ``compute`` section (sim/config/measured.py
``ComputeProfile``, fitted by calibrate/fit.py from the engine's decode steps) the decode layer and the LM head take
the measured linear forms instead, and the per-step overhead is part of the measured head time.
"""

from __future__ import annotations

import bisect

import numpy as np

from sim.config import DEFAULT_ENGINE, ComputeProfile, EngineSpec, HardwareSpec, ModelSpec
from sim.config.parallel import allreduce_s

ATTN_SPLIT_TOKENS = 256  # split-KV chunk of decode attention (FlashInfer / flash-decoding split a request's KV)


class ComputeModel:
    """Decode-layer and prefill times in seconds for one model on one GPU (of a tensor-parallel group).

    Args:
        model: the model card; with ``tp_size`` > 1, one GPU's shard (``sim.config.parallel.shard_model``).
        hardware: the GPU card (bandwidth, peak, efficiencies, per-step overhead, NVLink for ``tp_size`` > 1).
        profile: measured decode compute for this model (replaces the decode roofline), or None.
        tp_size: GPUs of the tensor-parallel group (adds the all-reduces when > 1).
        engine: the serving engine's host path (serial and overlapped host costs); default: the card's serial
            costs, nothing overlapped.
    """

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        profile: ComputeProfile | None = None,
        tp_size: int = 1,
        engine: EngineSpec = DEFAULT_ENGINE,
    ) -> None:
        db = model.dtype_bytes
        hw = hardware
        self.tp_size = tp_size
        self.activation_bytes_per_token = model.hidden_size * model.activation_bytes
        self.nvlink_gbps = hw.nvlink_bandwidth_gbps or 0.0
        self.nvlink_latency_us = hw.nvlink_latency_us
        self.allreduce_call_s = hw.allreduce_call_us * 1e-6
        self.num_layers = model.num_layers
        self.bandwidth_bps = hw.hbm_bandwidth_gbps * 1e9 * hw.hbm_efficiency
        self.half_bytes = hw.hbm_half_bytes
        self.attn_bandwidth_bps = self.bandwidth_bps * hw.attn_efficiency
        self.attn_half_tokens = hw.attn_half_tokens
        self.expert_bandwidth_bps = self.bandwidth_bps * hw.moe_efficiency
        self.attn_half_tiles = hw.attn_half_tiles * hw.sm_count  # per SM on the card
        latent = model.is_mla and model.mla_cache
        self.kv_heads = 1 if latent else model.num_kv_heads  # split-KV tiles per request and split
        if (model.kv_dtype or model.dtype) == "fp8":
            self.attn_bandwidth_bps *= hw.attn_fp8_efficiency
        fp8 = model.dtype == "fp8" and hw.fp8_tflops is not None
        gemm_mfu = hw.fp8_gemm_mfu if fp8 else hw.prefill_mfu
        self.flops_per_s = (hw.fp8_tflops if fp8 else hw.bf16_tflops) * 1e12 * gemm_mfu  # GEMMs
        self.attn_flops_per_s = hw.bf16_tflops * 1e12 * hw.attention_mfu
        self.prefill_token_layer_s = hw.prefill_act_passes * self.activation_bytes_per_token / self.bandwidth_bps
        self.kv_bytes_per_token_per_layer = model.kv_bytes_per_token_per_layer
        heads = model.num_heads
        if model.is_mla:  # decode: absorbed (scores over latent + rotary, values over the latent); prefill: per head
            self.prefill_attn_flops_per_pair = 2 * heads * (model.head_dim + model.v_head_dim)
            self.attn_flops_per_token = (
                heads * (4 * model.kv_lora_rank + 2 * model.qk_rope_head_dim)
                if latent
                else self.prefill_attn_flops_per_pair
            )
        else:
            self.attn_flops_per_token = self.prefill_attn_flops_per_pair = 4 * heads * model.head_dim
        self.num_experts = model.num_experts
        self.num_active_experts = model.num_active_experts
        # QKV, O, gate-up, down per dense layer; QKV, O, router (and a shared expert's two) per MoE layer
        gemms = 4 if not model.num_experts else (5 if model.num_shared_experts else 3)
        self.shared_weight_bytes_layer = (model.attn_params_per_layer + model.dense_mlp_params_per_layer) * db
        self.shared_read_bytes = self.shared_weight_bytes_layer + gemms * self.half_bytes
        self.moe_share = model.moe_layers / model.num_layers  # share of layers with routed experts
        self.expert_params = model.expert_params
        self.expert_read_bytes = model.expert_params * db + hw.moe_half_bytes
        self.moe_layer_s = hw.moe_layer_us * 1e-6
        self.active_params_layer = model.active_params_per_layer
        self.lm_head_params = model.vocab_size * model.hidden_size
        self.lm_head_bytes = self.lm_head_params * db
        self.weight_bytes = model.weight_bytes
        self.step_overhead_s = engine.step_serial_us_on(hw) * 1e-6
        self.request_overhead_s = engine.request_serial_us_on(hw) * 1e-6
        self.overlapped_request_s = engine.request_overlapped_us * 1e-6
        sizes = engine.graph_batches(hw.hbm_gib, hw.name)  # CUDA graphs: a batch's GEMMs run at the next size
        self._padded = [sizes[bisect.bisect_left(sizes, b)] for b in range(sizes[-1] + 1)] if sizes else []
        self.profile = profile
        if profile is not None:
            self.step_overhead_s = 0.0  # measured inside head_s
            self._layer = (
                profile.layer_base_us * 1e-6,
                profile.layer_per_request_us * 1e-6,
                profile.layer_per_token_ns * 1e-9,
            )
            self._head = (profile.head_base_us * 1e-6, profile.head_per_request_us * 1e-6)

    def overlapped_host_s(self, batch_size: int) -> float:
        """The engine's host work of one decode step of ``batch_size`` requests that overlaps the GPU step, seconds:
        the step lasts at least this long (sim/step/pipeline.py ``host_bound_s``); 0 when the engine overlaps nothing.
        """
        return batch_size * self.overlapped_request_s

    def experts_touched(self, batch_size: int) -> float:
        """Expected distinct experts per MoE layer for ``batch_size`` tokens (0 for dense models)."""
        if not self.num_experts:
            return 0.0
        e, k = self.num_experts, self.num_active_experts
        return e * (1.0 - (1.0 - k / e) ** batch_size)

    def experts_s(self, tokens: int) -> float:
        """One MoE layer's routed experts for ``tokens`` tokens, seconds: each touched expert's GEMMs at its share of
        the tokens — its weight read (plus ``moe_half_bytes``) at the HBM roofline, or its FLOPs at the GEMM peak,
        whichever is longer — plus the layer's routing and permutation (``moe_layer_us``)."""
        touched = self.experts_touched(tokens)
        if not touched:
            return 0.0
        per_expert_flops = 2 * tokens * self.num_active_experts / touched * self.expert_params
        one_s = max(self.expert_read_bytes / self.expert_bandwidth_bps, per_expert_flops / self.flops_per_s)
        return touched * one_s + self.moe_layer_s

    def allreduce_layer_s(self, tokens: int) -> float:
        """The two all-reduces of one layer over ``tokens`` tokens' activations, each with its per-call cost
        (0 at ``tp_size`` 1)."""
        if self.tp_size == 1:
            return 0.0
        nbytes = tokens * self.activation_bytes_per_token
        one_s = allreduce_s(nbytes, self.tp_size, self.nvlink_gbps, self.nvlink_latency_us)
        return 2.0 * (one_s + self.allreduce_call_s)

    def padded_batch(self, batch_size: int) -> int:
        """The batch the step's GEMMs run at (the engine's next CUDA-graph size; sim/config/engine.py)."""
        return self._padded[batch_size] if batch_size < len(self._padded) else batch_size

    def decode_layer_s(self, batch_size: int, attended_tokens: int | np.ndarray) -> float | np.ndarray:
        """One decoder layer of one decode step, or of k steps of one batch size at once (numpy broadcasting: the
        same float operations in the same order, so each step's time is the one a scalar call gives).

        Args:
            batch_size: requests in the step (one new token each), ≥ 1.
            attended_tokens: KV tokens read by attention, summed over the batch: an int, or int64 [k] for k steps
                (block summaries read by selection count as tokens: one summary is the size of one token's K and V).

        Returns:
            Seconds: a float, or float64 [k] (module docstring's formula).
        """
        if self.profile is not None:
            base, per_request, per_token = self._layer
            return (base + per_request * batch_size) + per_token * attended_tokens
        gemm_s = self._gemm_s(batch_size)
        requests = max(batch_size, 1)  # an empty micro-batch group reads nothing
        chunk = requests * ATTN_SPLIT_TOKENS
        splits = (attended_tokens + chunk - 1) // chunk  # split-KV chunks of a mean request
        splits = np.maximum(splits, 1) if isinstance(splits, np.ndarray) else max(splits, 1)
        tiles = requests * self.kv_heads * splits
        fill = tiles / (tiles + self.attn_half_tiles)  # the share of the GPU the work tiles fill
        memory_s = (attended_tokens + batch_size * self.attn_half_tokens) * (
            self.kv_bytes_per_token_per_layer / (self.attn_bandwidth_bps * fill)
        )
        flops_s = self.attn_flops_per_token * attended_tokens / self.attn_flops_per_s
        attn_s = np.maximum(memory_s, flops_s) if isinstance(memory_s, np.ndarray) else max(memory_s, flops_s)
        if self.tp_size > 1:
            return (gemm_s + attn_s) + self.allreduce_layer_s(batch_size)
        return gemm_s + attn_s

    def _gemm_s(self, batch_size: int) -> float:
        padded = self.padded_batch(batch_size)
        shared_flops = (
            2 * padded * (self.active_params_layer - self.moe_share * self.num_active_experts * self.expert_params)
        )
        gemm_s = max(self.shared_read_bytes / self.bandwidth_bps, shared_flops / self.flops_per_s)
        if self.num_experts and batch_size:  # an empty micro-batch group reads no expert
            gemm_s += self.moe_share * self.experts_s(padded)
        return gemm_s

    def gemm_layer_s(self, batch_size: int) -> float:
        """A decode layer without its attention (weights, experts, all-reduces), seconds: it grows with the batch,
        so its value at one request bounds every step's layer from below (sim/metrics/physics.py); attention does
        not (split-KV fill makes a larger batch's attention faster per token)."""
        return self._gemm_s(batch_size) + (self.allreduce_layer_s(batch_size) if self.tp_size > 1 else 0.0)

    def decode_head_s(self, batch_size: int) -> float:
        """LM head, sampling and the per-request host work of one decode step (after the last layer), seconds."""
        if self.profile is not None:
            return self._head[0] + self._head[1] * batch_size
        flops = 2 * self.padded_batch(batch_size) * self.lm_head_params
        head_s = max((self.lm_head_bytes + self.half_bytes) / self.bandwidth_bps, flops / self.flops_per_s)
        return head_s + batch_size * self.request_overhead_s

    def prefill_s(self, chunks: list[tuple[int, int]], num_completing: int) -> float:
        """One prefill forward (module docstring).

        Args:
            chunks: ``(new_tokens, cached_tokens)`` per request in the forward.
            num_completing: requests whose prompt completes in this forward (they sample a token).

        Returns:
            Seconds.
        """
        flops_s = self._prefill_flops_s(chunks, num_completing) + self.num_layers * self.moe_share * self.moe_layer_s
        time_s = max(flops_s, self.weight_bytes / self.bandwidth_bps)
        if self.tp_size > 1:
            time_s += self.num_layers * self.allreduce_layer_s(sum(new for new, _ in chunks))
        return time_s

    def prefill_extra_s(self, chunks: list[tuple[int, int]], num_completing: int) -> float:
        """What a prefill chunk adds to a decode step it rides in (``serving.mixed_prefill``): its FLOPs, its activation
        passes and, with tp_size > 1, its tokens' share of the all-reduces; the weights are read by the step anyway.

        Args and returns: as :meth:`prefill_s`.
        """
        extra_s = self._prefill_flops_s(chunks, num_completing)
        if self.tp_size > 1:
            tokens = sum(new for new, _ in chunks)
            extra_s += (
                self.num_layers
                * 2.0
                * allreduce_s(tokens * self.activation_bytes_per_token, self.tp_size, self.nvlink_gbps, 0.0)
            )
        return extra_s

    def _prefill_flops_s(self, chunks: list[tuple[int, int]], num_completing: int) -> float:
        """Seconds of a prefill forward's kernels (module docstring): GEMM and attention FLOPs at their peaks and
        efficiencies, plus the memory-bound activation passes of its tokens."""
        gemm = 2.0 * num_completing * self.lm_head_params
        per_token = 2.0 * self.num_layers * self.active_params_layer
        attn = 0.0
        tokens = 0
        attn_per = self.prefill_attn_flops_per_pair * self.num_layers
        for new, cached in chunks:
            tokens += new
            gemm += per_token * new
            attn += attn_per * (new * cached + new * (new + 1) / 2)
        passes_s = tokens * self.num_layers * self.prefill_token_layer_s
        return gemm / self.flops_per_s + attn / self.attn_flops_per_s + passes_s
