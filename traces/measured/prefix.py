"""Prefix-block hashes of prompt texts: which prompts of a measured run share which leading blocks, for the replay's
prefix cache (calibrate/measured.py ``prefix_chains`` → sim/serving/prefix.py). Standard library only."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# Tokens per prefix block of `prefix_ids`: two prompts share block i exactly when their texts agree up to its end
# (the replay's prefix cache, sim/serving/prefix.py, reads the ids with this block size).
PREFIX_BLOCK_TOKENS = 64


def text_prefix_ids(
    texts: Sequence[str | None], prompt_tokens: Sequence[int], block_tokens: int = PREFIX_BLOCK_TOKENS
) -> list[tuple[int, ...] | None]:
    """Prefix-block hashes of prompt texts: block i of a prompt ends at character round((i + 1) · block_tokens · c),
    c the run's characters per token (all texts' characters over all their tokens, so every prompt cuts at the same
    characters), and its id hashes the text up to there: two prompts share ids 0..i exactly when their texts agree
    up to block i's end. Only whole blocks within a prompt's token count get an id (the cache's hit is whole blocks).

    Args:
        texts: prompt strings, None where a request has none (its ids are None).
        prompt_tokens: each prompt's token count, as the tool counted it.
        block_tokens: tokens per block (:data:`PREFIX_BLOCK_TOKENS`).

    Returns:
        Per request a tuple of 63-bit ids (BLAKE2b of the UTF-8 text prefix), or None.
    """
    pairs = [(t, int(k)) for t, k in zip(texts, prompt_tokens, strict=True) if isinstance(t, str) and k > 0]
    chars, tokens = sum(len(t) for t, _ in pairs), sum(k for _, k in pairs)
    if not tokens or not chars:
        return [None] * len(texts)
    per_token = chars / tokens
    out: list[tuple[int, ...] | None] = []
    for text, count in zip(texts, prompt_tokens, strict=True):
        if not isinstance(text, str):
            out.append(None)
            continue
        ids, running, start = [], hashlib.blake2b(digest_size=8), 0
        for i in range(int(count) // block_tokens):
            end = round((i + 1) * block_tokens * per_token)
            if end > len(text):
                break
            running.update(text[start:end].encode("utf-8", "surrogatepass"))  # the hash of text[:end], incrementally
            ids.append(int.from_bytes(running.copy().digest(), "big") >> 1)
            start = end
        out.append(tuple(ids))
    return out
