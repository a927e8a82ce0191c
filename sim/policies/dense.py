"""SGLang-like dense serving: all KV on the GPU, dense attention, nothing recalled (docs/sources.md §5)."""

from __future__ import annotations

import numpy as np

from sim.policies.base import Policy
from sim.step.cost import StepCost
from sim.step.draws import RecallDraws


class DenseServing(Policy):
    """Every request keeps its whole KV cache in the device pool; the batch is capped by that pool."""

    def blocks_one(self, ctx: int, offloaded: bool) -> int:
        return -(-ctx // self.block_size)

    def growth_one(self, future_tokens: int, offloaded: bool) -> int:
        return -(-future_tokens // self.block_size)

    def is_recall_free(self, offloaded: np.ndarray) -> bool:
        return True  # a dense step is a function of the batch and its tokens

    def step_cost(
        self,
        ctx: np.ndarray,
        offloaded: np.ndarray,
        cold: np.ndarray,
        rng: np.random.Generator | RecallDraws,
        recall_state: np.ndarray | None = None,
        free_hbm_bytes: int = 0,
    ) -> StepCost:
        """One step of :meth:`Policy.recall_free_decode` (the one definition of a dense step)."""
        attended, layer_s = self.recall_free_step(ctx)
        return StepCost(
            compute_s=[layer_s] * self.compute.num_layers,
            recall_s=None,
            gather_s=None,
            head_s=self.compute.decode_head_s(len(ctx)),
            recall_bytes=0,
            num_fragments=0,
            num_transfers=0,
            attended_tokens=attended,
        )
