"""The policy interface the scheduler calls. Arrays are per request of the decode batch, length n."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config import DensePolicy, Scenario
from sim.step.compute import ComputeModel


@dataclass(slots=True)
class InterruptPlan:
    """Recall jobs of an interruptibly scheduled step, per GPU work item (sim/interrupt.py)."""

    prefetch: list[tuple[float, float]]  # (bytes, link seconds) per item
    correction: list[tuple[float, float]]  # urgent part, per item
    lookahead_items: int
    chunk_bytes: int


@dataclass(slots=True)
class StepCost:
    """What one decode step costs, before the layer pipeline turns it into time."""

    compute_s: list[float]  # per layer, GPU time
    recall_s: list[float] | None  # per layer, H2D time; None when nothing is recalled
    gather_s: list[float] | None  # per layer, host gather time (gather-scatter), or None
    head_s: float  # LM head + sampling after the last layer
    recall_bytes: int  # H2D bytes of the whole step
    num_fragments: int  # recalled fragments of the whole step
    num_transfers: int  # H2D copies of the whole step
    attended_tokens: int  # KV tokens read per layer, summed over the batch
    layer_bytes: np.ndarray | None = None  # int64 [num_layers] recall bytes per layer
    layer_fragments: np.ndarray | None = None  # int64 [num_layers]
    interrupt: InterruptPlan | None = None  # set when the step is scheduled interruptibly


class Policy:
    """Base class: what every policy shares with SGLang-like continuous batching.

    Subclasses override :meth:`wants_offload`, :meth:`device_blocks`, :meth:`growth_blocks` and
    :meth:`step_cost`.
    """

    def __init__(self, scenario: Scenario, name: str, params: DensePolicy) -> None:
        self.name = name
        self.params = params
        self.block_size = params.block_size
        self.model = scenario.model
        profile = scenario.profile
        self.compute = ComputeModel(scenario.model, scenario.hardware, profile.compute if profile else None)

    def wants_offload(self, prompt_tokens: int) -> bool:
        """Whether a request with this prompt runs offloaded (sparse recall)."""
        return False

    def device_blocks(self, ctx: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        """Device-pool blocks held by each request with ``ctx`` KV tokens (int64 [n])."""
        return -(-ctx // self.block_size)

    def blocks_one(self, ctx: int, offloaded: bool) -> int:
        """:meth:`device_blocks` for one request, in plain Python (admission checks run it often)."""
        return int(self.device_blocks(np.array([ctx]), np.array([offloaded]))[0])

    def growth_one(self, future_tokens: int, offloaded: bool) -> int:
        """:meth:`growth_blocks` for one request."""
        return int(self.growth_blocks(np.array([future_tokens]), np.array([offloaded]))[0])

    def growth_blocks(self, future_tokens: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        """Device blocks ``future_tokens`` more tokens will need (for the admission reservation)."""
        return -(-future_tokens // self.block_size)

    admission = None  # an IoAdmission for io_adaptive offload policies

    def step_cost(self, ctx: np.ndarray, offloaded: np.ndarray, cold: np.ndarray, rng: np.random.Generator) -> StepCost:
        """Cost of one decode step in which each request attends its ``ctx`` KV tokens."""
        raise NotImplementedError

    def observe(self, step_s: float, stall_s: float, link_busy_s: float) -> None:
        """Feedback after each decode step (adaptive admission); no-op by default."""
