"""GPU compute-time model: a roofline per decoder layer for decode, FLOPs over achieved peak for prefill.

Decode, one layer, batch of B requests attending T tokens in total (sum over the batch)::

    bytes  = W_layer + E_touched(B) · W_expert + T · kv_bytes_per_token_per_layer
    flops  = 2 · B · P_active_layer + 4 · num_heads · head_dim · T
    time   = max(bytes / (hbm_bandwidth · hbm_efficiency), flops / (bf16_peak · prefill_mfu))

``W_layer`` is the attention and dense-MLP (or router) weight bytes; for MoE, ``E_touched(B) = E · (1 −
(1 − k/E)^B)`` is the expected number of distinct experts that B tokens route to (uniform routing), each
read once. ``4 · num_heads · head_dim`` FLOPs per attended token is QKᵀ plus AV (2 + 2 multiply-adds per
channel). Sources: the bandwidth roofline of docs/sources.md §6 item 5 (decode is HBM-bound, ridge point
~295 FLOP/B on H100, §3.1); peak and bandwidth from the hardware card.

Prefill, one forward over chunks (c new tokens after p cached tokens each)::

    flops = Σ [2 · c · L · P_active_layer + 4 · num_heads · head_dim · L · (c·p + c·(c+1)/2)]
            + 2 · hidden · vocab per request whose prompt completes (its first token)
    time  = max(flops / (bf16_peak · prefill_mfu), weight_bytes / (hbm_bandwidth · hbm_efficiency))

Model assumption: no kernel-launch or attention-kernel inefficiency beyond the two efficiency factors.

Tensor parallelism (``serving.tp_size`` = n > 1): the model handed in is one GPU's shard
(sim/config/parallel.py ``shard_model``: its weights, KV heads and FLOPs), so the formulas above give one
GPU's time; each layer then adds two ring all-reduces (after attention and after the MLP) of the layer's
activations, ``tokens · hidden_size · dtype_bytes`` bytes (``parallel.allreduce_s``: 2(n−1)/n · bytes /
nvlink bandwidth + 2(n−1) · latency), not overlapped with compute (Model assumption). The vocabulary-parallel
LM head's logit gather is not charged.

Calibrated: with a profile's ``compute`` section (sim/config/measured.py ``ComputeProfile``, fitted by
calibrate/fit.py from the engine's own decode steps) the decode layer and the LM head take the measured
linear forms instead, and the per-step overhead is part of the measured head time. Prefill keeps the
roofline (the engine's decode is what is calibrated).
"""

from __future__ import annotations

import numpy as np

from sim.config import ComputeProfile, HardwareSpec, ModelSpec
from sim.config.parallel import allreduce_s


class ComputeModel:
    """Decode-layer and prefill times in seconds for one model on one GPU (of a tensor-parallel group).

    Args:
        model: the model card; with ``tp_size`` > 1, one GPU's shard (``sim.config.parallel.shard_model``).
        hardware: the GPU card (bandwidth, peak, efficiencies, per-step overhead, NVLink for ``tp_size`` > 1).
        profile: measured decode compute for this model (replaces the decode roofline), or None.
        tp_size: GPUs of the tensor-parallel group (adds the all-reduces when > 1).
    """

    def __init__(
        self, model: ModelSpec, hardware: HardwareSpec, profile: ComputeProfile | None = None, tp_size: int = 1
    ) -> None:
        db = model.dtype_bytes
        self.tp_size = tp_size
        self.activation_bytes_per_token = model.hidden_size * db
        self.nvlink_gbps = hardware.nvlink_bandwidth_gbps or 0.0
        self.nvlink_latency_us = hardware.nvlink_latency_us
        self.num_layers = model.num_layers
        self.bandwidth_bps = hardware.hbm_bandwidth_gbps * 1e9 * hardware.hbm_efficiency
        self.flops_per_s = hardware.bf16_tflops * 1e12 * hardware.prefill_mfu
        self.kv_bytes_per_token_per_layer = model.kv_bytes_per_token_per_layer
        self.attn_flops_per_token = 4 * model.num_heads * model.head_dim
        self.num_experts = model.num_experts
        self.num_active_experts = model.num_active_experts
        self.shared_weight_bytes_layer = (model.attn_params_per_layer + model.dense_mlp_params_per_layer) * db
        self.expert_bytes = model.expert_params * db
        self.active_params_layer = model.active_params_per_layer
        self.lm_head_params = model.vocab_size * model.hidden_size
        self.lm_head_bytes = self.lm_head_params * db
        self.weight_bytes = model.weight_bytes
        self.step_overhead_s = hardware.decode_step_overhead_us * 1e-6
        self.profile = profile
        if profile is not None:
            self.step_overhead_s = 0.0  # measured inside head_s
            self._layer = (
                profile.layer_base_us * 1e-6,
                profile.layer_per_request_us * 1e-6,
                profile.layer_per_token_ns * 1e-9,
            )
            self._head = (profile.head_base_us * 1e-6, profile.head_per_request_us * 1e-6)

    def experts_touched(self, batch_size: int) -> float:
        """Expected distinct experts per MoE layer for ``batch_size`` tokens (0 for dense models)."""
        if not self.num_experts:
            return 0.0
        e, k = self.num_experts, self.num_active_experts
        return e * (1.0 - (1.0 - k / e) ** batch_size)

    def allreduce_layer_s(self, tokens: int) -> float:
        """The two all-reduces of one layer over ``tokens`` tokens' activations (0 at ``tp_size`` 1)."""
        if self.tp_size == 1:
            return 0.0
        nbytes = tokens * self.activation_bytes_per_token
        return 2.0 * allreduce_s(nbytes, self.tp_size, self.nvlink_gbps, self.nvlink_latency_us)

    def decode_layer_s(self, batch_size: int, attended_tokens: int | np.ndarray) -> float | np.ndarray:
        """One decoder layer of one decode step, or of k steps of one batch size at once (numpy broadcasting: the
        same float operations in the same order, so each step's time is the one a scalar call gives).

        Args:
            batch_size: requests in the step (one new token each).
            attended_tokens: KV tokens read by attention, summed over the batch: an int, or int64 [k] for k steps
                (block summaries read by selection count as tokens: one summary is the size of one token's K and V).

        Returns:
            Seconds: a float, or float64 [k].
        """
        if self.profile is not None:
            base, per_request, per_token = self._layer
            return (base + per_request * batch_size) + per_token * attended_tokens
        nbytes = (
            self.shared_weight_bytes_layer + self.experts_touched(batch_size) * self.expert_bytes
        ) + attended_tokens * self.kv_bytes_per_token_per_layer
        flops = 2 * batch_size * self.active_params_layer + self.attn_flops_per_token * attended_tokens
        memory_s, flops_s = nbytes / self.bandwidth_bps, flops / self.flops_per_s
        layer_s = np.maximum(memory_s, flops_s) if isinstance(memory_s, np.ndarray) else max(memory_s, flops_s)
        if self.tp_size > 1:
            return layer_s + self.allreduce_layer_s(batch_size)
        return layer_s

    def decode_head_s(self, batch_size: int) -> float:
        """LM head and sampling of one decode step (after the last layer)."""
        if self.profile is not None:
            return self._head[0] + self._head[1] * batch_size
        flops = 2 * batch_size * self.lm_head_params
        return max(self.lm_head_bytes / self.bandwidth_bps, flops / self.flops_per_s)

    def prefill_s(self, chunks: list[tuple[int, int]], num_completing: int) -> float:
        """One prefill forward.

        Args:
            chunks: ``(new_tokens, cached_tokens)`` per request in the forward.
            num_completing: requests whose prompt completes in this forward (they sample a token).
        """
        flops = 2.0 * num_completing * self.lm_head_params
        per_token = 2.0 * self.num_layers * self.active_params_layer
        attn = self.attn_flops_per_token * self.num_layers
        for new, cached in chunks:
            flops += per_token * new + attn * (new * cached + new * (new + 1) / 2)
        time_s = max(flops / self.flops_per_s, self.weight_bytes / self.bandwidth_bps)
        if self.tp_size > 1:
            time_s += self.num_layers * self.allreduce_layer_s(sum(new for new, _ in chunks))
        return time_s
