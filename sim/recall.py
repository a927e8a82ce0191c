"""Recall model, first version: how many selected blocks each offloaded request moves per layer and step.

For an offloaded request with ``ctx`` tokens in its KV cache (DESIGN.md "Recall model")::

    offloaded_blocks = max(0, (ctx − sink_tokens − recent_tokens) // block_size)
    selected k       = min(budget_tokens // block_size, offloaded_blocks)
    missing          = k                      on the first decode step after a prefill (cold buffer)
                     ~ Binomial(k, miss_rate) afterwards, drawn independently per layer

Model assumption (placeholder until the recall-I/O issue): one miss rate for every layer and step, the
recall buffer always holds the rest of the selection. The default ``miss_rate`` of 0.15 sits below the
"< 25 % of blocks change per step" that REFERENCE.md §2.1 (NOSA) reports, because a buffer of
``recall_buffer_blocks`` (2× the budget by default) also keeps blocks selected a few steps ago
(SparseServe: a 12-step working set covers almost all selections, REFERENCE.md §2.2).

SoloHead selection with the gather-scatter engine: one set per (request, layer), each block carries all
KV heads, and all misses of one layer (whole batch) go over the link as **one** coalesced transfer.

Hot path: a sum of independent Binomial(k_i, p) draws is Binomial(Σ k_i, p), so one draw per layer covers
the whole batch; no loop over requests.
"""

from __future__ import annotations

import numpy as np

from sim.specs import HardwareSpec, ModelSpec, PulseInferPolicy


class RecallModel:
    """Recall bytes and link time per layer for the offloaded part of a decode batch.

    Args:
        model: model card (KV bytes per token and layer).
        policy: the PulseInfer policy knobs (block size, budget, sink/recent window, miss rate).
        hardware: H2D bandwidth and per-transfer latency.
    """

    def __init__(self, model: ModelSpec, policy: PulseInferPolicy, hardware: HardwareSpec) -> None:
        self.num_layers = model.num_layers
        self.block_size = policy.block_size
        self.budget_blocks = policy.budget_tokens // policy.block_size
        self.window_tokens = policy.sink_tokens + policy.recent_tokens
        self.miss_rate = policy.miss_rate
        self.block_bytes_layer = policy.block_size * model.kv_bytes_per_token_layer
        self.h2d_bps = hardware.h2d_bandwidth_gbps * 1e9
        self.h2d_latency_s = hardware.h2d_latency_us * 1e-6

    def selected_blocks(self, ctx: np.ndarray) -> np.ndarray:
        """Blocks selected per layer for each request (int64 [n]) given its KV tokens ``ctx`` (int64 [n])."""
        offloaded = np.maximum(ctx - self.window_tokens, 0) // self.block_size
        return np.minimum(offloaded, self.budget_blocks)

    def missing_blocks(self, selected: np.ndarray, cold: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Blocks to recall per layer for the whole batch: int64 [num_layers].

        Args:
            selected: int64 [n], selected blocks per request (from :meth:`selected_blocks`).
            cold: bool [n], True where the request's recall buffer is empty (first step after prefill).
            rng: the simulation's seeded generator.
        """
        cold_blocks = int(selected[cold].sum())
        warm_blocks = int(selected[~cold].sum())
        missing = np.full(self.num_layers, cold_blocks, dtype=np.int64)
        if warm_blocks and self.miss_rate > 0.0:
            missing += rng.binomial(warm_blocks, self.miss_rate, size=self.num_layers)
        return missing

    def link_s(self, missing: np.ndarray) -> list[float]:
        """Link time per layer: one coalesced transfer of ``latency + bytes / bandwidth``, 0 if empty."""
        nbytes = missing * self.block_bytes_layer
        times = np.where(missing > 0, self.h2d_latency_s + nbytes / self.h2d_bps, 0.0)
        return times.tolist()
