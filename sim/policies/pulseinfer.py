"""PulseInfer, first version: offload long requests, recall selected blocks layer by layer.

What an offloaded request keeps in the device pool (Model assumption, DESIGN.md "Recall model"): the
sink (``sink_tokens``), the recent window (``recent_tokens`` plus the block being filled), a recall
buffer of ``recall_buffer_blocks`` and one block summary (per-channel key min and max) per KV block.
A summary has the size of one token's K and V, so ``ceil(num_blocks / block_size)`` pool blocks hold
them. Everything else lives in host DRAM. Attention reads the sink, the recent window and the selected
blocks; selection reads every summary.
"""

from __future__ import annotations

import numpy as np

from sim.policies.base import Policy, StepCost
from sim.recall import RecallModel
from sim.specs import Scenario


class PulseInfer(Policy):
    """Requests with prompts of at least ``offload_threshold_tokens`` run offloaded; others run dense."""

    name = "pulseinfer"

    def __init__(self, scenario: Scenario) -> None:
        p = scenario.policy.pulseinfer
        super().__init__(scenario, p)
        self.recall = RecallModel(scenario.model, p, scenario.hardware)
        bs = p.block_size
        self.resident_blocks = -(-p.sink_tokens // bs) + -(-p.recent_tokens // bs) + 1 + p.recall_buffer_blocks
        self.sparse_tokens = p.sink_tokens + p.recent_tokens + p.budget_tokens

    def wants_offload(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.params.offload_threshold_tokens

    def device_blocks(self, ctx: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        bs = self.block_size
        dense = -(-ctx // bs)
        sparse = np.minimum(dense, self.resident_blocks + -(-dense // bs))
        return np.where(offloaded, sparse, dense)

    def growth_blocks(self, future_tokens: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        dense = -(-future_tokens // self.block_size)
        return np.where(offloaded, -(-dense // self.block_size), dense)

    def step_cost(self, ctx: np.ndarray, offloaded: np.ndarray, cold: np.ndarray, rng: np.random.Generator) -> StepCost:
        batch = len(ctx)
        num_blocks = -(-ctx // self.block_size)
        attended_each = np.where(offloaded, np.minimum(ctx, self.sparse_tokens) + num_blocks, ctx)
        attended = int(attended_each.sum())
        layer_s = self.compute.decode_layer_s(batch, attended)
        recall_s = None
        recall_bytes = num_transfers = 0
        if offloaded.any():
            off_ctx = ctx[offloaded]
            missing = self.recall.missing_blocks(self.recall.selected_blocks(off_ctx), cold[offloaded], rng)
            if missing.any():
                recall_s = self.recall.link_s(missing)
                recall_bytes = int(missing.sum()) * self.recall.block_bytes_layer
                num_transfers = int(np.count_nonzero(missing))
        return StepCost(
            compute_s=[layer_s] * self.compute.num_layers,
            recall_s=recall_s,
            head_s=self.compute.decode_head_s(batch),
            recall_bytes=recall_bytes,
            num_transfers=num_transfers,
            attended_tokens=attended,
        )
