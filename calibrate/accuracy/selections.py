"""The block selections the accuracy evaluation compares, over a teacher-forced trace.

Selections (`ACCURACY_SELECTIONS`); scores are the engine's Quest bounds (`engine.select.quest_scores`:
per KV head, the largest bound of its G query heads; Quest, Tang et al. 2024):
  * ``headwise``: each KV head its own top-k (`select_blocks(..., "headwise")`).
  * ``solohead``: one top-k from the raw bounds summed over KV heads, as the engine does (`"solohead"`).
  * ``solohead_norm``: one top-k from per-KV-head softmax(bound / sqrt(D)) over the candidates, summed
    over KV heads: every head contributes a distribution of total weight 1, so a head with large logits
    cannot drown the others (docs/sources.md §8: normalised sum beats the raw sum).
  * ``solohead_rank``: one set filled round-robin from the heads' own rankings (a block's key is its best
    rank over KV heads, ties broken by the normalised sum): each head gets about k / Hkv of its top
    blocks, a guard against starved heads.
  * ``solohead_box``: the engine's SoloHead aggregation (group max, sum over KV heads) over a tighter score
    from the same min/max summaries, `box_scores`: log E[exp(q . k / sqrt(D))] for keys uniform in the
    block's box, instead of Quest's bound, which rewards wide boxes. Still one set, one contiguous recall
    per block.
  * ``streaming``: the k candidates next to the recent window, so sink + one longer recent window with
    the same attended tokens (StreamingLLM-like; no scoring).
  * ``oracle``: per KV head, the k candidates with the largest true attention mass of this step (summed
    over the head's G query heads). At the same k it captures, per (step, layer, KV head), at least the
    group mass of any other selection: the upper bound.

Dimension names as in calibrate/accuracy/trace.py: M steps, NB blocks, H query heads, Hkv KV heads,
G = H // Hkv, D head_dim, T tokens, P block_size.
"""

from __future__ import annotations

import torch

from calibrate.accuracy.trace import block_mass
from engine.select import quest_scores, select_blocks

ACCURACY_SELECTIONS = (
    "headwise", "solohead", "solohead_norm", "solohead_rank", "solohead_box", "streaming", "oracle",
)  # fmt: skip
SHARED_SELECTIONS = ("solohead", "solohead_norm", "solohead_rank", "solohead_box")  # one block set for all KV heads


def select_attended(
    selection: str,
    q: torch.Tensor,
    summaries: torch.Tensor,
    candidate: torch.Tensor,
    resident: torch.Tensor,
    k: int,
    probs: torch.Tensor | None = None,
    block_size: int = 16,
    scores: LayerScores | None = None,
) -> torch.Tensor:
    """Blocks each KV head attends at every step: the resident ones plus the selection's k candidates.

    Args:
        selection: one of ACCURACY_SELECTIONS.
        q: [M, H, D] queries after RoPE.
        summaries: [NB, 2, Hkv, D] block key min/max.
        candidate, resident: bool [M, NB] from `block_masks`.
        k: selected candidate blocks per (step, KV head), >= 0; all candidates when there are fewer.
        probs: float32 [M, Hkv, G, T] dense probabilities of q; needed by "oracle" only.
        block_size: P, for "oracle".
        scores: the layer's `LayerScores(q, summaries)`, to share scores between selections and budgets;
            None makes a fresh one.

    Returns:
        bool [M, Hkv, NB].

    Raises:
        ValueError: if selection is unknown, or "oracle" gets no probs.
    """
    m, nb = candidate.shape
    hkv = summaries.shape[2]
    scores = LayerScores(q, summaries) if scores is None else scores
    if selection == "oracle":
        if probs is None:
            raise ValueError("selection 'oracle' needs the dense attention probs")
        picked = _top_k(block_mass(probs, block_size).sum(2), candidate, k)
    elif selection == "streaming":
        order = torch.arange(nb, device=q.device, dtype=torch.float32).expand(m, hkv, nb)
        picked = _top_k(order, candidate, k)
    elif selection in ("headwise", "solohead"):
        index, chosen = select_blocks(scores.quest, candidate, k, selection)
        picked = torch.zeros(m, hkv, nb, dtype=torch.bool, device=q.device)
        picked.scatter_(2, index, chosen)
    elif selection == "solohead_box":
        picked = _top_k(scores.box.sum(2)[:, None, :], candidate, k).expand(m, hkv, nb)
    elif selection in ("solohead_norm", "solohead_rank"):
        per_head = scores.quest.transpose(1, 2)  # [M, Hkv, NB]
        norm = _normalised(per_head / q.shape[-1] ** 0.5, candidate)
        shared = norm.sum(1) if selection == "solohead_norm" else _round_robin_key(per_head, norm, candidate)
        picked = _top_k(shared[:, None, :], candidate, k).expand(m, hkv, nb)
    else:
        raise ValueError(f"selection={selection!r} must be one of {ACCURACY_SELECTIONS}")
    return picked | resident[:, None, :]


class LayerScores:
    """Block scores of one layer's queries, each computed on first use and then shared by every selection and
    budget. q: [M, H, D] after RoPE; summaries: [NB, 2, Hkv, D]."""

    def __init__(self, q: torch.Tensor, summaries: torch.Tensor) -> None:
        self.q, self.summaries = q, summaries
        self._quest: torch.Tensor | None = None
        self._box: torch.Tensor | None = None

    @property
    def quest(self) -> torch.Tensor:
        """float32 [M, NB, Hkv], `block_scores`."""
        if self._quest is None:
            self._quest = block_scores(self.q, self.summaries)
        return self._quest

    @property
    def box(self) -> torch.Tensor:
        """float32 [M, NB, Hkv], `box_scores`."""
        if self._box is None:
            self._box = box_scores(self.q, self.summaries)
        return self._box


def block_scores(q: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Quest bounds of every block for every step: q [M, H, D], summaries [NB, 2, Hkv, D] -> float32 [M, NB, Hkv]."""
    return quest_scores(q, summaries[None].expand(q.shape[0], *summaries.shape))


def box_scores(q: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """log E[exp(q . k / sqrt(D))] for keys uniform in each block's min/max box, the largest of each KV head's group.

    Per channel, E[exp(q_d k_d)] for k_d ~ U(min_d, max_d) is exp(q_d mid_d) sinh(x_d) / x_d with mid_d the box
    centre and x_d = |q_d| (max_d - min_d) / 2, so the score is q . mid + sum_d log(sinh(x_d) / x_d): always below
    Quest's bound q . mid + sum_d x_d (log(sinh x / x) < x), whose range term over-rewards wide blocks.
    Same summaries as Quest, a [M, H, NB, D] elementwise pass more.

    Args:
        q: [M, H, D] queries after RoPE.
        summaries: [NB, 2, Hkv, D].

    Returns:
        float32 [M, NB, Hkv].
    """
    m, h, d = q.shape
    hkv = summaries.shape[2]
    qg = q.float().view(m, hkv, h // hkv, d) / d**0.5
    kmin, kmax = summaries[:, 0].float(), summaries[:, 1].float()  # [NB, Hkv, D]
    half = ((kmax - kmin) / 2).transpose(0, 1)  # [Hkv, NB, D]
    x = (qg.abs()[:, :, :, None, :] * half[None, :, None]).clamp_(min=1e-6)  # [M, Hkv, G, NB, D]
    # log(sinh x / x) = x + log((1 - exp(-2x)) / (2x)); expm1 keeps it exact for small x. In place: the
    # [M, H, NB, D] temporary is the cost of this score (76 MB at 8K context, 64 steps).
    spread = torch.expm1(x * -2).neg_().div_(x.mul_(2)).log_().add_(x.mul_(0.5)).sum(-1)  # [M, Hkv, G, NB]
    score = torch.einsum("mkgd,nkd->mkgn", qg, (kmin + kmax) / 2) + spread
    return score.amax(2).transpose(1, 2)


def _top_k(scores: torch.Tensor, candidate: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of the k best candidates per row: scores float [M, X, NB], candidate bool [M, NB] -> bool [M, X, NB]."""
    masked = scores.masked_fill(~candidate[:, None, :], float("-inf"))
    k = min(k, scores.shape[-1])
    index = masked.topk(k, dim=-1).indices
    picked = torch.zeros(masked.shape, dtype=torch.bool, device=scores.device)
    picked.scatter_(2, index, candidate[:, None, :].expand(masked.shape).gather(2, index))
    return picked


def _normalised(logits: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """Softmax over each row's candidates: logits [M, Hkv, NB] -> float32 [M, Hkv, NB], 0 off the candidates."""
    masked = logits.masked_fill(~candidate[:, None, :], float("-inf")).softmax(-1)
    return masked.nan_to_num(0.0)  # a step without candidates gives 0/0


def _round_robin_key(scores: torch.Tensor, norm: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """Shared key [M, NB]: higher for a better best-rank over KV heads; the normalised sum breaks ties."""
    masked = scores.masked_fill(~candidate[:, None, :], float("-inf"))
    rank = masked.argsort(-1, descending=True).argsort(-1)  # [M, Hkv, NB], 0 = the head's best block
    best = rank.amin(1).float()  # [M, NB]
    return -best + norm.sum(1) / (norm.shape[1] + 1.0)  # the tie-break term stays < 1
