"""k decode steps of an offload policy at once: what k calls of ``OffloadServing.step_cost`` give, as arrays.

Skip-ahead over offloaded steps (sim/serving/offload_run.py) needs each step's layer time, recall and
interruptible plan (or sequential per-layer recall) before it times the steps one by one. Every quantity here
is ``step_cost``'s formula applied element-wise to [k, ...] arrays (the recall through sim/step/recall_run.py),
so step t's values equal what the reference path computes at step t on the same seed
(tests/sim/test_offload_run.py). Covered: one micro-batch on a card whose I/O overlaps compute, interruptible
or sequential scheduling, SoloHead or head-wise selection, any ``io`` but ``gpu_gather`` (whose SM sharing is a
per-item loop); other configurations step one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.step.draws import RecallDraws
from sim.step.recall_run import RecallRun, recall_run

if TYPE_CHECKING:
    from sim.policies.offload import OffloadServing


@dataclass(slots=True)
class OffloadRunCosts:
    """The costs of k decode steps (arrays indexed by step)."""

    layer_s: np.ndarray  # float64 [k] GPU seconds of each layer (every layer of a step costs the same)
    head_s: float  # LM head + sampling (the batch does not change)
    d2h_bytes: int  # offload writes queued at each step's start
    attended_tokens: np.ndarray  # int64 [k]
    layer_bytes: np.ndarray  # int64 [k, L] recall bytes per layer
    layer_fragments: np.ndarray  # int64 [k, L]
    recall_bytes: np.ndarray  # int64 [k]
    num_fragments: np.ndarray  # int64 [k]
    num_transfers: np.ndarray  # int64 [k]
    selected_fragments: np.ndarray  # int64 [k]
    lookahead_items: int
    chunk_bytes: int
    recall: RecallRun  # commit(j, state) consumes the draws of the first j steps
    # interruptible scheduling: (prefetch, correction) jobs, float64 [k, L, 4] each (sim/step/cost.py InterruptPlan)
    plan: tuple[np.ndarray, np.ndarray] | None
    # sequential scheduling: (link seconds, host gather seconds), float64 [k, L] each (gather zeros unless
    # gather-scatter)
    sequential: tuple[np.ndarray, np.ndarray] | None

    @property
    def has_recall(self) -> np.ndarray:
        """bool [k]: the step recalls something (else it is timed as a plain compute step)."""
        return self.recall_bytes > 0


def runs_offloaded(policy: OffloadServing) -> bool:
    """Whether :func:`offload_run_costs` covers this policy's configuration (module docstring)."""
    return not policy.full and policy.groups == 1 and policy.io_overlaps and policy.params.io != "gpu_gather"


def offload_run_costs(
    policy: OffloadServing,
    ctx: np.ndarray,
    offloaded: np.ndarray,
    cold: np.ndarray,
    draws: RecallDraws,
    recall_state: np.ndarray | None,
    free_hbm_bytes: np.ndarray,
) -> OffloadRunCosts:
    """The costs of k steps of a batch with at least one offloaded request (draws peeked, not consumed).

    Args:
        policy: an offload policy for which :func:`runs_offloaded` holds.
        ctx: int64 [k, n] KV tokens each request attends at each step.
        offloaded: bool [n]; cold: bool [n] (step 0 only).
        draws: the replica's streams; recall_state: float [n, width] before the run (read only), or None.
        free_hbm_bytes: int64 [k] KV-pool bytes free at each step (a dynamically sized shared cache lives there).
    """
    pol = policy
    k, batch = ctx.shape
    if pol.selection_cost is not None:
        attended_each = np.where(offloaded, np.minimum(ctx, pol.sparse_tokens), ctx)
    else:
        attended_each = np.where(offloaded, np.minimum(ctx, pol.sparse_tokens) + -(-ctx // pol.block_size), ctx)
    attended = attended_each.sum(axis=1)
    layer_s = pol.compute.decode_layer_s_many(batch, attended)
    if pol.selection_cost is not None:
        candidates = pol._candidates(ctx, offloaded).sum(axis=1)
        layer_s = layer_s + np.array([pol._select_s(c) for c in candidates])
    cache = None
    if pol.shared_cache:
        cache_bytes = np.full(k, pol.reserved_hbm_bytes) if pol.reserved_hbm_bytes else free_hbm_bytes
        cache = cache_bytes / pol.recall.fragment_bytes
    state = recall_state[offloaded] if pol.recall_state_width and recall_state is not None else None
    rec = recall_run(pol.recall, ctx[:, offloaded], cold[offloaded], draws, state, cache)
    frags = rec.fragments
    nbytes = frags * pol.recall.fragment_bytes
    gather, link = pol.link.layer_times(nbytes, frags, pol.link_io, pol.params.chunk_bytes)
    num_fragments = frags.sum(axis=1)
    transfers = num_fragments if pol.params.io == "per_fragment" else np.count_nonzero(nbytes, axis=1)
    plan = sequential = None
    if pol.interruptible:
        item_bytes = nbytes.astype(float)
        item_s = link
        if pol.link_io == "streamed":
            item_s = pol.link.streamed_s(gather, link, item_bytes, pol.params.chunk_bytes)
        parts = np.stack([item_bytes, item_s, link, gather], axis=-1)  # float64 [k, L, 4]
        f = pol.correction_frac
        plan = ((1 - f) * parts, f * parts)
    else:
        sequential = (link, gather if pol.params.io == "gather_scatter" else np.zeros_like(link))
    return OffloadRunCosts(
        layer_s, pol.compute.decode_head_s(batch), int(offloaded.sum()) * pol.kv_bytes_per_token, attended,
        nbytes, frags, nbytes.sum(axis=1), num_fragments, transfers, rec.selected_fragments,
        pol.params.lookahead_layers, pol.params.chunk_bytes, rec, plan, sequential,
    )  # fmt: skip
