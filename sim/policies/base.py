"""The policy interface the scheduler calls. Arrays are per request of the decode batch, length n."""

from __future__ import annotations

import numpy as np

from sim.config import DensePolicy, Scenario
from sim.config.parallel import per_gpu_hardware, shard_model
from sim.serving.admission import Admission
from sim.serving.decode_admission import DecodeAdmission
from sim.step.compute import ComputeModel
from sim.step.cost import StepCost


class Policy:
    """Base class: what every policy shares with SGLang-like continuous batching.

    Subclasses override :meth:`wants_offload`, :meth:`device_blocks`, :meth:`growth_blocks` and
    :meth:`step_cost`. ``model`` and ``hardware`` are what one GPU of the replica holds and sees
    (``serving.tp_size``, sim/config/parallel.py): KV bytes, weights and link rates are per GPU.
    """

    def __init__(self, scenario: Scenario, name: str, params: DensePolicy) -> None:
        self.name = name
        self.params = params
        self.block_size = params.block_size
        tp = scenario.serving.tp_size
        self.model = shard_model(scenario.model, tp)  # one GPU's shard (the card itself at tp_size 1)
        self.hardware = per_gpu_hardware(scenario.hardware, tp)
        profile = scenario.profile
        self.compute = ComputeModel(self.model, self.hardware, profile.compute if profile else None, tp)
        # who joins the batch; offload policies may own an IO-adaptive one
        self.admission = DecodeAdmission(self) if params.decode_scheduler == "sglang_pd" else Admission(self)

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

    def step_cost(self, ctx: np.ndarray, offloaded: np.ndarray, cold: np.ndarray, rng: np.random.Generator) -> StepCost:
        """Cost of one decode step in which each request attends its ``ctx`` KV tokens."""
        raise NotImplementedError
