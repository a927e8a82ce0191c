"""The offline prefix-reuse reference (traces/reuse.py) on hand-counted request tables."""

from __future__ import annotations

import pandas as pd
import pytest

from traces.reuse import lru_prefix_hit_frac


def _table(rows: list[tuple[int, list[int]]], block: int = 4) -> pd.DataFrame:
    df = pd.DataFrame({"prompt_tokens": [p for p, _ in rows], "hash_ids": [ids for _, ids in rows]})
    df.attrs["hash_block_tokens"] = block
    return df


def test_unbounded_hits_are_the_longest_shared_chain():
    # prompt 2 shares blocks 0-1 of prompt 1 (8 tokens), prompt 3 shares only block 0 (4), prompt 4 all of
    # prompt 3 but is capped at its length - 1 (11 of 12)
    df = _table([(12, [1, 2, 3]), (12, [1, 2, 9]), (8, [1, 7]), (12, [1, 7, 5]), (12, [1, 7, 5])])
    assert lru_prefix_hit_frac(df) == pytest.approx((0 + 8 + 4 + 8 + 11) / 56)


def test_a_chain_breaks_at_the_first_miss():
    # same id 3 at depth 2 but a different block 1: no hit past block 0
    df = _table([(12, [1, 2, 3]), (12, [1, 4, 3])])
    assert lru_prefix_hit_frac(df) == pytest.approx(4 / 24)


def test_lru_capacity_evicts_the_least_recently_used_block():
    rows = [(8, [1, 2]), (8, [3, 4]), (8, [1, 2])]
    assert lru_prefix_hit_frac(_table(rows), capacity_tokens=12) == pytest.approx(0.0)  # 3 blocks: 1 evicted by 4
    assert lru_prefix_hit_frac(_table(rows), capacity_tokens=16) == pytest.approx(7 / 24)  # all 4 fit; capped at 8 - 1
    assert lru_prefix_hit_frac(_table(rows), capacity_tokens=None) == pytest.approx(7 / 24)


def test_empty_prompts_are_refused():
    with pytest.raises(ValueError, match="no prompt tokens"):
        lru_prefix_hit_frac(_table([(0, [])]))
