"""The prefix cache (sim/serving/prefix.py) without eviction: the most any cache could hit on a trace."""

from __future__ import annotations

from collections.abc import Sequence

from sim.serving.prefix import PrefixCache


def unbounded_hit_tokens(
    hash_id_lists: Sequence[Sequence[int]], prompt_tokens: Sequence[int], block_tokens: int
) -> list[int]:
    """Hit tokens of each request in order against a cache that never evicts (what ``hash_ids`` allow).

    Each request's chain is inserted after its match, so later requests can hit it.
    """
    cache = PrefixCache(1)
    hits = []
    for ids, prompt in zip(hash_id_lists, prompt_tokens):
        path, hit, _ = cache.acquire(ids, int(prompt), block_tokens, 0.0)
        cache.release(path, 0.0)
        hits.append(hit)
    return hits
