"""Decode attention, dense and over paged KV blocks (GQA-aware).

Dimension names: B requests, H query heads, Hkv KV heads, G = H // Hkv, D head_dim, S device blocks,
P block_size (tokens per block), N device blocks attended per request, T tokens.

Sparse decode attention reads, for every request, a list of device block ids (resident sink and recent
blocks plus the arena blocks the recall just filled) and a count of valid tokens in each. An arena block
may hold different logical blocks for different KV heads (head-wise recall puts head h's i-th selected
block in arena block i), which is why attention indexes the pool per device block and keeps the KV-head
axis intact. Softmax runs in
float32. With every block of the context listed, the result equals dense attention up to the order of
summation (softmax is permutation-invariant over keys).
"""

from __future__ import annotations

import torch


def _grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q [B, H, D]; k, v [B, N, Hkv, D]; valid bool [B, N] -> [B, H, D] in q.dtype."""
    b, h, d = q.shape
    hkv = k.shape[2]
    qg = q.float().view(b, hkv, h // hkv, d)
    scores = torch.einsum("bkgd,bnkd->bkgn", qg, k.float()) / d**0.5  # [B, Hkv, G, N]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = scores.softmax(-1)
    return torch.einsum("bkgn,bnkd->bkgd", probs, v.float()).reshape(b, h, d).to(q.dtype)


def dense_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """One query token per request against its contiguous KV cache.

    Args:
        q: [B, H, D], float dtype.
        k: [B, T, Hkv, D], same dtype and device as q; H % Hkv == 0.
        v: [B, T, Hkv, D].
        lengths: int64 [B], valid tokens per request (the rest is padding); None means all T.

    Returns:
        [B, H, D] in q.dtype.

    Raises:
        ValueError: if H is not a multiple of Hkv or k and v shapes differ.
    """
    if k.shape != v.shape or q.shape[1] % k.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must match and divide q {tuple(q.shape)}")
    t = k.shape[1]
    if lengths is None:
        valid = torch.ones(k.shape[0], t, dtype=torch.bool, device=q.device)
    else:
        valid = torch.arange(t, device=q.device)[None, :] < lengths[:, None]
    return _grouped_attention(q, k, v, valid)


def sparse_decode_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_ids: torch.Tensor,
    block_tokens: torch.Tensor,
    counts: list[int] | None = None,
) -> torch.Tensor:
    """One query token per request against the listed device blocks of one layer.

    Args:
        q: [B, H, D], the pool's dtype and device.
        kv_layer: [S, 2, P, Hkv, D], device pool of one layer (index 0 of dim 1 is K, 1 is V).
        block_ids: int64 [B, N], device block ids in [0, S), same device; padding entries may be any valid id.
        block_tokens: int64 [B, N], valid tokens in each listed block, in [0, P] (0 for padding); a partly filled
            block holds its tokens at offsets 0..n-1.
        counts: host ints [B] or None. When given, row b's own entries are its first counts[b] and each
            request attends only those (one gather per request): the cost follows the sum of the contexts,
            as a paged-attention kernel's does, instead of B x the longest (the padded single gather).

    Returns:
        [B, H, D] in q.dtype.

    Raises:
        ValueError: if shapes disagree.
    """
    b, n = block_ids.shape
    _, two, p, hkv, d = kv_layer.shape
    if block_tokens.shape != block_ids.shape or q.shape[0] != b or q.shape[2] != d or q.shape[1] % hkv:
        raise ValueError(
            f"q {tuple(q.shape)}, block_ids {tuple(block_ids.shape)}, block_tokens {tuple(block_tokens.shape)} "
            f"do not fit kv_layer {tuple(kv_layer.shape)}"
        )
    if counts is not None:
        if len(counts) != b:
            raise ValueError(f"counts has {len(counts)} entries for {b} requests")
        return torch.cat(
            [
                sparse_decode_attention(q[i : i + 1], kv_layer, block_ids[i : i + 1, :c], block_tokens[i : i + 1, :c])
                for i, c in enumerate(counts)
            ]
        )
    kv = kv_layer[block_ids.reshape(-1)].view(b, n, two, p, hkv, d)  # Hot path: one gather for all requests
    k = kv[:, :, 0].reshape(b, n * p, hkv, d)
    v = kv[:, :, 1].reshape(b, n * p, hkv, d)
    offsets = torch.arange(p, device=block_ids.device)
    valid = (offsets[None, None, :] < block_tokens[:, :, None]).reshape(b, n * p)
    return _grouped_attention(q, k, v, valid)
