"""Sparse block selection: Quest-style upper-bound scores, then head-wise or SoloHead top-k.

Candidates are a request's offloaded blocks only; the sink and the recent window are resident and
always attended, so they are never scored here. The budget counts the selected blocks' tokens:
`budget_blocks = budget_tokens // block_size` blocks per (request, layer, KV head).

* head-wise: every KV head picks its own top-k blocks, so a recall fragments into (block, head) pieces.
* SoloHead: one top-k per (request, layer) from scores summed over KV heads; every head gets that set,
  so each recalled block is one contiguous chunk in the block-major pool.

Scores: for query head h and block b, Quest's bound is sum_d max(q_d * min_d, q_d * max_d) >= q . k for
every key k in b. A KV head serves G query heads; its score is the largest of their bounds (the block
matters if any of them may attend to it). Dimension names: B requests, C candidate blocks, H query heads,
Hkv KV heads, G = H // Hkv, D head_dim, K selected blocks.
"""

from __future__ import annotations

import torch

SELECTIONS = ("headwise", "solohead")


def budget_blocks(budget_tokens: int, block_size: int) -> int:
    """Whole blocks that fit in the budget. Raises ValueError if budget_tokens < 0 or block_size < 1."""
    if budget_tokens < 0 or block_size < 1:
        raise ValueError(f"budget_tokens={budget_tokens} must be >= 0 and block_size={block_size} >= 1")
    return budget_tokens // block_size


def quest_scores(q: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Upper bounds of q . k per (request, candidate, KV head).

    Args:
        q: [B, H, D] post-RoPE queries, any float dtype.
        summaries: [B, C, 2, Hkv, D] key min (index 0) and max (index 1), same device.

    Returns:
        float32 [B, C, Hkv].
    """
    b, h, d = q.shape
    hkv = summaries.shape[3]
    qg = q.float().view(b, hkv, h // hkv, d)
    kmin, kmax = summaries[:, :, 0].float(), summaries[:, :, 1].float()  # [B, C, Hkv, D]
    # max(q*min, q*max) = relu(q)*max + min(q, 0)*min, channel by channel: two matmuls, no [B, C, H, D] temporary.
    bound = torch.einsum("bkgd,bckd->bckg", qg.clamp(min=0), kmax) + torch.einsum(
        "bkgd,bckd->bckg", qg.clamp(max=0), kmin
    )
    return bound.amax(dim=-1)


def select_blocks(
    scores: torch.Tensor, valid: torch.Tensor, k: int, selection: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k candidates per (request, KV head).

    Args:
        scores: float32 [B, C, Hkv] from `quest_scores`.
        valid: bool [B, C], False for padding candidates.
        k: blocks to select, 0 <= k; capped at C.
        selection: "headwise" or "solohead".

    Returns:
        (index int64 [B, Hkv, k'] into C, chosen bool [B, Hkv, k']) with k' = min(k, C); `chosen` is False
        where a request has fewer than k' valid candidates. Under "solohead" every head's row is the same.

    Raises:
        ValueError: if selection is unknown or k < 0.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"selection={selection!r} must be one of {SELECTIONS}")
    if k < 0:
        raise ValueError(f"k={k} must be >= 0")
    b, c, hkv = scores.shape
    k = min(k, c)
    if selection == "solohead":
        masked = scores.sum(dim=-1).masked_fill(~valid, float("-inf"))  # [B, C]
        index = masked.topk(k, dim=-1).indices[:, None, :].expand(b, hkv, k)
    else:
        masked = scores.masked_fill(~valid[:, :, None], float("-inf")).transpose(1, 2)  # [B, Hkv, C]
        index = masked.topk(k, dim=-1).indices
    chosen = valid[:, None, :].expand(b, hkv, c).gather(2, index)
    return index, chosen
