"""KV offloading with sparse (SoloHead or head-wise) or full recall: ``full_offload``, ``headwise``,
``pulseinfer`` and their ablation variants.

What an offloaded request keeps in the device pool (Model assumption, DESIGN.md "Recall model"): the sink
(``sink_tokens``), the recent window (``recent_tokens`` plus the block being filled), a recall buffer of
``recall_buffer_blocks`` (per KV head for head-wise selection: the same bytes) and one block summary
(per-channel key min and max) per KV block. A summary has the size of one token's K and V, so
``ceil(num_blocks / block_size)`` pool blocks hold them. With ``selection: all`` there is no buffer and
no summaries; instead two layers of the request's KV are staged on the GPU (double buffering).
Everything else lives in host DRAM. Attention reads the sink, the recent window and the selected blocks
(all blocks for ``selection: all``); selection reads every summary.

Offload writes (D2H): each step the new token's KV of every offloaded request is backed up to host
(eager backup, as SGLang HiSparse does, REFERENCE.md §5.4); its D2H time slows H2D by the hardware's
``d2h_coupling``.
"""

from __future__ import annotations

import numpy as np

from sim.link import LinkModel
from sim.policies.base import Policy, StepCost
from sim.recall import RecallModel
from sim.specs import OffloadPolicy, Scenario


class OffloadServing(Policy):
    """Requests with prompts of at least ``offload_threshold_tokens`` run offloaded; others run dense."""

    params: OffloadPolicy

    def __init__(self, scenario: Scenario, name: str, params: OffloadPolicy) -> None:
        super().__init__(scenario, name, params)
        self.link = LinkModel(scenario.hardware)
        self.recall = RecallModel(scenario.model, params, scenario.recall_stats, self.link)
        bs = params.block_size
        self.window_blocks = -(-params.sink_tokens // bs) + -(-params.recent_tokens // bs) + 1
        self.full = params.selection == "all"
        self.resident_blocks = self.window_blocks + (0 if self.full else params.recall_buffer_blocks)
        self.sparse_tokens = params.sink_tokens + params.recent_tokens + params.budget_tokens
        self.num_layers = scenario.model.num_layers
        self.kv_bytes_per_token = scenario.model.kv_bytes_per_token

    def wants_offload(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.params.offload_threshold_tokens

    def device_blocks(self, ctx: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        bs = self.block_size
        dense = -(-ctx // bs)
        extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // bs)  # staging or summaries
        return np.where(offloaded, np.minimum(dense, self.resident_blocks + extra), dense)

    def growth_blocks(self, future_tokens: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        dense = -(-future_tokens // self.block_size)
        extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // self.block_size)
        return np.where(offloaded, extra, dense)

    def step_cost(self, ctx: np.ndarray, offloaded: np.ndarray, cold: np.ndarray, rng: np.random.Generator) -> StepCost:
        batch = len(ctx)
        if self.full:
            attended_each = ctx
        else:
            attended_each = np.where(offloaded, np.minimum(ctx, self.sparse_tokens) + -(-ctx // self.block_size), ctx)
        attended = int(attended_each.sum())
        layer_s = self.compute.decode_layer_s(batch, attended)
        cost = StepCost([layer_s] * self.num_layers, None, None, self.compute.decode_head_s(batch), 0, 0, 0, attended)
        n_off = int(offloaded.sum())
        if not n_off:
            return cost
        rec = self.recall.step(ctx[offloaded], cold[offloaded], rng)
        if not rec.nbytes.any():
            return cost
        slow = self.link.d2h_slowdown(n_off * self.kv_bytes_per_token, layer_s * self.num_layers)
        cost.recall_s = [t * slow for t in rec.link_s] if slow != 1.0 else rec.link_s
        cost.gather_s = rec.gather_s if self.params.io == "gather_scatter" else None
        cost.recall_bytes = int(rec.nbytes.sum())
        cost.num_fragments = int(rec.fragments.sum())
        cost.num_transfers = rec.num_transfers
        cost.layer_bytes, cost.layer_fragments = rec.nbytes, rec.fragments
        return cost
