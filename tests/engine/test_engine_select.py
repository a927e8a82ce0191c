"""Selection: Quest scores bound q . k, top-k equals a brute-force reference, SoloHead gives every head one set."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.select import budget_blocks, quest_scores, select_blocks  # noqa: E402
from engine.summaries import BlockSummaries, summarize_keys  # noqa: E402

B, C, H, HKV, D, P = 3, 9, 8, 2, 16, 4


@pytest.fixture
def case():
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(B, C, P, HKV, D, generator=gen)  # [B, C, P, Hkv, D]
    q = torch.randn(B, H, D, generator=gen)
    summaries = summarize_keys(keys.view(B * C, P, HKV, D)).view(B, C, 2, HKV, D)
    valid = torch.ones(B, C, dtype=torch.bool)
    valid[1, 5:] = False  # request 1 has 5 candidates, request 2 has 2
    valid[2, 2:] = False
    return q, keys, summaries, valid


def _reference_scores(q, summaries):
    """Quest's bound, one (request, block, query head) at a time, then the max over each KV head's group."""
    out = torch.empty(B, C, HKV)
    for b in range(B):
        for c in range(C):
            for kv in range(HKV):
                bounds = []
                for g in range(H // HKV):
                    qh = q[b, kv * (H // HKV) + g]
                    mn, mx = summaries[b, c, 0, kv], summaries[b, c, 1, kv]
                    bounds.append(torch.maximum(qh * mn, qh * mx).sum())
                out[b, c, kv] = max(bounds)
    return out


def _reference_topk(scores, valid, k):
    """Sets of candidate indices: per (request, head) the k best valid ones."""
    out = []
    for b in range(scores.shape[0]):
        ranked = [c for c in sorted(range(scores.shape[1]), key=lambda c: -float(scores[b, c])) if valid[b, c]]
        out.append(set(ranked[:k]))
    return out


def test_quest_scores_equal_the_per_head_formula(case):
    q, _, summaries, _ = case
    torch.testing.assert_close(quest_scores(q, summaries), _reference_scores(q, summaries), rtol=1e-5, atol=1e-5)


def test_quest_score_bounds_every_query_key_product_in_the_block(case):
    q, keys, summaries, _ = case
    qg = q.view(B, HKV, H // HKV, D)
    dots = torch.einsum("bkgd,bcpkd->bckgp", qg, keys).amax(dim=(-1, -2))  # best key of the group, [B, C, Hkv]
    assert bool((quest_scores(q, summaries) >= dots - 1e-5).all())


@pytest.mark.parametrize("k", [0, 1, 3, 5, 20])
def test_headwise_selection_equals_brute_force(case, k):
    q, _, summaries, valid = case
    scores = quest_scores(q, summaries)
    index, chosen = select_blocks(scores, valid, k, "headwise")
    assert index.shape == (B, HKV, min(k, C))
    for kv in range(HKV):
        expected = _reference_topk(scores[:, :, kv], valid, k)
        got = [set(index[b, kv][chosen[b, kv]].tolist()) for b in range(B)]
        assert got == expected


@pytest.mark.parametrize("k", [1, 4, 20])
def test_solohead_selects_the_same_set_for_every_head(case, k):
    q, _, summaries, valid = case
    scores = quest_scores(q, summaries)
    index, chosen = select_blocks(scores, valid, k, "solohead")
    expected = _reference_topk(scores.sum(-1), valid, k)
    for b in range(B):
        sets = {frozenset(index[b, kv][chosen[b, kv]].tolist()) for kv in range(HKV)}
        assert sets == {frozenset(expected[b])}


def test_padding_candidates_are_never_chosen(case):
    q, _, summaries, valid = case
    for selection in ("headwise", "solohead"):
        index, chosen = select_blocks(quest_scores(q, summaries), valid, 4, selection)
        picked = valid[:, None, :].expand(B, HKV, C).gather(2, index)
        assert bool((picked | ~chosen).all())
        assert chosen[2].sum(-1).tolist() == [2, 2]  # only 2 valid candidates


def test_bad_arguments_raise_value_error(case):
    q, _, summaries, valid = case
    scores = quest_scores(q, summaries)
    with pytest.raises(ValueError, match="selection='oracle'"):
        select_blocks(scores, valid, 2, "oracle")
    with pytest.raises(ValueError, match="k=-1"):
        select_blocks(scores, valid, -1, "headwise")
    with pytest.raises(ValueError, match="budget_tokens=-1"):
        budget_blocks(-1, 16)
    assert budget_blocks(100, 32) == 3


def test_summaries_store_min_and_max_under_host_ids():
    keys = torch.tensor([[[[1.0, -2.0]], [[3.0, 0.5]]]])  # [1 block, P=2, Hkv=1, D=2]
    table = BlockSummaries(1, 4, 1, 2, torch.float32)
    table.update(0, torch.tensor([2]), keys)
    assert table.layers[0][2].tolist() == [[[1.0, -2.0]], [[3.0, 0.5]]]
    assert table.gather(0, torch.tensor([[2, 0]])).shape == (1, 2, 2, 1, 2)
    with pytest.raises(ValueError, match="host_ids has 2 ids but keys has 1 blocks"):
        table.update(0, torch.tensor([0, 1]), keys)
