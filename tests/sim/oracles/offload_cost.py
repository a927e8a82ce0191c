"""The offloaded step cost's per-step reference: one decode step of an offload policy written for one step, as
sim/policies/offload.py computed it before the cost was written once over a step axis (``OffloadServing.step_costs``;
``step_cost`` is its run of one). Its recall is the per-step recall oracle (tests/sim/oracles/recall.py).
tests/sim/test_recall_oracle.py checks ``step_cost`` against it on seeded random batches, bit for bit."""

from __future__ import annotations

import numpy as np

from sim.policies.offload import OffloadServing
from tests.sim.oracles import recall as recall_oracle
from tests.sim.oracles.steps import InterruptJobs, StepCost


def _layer_s(pol: OffloadServing, batch: int, attended: int) -> float:
    """The compute model's layer time (one definition, sim/step/compute.py), for one step."""
    return float(pol.compute.decode_layer_s(batch, np.array([attended]))[0])


def _select_s(pol: OffloadServing, candidate_blocks: float) -> float:
    return pol.selection_cost.seconds(float(candidate_blocks)) if pol.selection_cost is not None else 0.0


def _sm_shared(pol: OffloadServing, compute_s: list[float], kernel_s: list[float], lookahead: int) -> list[float]:
    out = list(compute_s)
    for i in range(lookahead, len(kernel_s)):
        j = i - lookahead
        out[j] += pol.sm_frac * min(kernel_s[i], compute_s[j])
    return out


def step_cost(  # noqa: C901, PLR0912, PLR0915
    pol: OffloadServing, ctx, offloaded, cold, rng, recall_state=None, free_hbm_bytes=0
) -> StepCost:
    """One decode step's cost (``recall_state`` rows of the offloaded requests advanced in place)."""
    batch, L, G, params = len(ctx), pol.num_layers, pol.groups, pol.params
    if pol.full:
        attended_each = ctx
    elif not pol.summaries_attended:
        attended_each = np.where(offloaded, np.minimum(ctx, pol.sparse_tokens), ctx)
    else:
        attended_each = np.where(offloaded, np.minimum(ctx, pol.sparse_tokens) + -(-ctx // pol.block_size), ctx)
    attended = int(attended_each.sum())
    if pol.selection_cost is None:
        candidates = np.zeros(len(ctx), dtype=np.int64)
    else:
        candidates = np.where(offloaded, pol.recall.offloaded_blocks(ctx), 0)
    layer_s = _layer_s(pol, batch, attended) + _select_s(pol, candidates.sum())
    cost = StepCost([layer_s] * L, None, None, pol.compute.decode_head_s(batch), 0, 0, 0, attended)
    n_off = int(offloaded.sum())
    if not n_off and G == 1:
        return cost
    groups = np.arange(batch) % G
    if G > 1:
        sizes = np.bincount(groups, minlength=G)
        att = np.bincount(groups, weights=attended_each, minlength=G)
        cand = np.bincount(groups, weights=candidates, minlength=G)
        cost.compute_s = [_layer_s(pol, int(b), int(a)) + _select_s(pol, c) for b, a, c in zip(sizes, att, cand)] * L
    cost.d2h_bytes = n_off * pol.kv_bytes_per_token
    if not n_off:
        return cost
    cache = None
    if pol.shared_cache:
        cache = (pol.reserved_hbm_bytes or free_hbm_bytes) / pol.recall.fragment_bytes
    state = recall_state[offloaded] if pol.recall_state_width and recall_state is not None else None
    nbytes, fragments, contiguous_s, selected = recall_oracle.step(
        pol.recall, ctx[offloaded], cold[offloaded], rng, groups[offloaded], G, state, cache
    )
    if state is not None:
        recall_state[offloaded] = state
    cost.selected_fragments = selected
    if not nbytes.any():
        return cost
    if pol.eager_launch_s or pol.event_wait_s:  # a step that recalls: eager launches, event waits where it recalls
        item_recalls = nbytes.T.ravel() > 0
        overhead = pol.eager_launch_s * True + pol.event_wait_s * item_recalls
        cost.compute_s = (np.asarray(cost.compute_s) + overhead).tolist()
    if contiguous_s is not None and params.io == "per_fragment":
        link = np.where(nbytes > 0, contiguous_s[:, None], 0.0)
        gather = np.zeros_like(link)
    else:
        gather, link = pol.link.layer_times(nbytes, fragments, pol.link_io, params.chunk_bytes)
    cost.recall_bytes = int(nbytes.sum())
    cost.num_fragments = int(fragments.sum())
    cost.layer_bytes, cost.layer_fragments = nbytes.sum(axis=0), fragments.sum(axis=0)
    if params.io == "per_fragment":
        cost.num_transfers = cost.num_fragments
    else:
        cost.num_transfers = int(np.count_nonzero(nbytes))
    if not pol.io_overlaps:
        cost.compute_s = (np.asarray(cost.compute_s) + gather.T.ravel() + link.T.ravel()).tolist()
        return cost
    if not pol.interruptible:
        cost.recall_s = link[0].tolist()
        cost.gather_s = gather[0].tolist() if params.io == "gather_scatter" else None
        if params.io == "gpu_gather":
            cost.compute_s = _sm_shared(pol, cost.compute_s, cost.recall_s, 1)
        return cost
    f = pol.correction_frac
    lookahead = params.lookahead_layers * G
    item_bytes, item_copy, item_gather = nbytes.T.ravel().astype(float), link.T.ravel(), gather.T.ravel()
    item_s = item_copy
    if pol.link_io == "streamed":
        item_s = pol.link.streamed_s(item_gather, item_copy, item_bytes, params.chunk_bytes)
    elif params.io == "gpu_gather":
        cost.compute_s = _sm_shared(pol, cost.compute_s, item_copy.tolist(), lookahead)
    parts = np.stack([item_bytes, item_s, item_copy, item_gather], axis=1)
    cost.interrupt = InterruptJobs((1 - f) * parts, f * parts, lookahead, params.chunk_bytes)
    return cost
