"""Prefix reuse a request table's ``hash_ids`` allow: the prompt-token hit fraction of an LRU cache of hash blocks.

A row's ``hash_ids`` name its prompt's blocks of ``attrs["hash_block_tokens"]`` tokens (512 in Mooncake); two
prompts share block i exactly when they share ids 0..i. Offline, in arrival order: a prompt's hit is the longest
cached chain of its ids times the block size, capped at prompt − 1 (the last token is always recomputed, as SGLang
does); every id of the prompt is then touched or inserted, and past ``capacity_tokens`` the least recently used id
leaves. ``capacity_tokens=None`` is what the ids allow at all. The simulator's radix cache
(sim/serving/prefix.py) follows the same rules inside the KV pool, which running requests share.
"""

from __future__ import annotations

from collections import OrderedDict

import pandas as pd


def lru_prefix_hit_frac(requests: pd.DataFrame, capacity_tokens: int | None = None) -> float:
    """Fraction of prompt tokens an LRU cache of ``capacity_tokens`` (None: unbounded) serves from its hash blocks.

    Args:
        requests: a request table (``prompt_tokens``, ``hash_ids``) in arrival order.
        capacity_tokens: cache size in tokens (rounded down to whole hash blocks, at least one), or None.

    Raises:
        ValueError: if the table has no prompt tokens.
    """
    total = float(requests["prompt_tokens"].sum())
    if total <= 0:
        raise ValueError("the request table has no prompt tokens")
    block = int(requests.attrs.get("hash_block_tokens", 512))
    cap = None if capacity_tokens is None else max(capacity_tokens // block, 1)
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    hit = 0
    for ids, prompt in zip(requests["hash_ids"], requests["prompt_tokens"]):
        matched, chain = 0, True
        for depth, x in enumerate(ids):
            key = (depth, int(x))
            if chain and key in cache:
                matched += 1
                cache.move_to_end(key)
                continue
            chain = False
            cache[key] = None
            if cap is not None and len(cache) > cap:
                cache.popitem(last=False)
        hit += max(min(matched * block, int(prompt) - 1), 0)
    return hit / total
