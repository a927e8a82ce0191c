"""SGLang-like dense serving: all KV on the GPU, dense attention, nothing recalled (docs/sources.md §5)."""

from __future__ import annotations

import numpy as np

from sim.policies.base import Policy


class DenseServing(Policy):
    """Every request keeps its whole KV cache in the device pool; the batch is capped by that pool."""

    def is_recall_free(self, offloaded: np.ndarray) -> bool:
        return True  # a dense step is a function of the batch and its tokens
