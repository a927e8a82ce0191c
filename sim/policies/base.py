"""The policy interface the scheduler calls. Arrays are per request of the decode batch, length n."""

from __future__ import annotations

import numpy as np

from sim.config import DensePolicy, Scenario
from sim.step.compute import ComputeModel
from sim.step.cost import DecodeRun
from sim.step.draws import RecallDraws
from sim.step.gpu import GpuView


class Policy:
    """Base class: what every policy shares with SGLang-like continuous batching.

    Subclasses override :meth:`wants_offload`, :meth:`device_blocks` and, where their steps
    are not always recall-free, :meth:`step_costs`. ``gpu`` is one GPU of the replica (sim/step/gpu.py ``GpuView``,
    ``serving.tp_size``): its ``model`` and ``hardware``, which the policy keeps as its own names, are what that GPU
    holds and sees (KV bytes, weights and link rates are per GPU), and its transfers go through its ``link``.
    """

    def __init__(self, scenario: Scenario, name: str, params: DensePolicy) -> None:
        self.name = name
        self.params = params
        self.block_size = params.block_size
        tp = scenario.serving.tp_size
        self.gpu = GpuView.of(scenario)
        self.model, self.hardware = self.gpu.model, self.gpu.hardware  # one GPU's shard, the card as it sees it
        profile = scenario.profile
        self.compute = ComputeModel(
            self.model, self.hardware, profile.compute if profile else None, tp, scenario.engine
        )
        tpot_ms = scenario.slo.tpot_ms
        self.tpot_slo_s = tpot_ms * 1e-3 if tpot_ms is not None else None  # per-request TPOT bound, if any

    def wants_offload(self, prompt_tokens: int) -> bool:
        """Whether a request with this prompt runs offloaded (sparse recall)."""
        return False

    def device_blocks(self, tokens, offloaded, held: bool = True):
        """The block rule: device-pool blocks a request holds with ``tokens`` KV tokens (``held``), or that ``tokens``
        more tokens will need (``held=False``: the admission's reservation). One definition for one request (int
        ``tokens``, bool ``offloaded``: an int, plain Python, as admission's checks call it) and for many (int64
        [..., n] with bool [n]: int64 [..., n]); tests/sim/test_block_rule.py checks that both forms agree. A dense
        request holds ceil(tokens / block_size) either way."""
        return -(-tokens // self.block_size)

    def cache_holds(self, num_offloaded: int, free_hbm_bytes: int) -> bool:
        """Whether a shared recall cache would hold the working sets of ``num_offloaded`` offloaded requests when
        the KV pool has ``free_hbm_bytes`` free (always, for a policy without one)."""
        return True

    recall_state_width = 0  # columns of per-request recall state the decode batch keeps for this policy
    reserved_hbm_bytes = 0  # HBM the policy takes out of the KV pool for itself (a fixed-size recall cache)

    def is_recall_free(self, offloaded: np.ndarray) -> bool:
        """Whether a batch with these requests offloaded (bool [n]) has recall-free steps: each costs what a dense
        step of its batch and tokens costs, recalls nothing and draws no random numbers (this base class: never)."""
        return False

    def recall_free_step(self, ctx: np.ndarray) -> tuple[int, float]:
        """:meth:`recall_free_decode` of one step in scalars (attended tokens, one layer's seconds): the compute
        model's scalar form, which a stepped dense step takes (numpy's per-call cost dominates one step)."""
        attended = int(ctx.sum())
        return attended, self.compute.decode_layer_s(len(ctx), attended)

    def recall_free_decode(self, ctx: np.ndarray, offloaded: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``steps`` decode steps at once, for a batch the caller found recall-free
        (:meth:`is_recall_free`; the scheduler's skip-ahead, sim/serving/decode_run.py).

        Args:
            ctx: int64 [n] KV tokens each request attends in the first of the steps (step i attends ``ctx + i``).
            offloaded: bool [n].
            steps: how many steps.

        Returns:
            (attended tokens int64 [steps], one layer's seconds float64 [steps]): each step's as a run of one gives
            it.
        """
        if steps == 1:
            attended, layer_s = self.recall_free_step(ctx)
            return np.array([attended]), np.array([layer_s])
        attended = int(ctx.sum()) + len(ctx) * np.arange(steps, dtype=np.int64)
        return attended, self.compute.decode_layer_s(len(ctx), attended)

    def step_costs(
        self,
        ctx: np.ndarray,
        offloaded: np.ndarray,
        cold: np.ndarray,
        draws: RecallDraws,
        recall_state: np.ndarray | None,
        free_hbm_bytes: np.ndarray,
    ) -> DecodeRun:
        """The costs of k decode steps of one batch that are not recall-free (:meth:`is_recall_free`; recall-free
        steps cost :meth:`recall_free_decode`), recall draws peeked, not consumed (``DecodeRun.commit`` consumes those
        of the steps taken). The one definition of such a step's cost: a single step is k = 1.

        Args:
            ctx: int64 [k, n] KV tokens each request attends at each step.
            offloaded: bool [n]; cold: bool [n] (step 0 only: the first step after (re)admission).
            draws: the replica's streams (sim/step/draws.py).
            recall_state: float [n, recall_state_width] before the run (read only), or None.
            free_hbm_bytes: int64 [k] KV-pool bytes free at each step (a dynamically sized shared cache lives there).
        """
        raise NotImplementedError
