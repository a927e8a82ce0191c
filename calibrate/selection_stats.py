"""Per (layer, step) selection statistics of a real model, for the simulator's recall model.

The simulator (docs/design.md "Recall model") draws, per (request, layer, step), the fraction of the selected
blocks that changed since the previous step, lets an LRU recall buffer serve the returning ones and turns
the rest into recalls: one fragment per block (SoloHead) or per (block, KV head) (head-wise). This module
measures those quantities on one teacher-forced pass (`calibrate.accuracy.teacher_forced_trace`: dense
prefill, then M true tokens, every layer on the dense residual stream). The fit that turns the table into
the simulator's ``recall_stats`` lives in calibrate/selection_fit.py (no torch there).

Per budget, layer l (every layer, 0 and 1 included) and step t, with S_t the SoloHead set (the engine's
`select_blocks(..., "solohead")` by default) and S_t^h the head-wise set of KV head h:

  * ``selected_blocks`` k_t = |S_t| = min(budget_tokens // P, candidate blocks).
  * ``changed_blocks`` |S_t \\ S_{t-1}| and ``change_frac`` = changed / k_t (NaN at t = 0).
  * ``returning_blocks``: changed-in blocks that were selected at some step in t-w..t-1 (w =
    ``working_set_steps``); NaN for t < w, where that history is incomplete.
  * ``working_set_blocks``: |S_{t-w+1} U ... U S_t|, the distinct blocks of the last w steps (NaN for
    t < w - 1); the simulator assumes k (1 + w m) for a change fraction m (sim/step/recall.py).
  * ``missing_blocks``, ``miss_frac``: blocks of S_t not in an LRU recall buffer of ``buffer_blocks`` blocks
    (the reference buffer of tests/sim/test_recall_reference.py: after each step every selected block is
    touched, in ascending id, then the least recently used are evicted down to the capacity). The buffer
    starts empty, so step 0 is cold (miss_frac 1). A block that just left the recent window was never
    recalled, so it is missing when first selected (the engine frees its device block on offload).
  * ``headwise_union_blocks`` |U_h S_t^h| and ``union_ratio`` = union / k_t.
  * ``headwise_missing_head_blocks``: sum over KV heads of |S_t^h| not in that head's own LRU buffer of
    ``buffer_blocks`` head-blocks (the simulator's per-head buffer); ``headwise_miss_frac`` divides by
    Hkv * k_t.
  * ``solohead_fragments`` (one per missing block) and ``headwise_fragments`` (one per missing (block, head)).

Dimension names: M steps, NB blocks, Hkv KV heads, k selected blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from calibrate.accuracy import (
    DEFAULT_LAYOUT,
    LayerScores,
    TeacherForcedTrace,
    select_attended,
    teacher_forced_trace,
)
from engine.kv_cache import SparsePolicy
from engine.model import DecoderConfig, DecoderWeights

STATS_COLUMNS = [
    "budget_tokens", "buffer_blocks", "working_set_steps", "layer", "step", "context_tokens", "candidate_blocks",
    "selected_blocks", "changed_blocks", "change_frac", "returning_blocks", "working_set_blocks", "missing_blocks",
    "miss_frac",
    "headwise_union_blocks", "union_ratio", "headwise_missing_head_blocks", "headwise_miss_frac",
    "solohead_fragments", "headwise_fragments",
]  # fmt: skip


def lru_misses(selections: Sequence[np.ndarray], capacity: int) -> np.ndarray:
    """Blocks of each step's selection missing from an LRU buffer that starts empty.

    Args:
        selections: per step, int block ids (unique).
        capacity: buffer size in blocks, >= the largest selection.

    Returns:
        int64 [M], misses per step.

    Raises:
        ValueError: if capacity is smaller than a selection (the buffer must hold the current set).
    """
    buffer: OrderedDict[int, None] = OrderedDict()
    out = np.zeros(len(selections), dtype=np.int64)
    for t, ids in enumerate(selections):
        if len(ids) > capacity:
            raise ValueError(f"buffer capacity={capacity} blocks is smaller than a selection of {len(ids)} blocks")
        out[t] = sum(1 for b in ids.tolist() if b not in buffer)
        for b in sorted(ids.tolist()):
            buffer[b] = None
            buffer.move_to_end(b)
        while len(buffer) > capacity:
            buffer.popitem(last=False)
    return out


def change_counts(selected: np.ndarray, working_set_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Changed-in and returning blocks per step of one set sequence.

    Args:
        selected: bool [M, NB], the set of each step.
        working_set_steps: w >= 1.

    Returns:
        (changed float [M], NaN at step 0; returning float [M], NaN for steps < w).
    """
    m = selected.shape[0]
    changed = np.full(m, np.nan)
    returning = np.full(m, np.nan)
    for t in range(1, m):
        new = selected[t] & ~selected[t - 1]
        changed[t] = new.sum()
        if t >= working_set_steps:
            returning[t] = (new & selected[t - working_set_steps : t].any(0)).sum()
    return changed, returning


def working_set_sizes(selected: np.ndarray, working_set_steps: int) -> np.ndarray:
    """Distinct blocks selected over the last w steps: selected bool [M, NB] -> float [M] (NaN for t < w - 1)."""
    m, w = selected.shape[0], working_set_steps
    out = np.full(m, np.nan)
    for t in range(w - 1, m):
        out[t] = selected[t - w + 1 : t + 1].any(0).sum()
    return out


def _ids(mask: np.ndarray) -> list[np.ndarray]:
    """bool [M, NB] -> per step the ids of the True entries."""
    return [np.flatnonzero(row) for row in mask]


def layer_stats(
    solo: np.ndarray, headwise: np.ndarray, buffer_blocks: int, working_set_steps: int
) -> dict[str, np.ndarray]:
    """Statistics of one (budget, layer): solo bool [M, NB] selected blocks, headwise bool [M, Hkv, NB].

    Returns:
        Columns of STATS_COLUMNS that depend on the sets, each [M].
    """
    k = solo.sum(1).astype(np.int64)
    changed, returning = change_counts(solo, working_set_steps)
    missing = lru_misses(_ids(solo), buffer_blocks)
    hkv = headwise.shape[1]
    head_missing = sum(lru_misses(_ids(headwise[:, h]), buffer_blocks) for h in range(hkv))
    union = headwise.any(1).sum(1).astype(np.int64)
    kk = np.maximum(k, 1)  # a step without candidates selects nothing: report 0, not 0/0
    return {
        "selected_blocks": k,
        "changed_blocks": changed,
        "change_frac": changed / kk,
        "returning_blocks": returning,
        "working_set_blocks": working_set_sizes(solo, working_set_steps),
        "missing_blocks": missing,
        "miss_frac": missing / kk,
        "headwise_union_blocks": union,
        "union_ratio": union / kk,
        "headwise_missing_head_blocks": head_missing,
        "headwise_miss_frac": head_missing / (hkv * kk),
        "solohead_fragments": missing,
        "headwise_fragments": head_missing,
    }


@torch.no_grad()
def collect_selection_stats(
    trace: TeacherForcedTrace,
    budgets_tokens: Sequence[int],
    layout: SparsePolicy,
    buffer_blocks: int | None = None,
    working_set_steps: int = 12,
    selection: str = "solohead",
) -> pd.DataFrame:
    """Selection statistics of every (budget, layer, step) of a trace (module docstring).

    Args:
        trace: from `teacher_forced_trace` (same layout).
        budgets_tokens: selected tokens per (layer, step), each >= layout.block_size.
        layout: block size, sink and recent window (its budget_tokens is not read).
        buffer_blocks: LRU recall buffer per (layer) in blocks (per KV head for head-wise); None: twice the
            budget's blocks (the simulator's default ratio, 128 buffer blocks for a 64-block budget).
        working_set_steps: w, the window of `returning_blocks`.
        selection: the shared-set selector, "solohead" (the engine's) or another of SHARED_SELECTIONS.

    Returns:
        DataFrame with STATS_COLUMNS, one row per (budget, layer, step).

    Raises:
        ValueError: if a budget is below one block, buffer_blocks is below a budget's blocks or
            working_set_steps < 1.
    """
    if working_set_steps < 1:
        raise ValueError(f"working_set_steps={working_set_steps} must be >= 1")
    p = layout.block_size
    frames = []
    for budget in budgets_tokens:
        k = budget // p
        buffer = 2 * k if buffer_blocks is None else buffer_blocks
        if k < 1 or buffer < k:
            raise ValueError(f"budget_tokens={budget} needs >= 1 block and buffer_blocks={buffer} >= {k} blocks")
        for layer, (q, summaries) in enumerate(zip(trace.q, trace.summaries)):
            scores = LayerScores(q, summaries)
            args = (q, summaries, trace.candidate, trace.resident, k)
            solo = select_attended(selection, *args, scores=scores)[:, 0] & trace.candidate
            heads = select_attended("headwise", *args, scores=scores) & trace.candidate[:, None, :]
            cols = layer_stats(solo.cpu().numpy(), heads.cpu().numpy(), buffer, working_set_steps)
            frame = pd.DataFrame(
                {
                    "budget_tokens": budget,
                    "buffer_blocks": buffer,
                    "working_set_steps": working_set_steps,
                    "layer": layer,
                    "step": np.arange(trace.steps),
                    "context_tokens": trace.positions.cpu().numpy() + 1,
                    "candidate_blocks": trace.candidate.sum(1).cpu().numpy(),
                    **cols,
                }
            )
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)[STATS_COLUMNS]


def selection_stats(
    config: DecoderConfig,
    weights: DecoderWeights,
    tokens: torch.Tensor,
    context_tokens: int,
    budgets_tokens: Sequence[int],
    layout: SparsePolicy = DEFAULT_LAYOUT,
    buffer_blocks: int | None = None,
    working_set_steps: int = 12,
    chunk_tokens: int = 512,
) -> pd.DataFrame:
    """One teacher-forced pass over tokens (context, then len(tokens) - context_tokens steps), then
    `collect_selection_stats` for every budget. Raises ValueError as those two do."""
    trace = teacher_forced_trace(config, weights, tokens, context_tokens, layout, chunk_tokens)
    return collect_selection_stats(trace, budgets_tokens, layout, buffer_blocks, working_set_steps)
