"""Teacher-forced accuracy of sparse block attention against dense attention on one text.

Protocol (one prefill shared by every selection and budget):
  1. Dense chunked prefill of the first N = ``context_tokens`` tokens (`engine.generate.prefill_chunked`).
  2. Dense teacher-forced extension over the next M = ``steps`` true tokens in one batched causal pass
     (`teacher_forced_trace`): step t feeds token N + t at position N + t and attends to keys 0..N+t, as
     M single decode steps would. Per layer it keeps the residual input x [M, E], the query q [M, H, D]
     and the whole K, V [N + M, Hkv, D]; it also keeps the dense next-token logits [M, V].
  3. Dense-stream metrics: at every layer >= ``dense_layers`` each selection picks blocks with the dense
     q; captured attention mass and the attention-output error are measured against dense attention of
     the same q, so errors of earlier layers do not feed in.
  4. Sparse forward, per (selection, budget): from layer ``dense_layers`` on, every layer attends only to
     its resident and selected blocks, selected with the query of the sparse residual stream; the
     next-token logits are compared with the dense ones (argmax agreement, KL).

Model assumption (KV of the sparse forward): keys and values are the dense pass's (the true tokens
through the dense model) at every position, the current one included; a sparse forward changes only
which of them each layer attends to. Steps are therefore independent: error does not build up through
the cache, so KL and argmax measure one step of sparse decoding, not a long sparse generation.

Block layout of step t (DESIGN.md "sink", "recent window"; 16-token blocks as in MODEL.md): the context
holds N + t + 1 tokens in ceil((N + t + 1) / P) blocks; the first ``sink_tokens`` / P and the last
``recent_tokens`` / P (the partly filled tail among them) are resident; the full blocks in between are
the candidates, of which a selection attends k = budget_tokens // P.

Selections (`ACCURACY_SELECTIONS`); scores are the engine's Quest bounds (`engine.select.quest_scores`:
per KV head, the largest bound of its G query heads; Quest, Tang et al. 2024):
  * ``headwise``: each KV head its own top-k (`select_blocks(..., "headwise")`).
  * ``solohead``: one top-k from the raw bounds summed over KV heads, as the engine does (`"solohead"`).
  * ``solohead_norm``: one top-k from per-KV-head softmax(bound / sqrt(D)) over the candidates, summed
    over KV heads: every head contributes a distribution of total weight 1, so a head with large logits
    cannot drown the others (MODEL.md: normalised sum beats the raw sum).
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

Metrics (`ACCURACY_COLUMNS`), over steps and layers >= ``dense_layers``:
  * ``mass_mean``: mean over (step, layer, query head) of the dense attention probability on attended
    tokens (dense stream).
  * ``mass_worst_head``: per step the minimum of that mass over (layer, query head), then the mean over
    steps: how badly the most starved head of a step fares, on average.
  * ``rel_l2``: per (step, layer) ||o_sparse - o_dense|| / ||o_dense|| over the layer's whole attention
    output [H * D] (the input of the output projection), then the mean (dense stream).
  * ``argmax_agreement``: fraction of steps whose sparse-forward argmax equals the dense argmax.
  * ``kl_nats``: mean over steps of KL(p_dense || p_sparse) of the next-token distributions, in nats.

Dimension names: N context tokens, M steps, T = N + M tokens of K/V, NB = ceil(T / P) blocks, P block_size,
E hidden, H query heads, Hkv KV heads, G = H // Hkv, D head_dim, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch

from engine.kv_cache import check_resident_layout
from engine.model import DecoderConfig, DecoderWeights, finish_layer, logits_of, project_qkv, project_query
from engine.select import quest_scores, select_blocks
from engine.summaries import summarize_keys

ACCURACY_SELECTIONS = (
    "headwise", "solohead", "solohead_norm", "solohead_rank", "solohead_box", "streaming", "oracle",
)  # fmt: skip
SHARED_SELECTIONS = ("solohead", "solohead_norm", "solohead_rank", "solohead_box")  # one block set for all KV heads
ACCURACY_COLUMNS = [
    "selection", "budget_tokens", "context_tokens", "mass_mean", "mass_worst_head", "rel_l2", "argmax_agreement",
    "kl_nats",
]  # fmt: skip
DEFAULT_STEPS = 64  # decode steps per evaluation: 1/64 resolution of argmax agreement, seconds per sparse forward


@dataclass(frozen=True)
class BlockLayout:
    """What stays resident: token counts per (layer, step), multiples of ``block_size`` (engine SparsePolicy)."""

    block_size: int = 16  # P, tokens per block
    sink_tokens: int = 16  # always attended prefix
    recent_tokens: int = 64  # always attended suffix, including the partly filled tail block

    def __post_init__(self) -> None:
        check_resident_layout(self.block_size, self.sink_tokens, self.recent_tokens)

    @property
    def resident_tokens(self) -> int:
        """Sink plus recent window: tokens always attended."""
        return self.sink_tokens + self.recent_tokens


@dataclass(frozen=True)
class AccuracySettings:
    """One evaluation: budgets × selections at one context length (see the module docstring)."""

    context_tokens: int = 2048  # N, prefilled tokens
    steps: int = DEFAULT_STEPS  # M, teacher-forced decode steps
    budgets_tokens: tuple[int, ...] = (256, 512, 1024)  # selected tokens per (layer, step); k = budget // P
    selections: tuple[str, ...] = ("headwise", "solohead", "solohead_norm", "solohead_box", "streaming", "oracle")
    dense_layers: int = 2  # layers below this attend densely (MODEL.md: layers 0-1 attend diffusely)
    layout: BlockLayout = field(default_factory=BlockLayout)
    chunk_tokens: int = 512  # prefill chunk

    def __post_init__(self) -> None:
        for name in ("context_tokens", "steps", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.dense_layers < 0:
            raise ValueError(f"dense_layers={self.dense_layers} must be >= 0")
        bad = [b for b in self.budgets_tokens if b < self.layout.block_size]
        if not self.budgets_tokens or bad:
            raise ValueError(
                f"budgets_tokens={list(self.budgets_tokens)} must be non-empty, each >= block_size="
                f"{self.layout.block_size}"
            )
        unknown = [s for s in self.selections if s not in ACCURACY_SELECTIONS]
        if not self.selections or unknown:
            raise ValueError(f"selections={list(self.selections)} must be non-empty, from {ACCURACY_SELECTIONS}")


@dataclass
class TeacherForcedTrace:
    """The dense teacher-forced pass (steps 1-2 of the module docstring); every tensor on the weights' device."""

    context_tokens: int  # N
    x_in: list[torch.Tensor]  # per layer, residual-stream input [M, E], config dtype
    q: list[torch.Tensor]  # per layer, query after RoPE [M, H, D]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (k, v) [T, Hkv, D], keys after RoPE
    summaries: list[torch.Tensor]  # per layer, [NB, 2, Hkv, D] key min/max (zeros for the partial tail block)
    logits: torch.Tensor  # float32 [M, V], dense next-token logits
    candidate: torch.Tensor  # bool [M, NB], selectable blocks of each step
    resident: torch.Tensor  # bool [M, NB], sink and recent blocks of each step

    @property
    def steps(self) -> int:
        return self.logits.shape[0]

    @property
    def positions(self) -> torch.Tensor:
        """int64 [M], position of each step's token."""
        return self.context_tokens + torch.arange(self.steps, device=self.logits.device)


def block_masks(
    context_tokens: int, steps: int, layout: BlockLayout, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate and resident blocks of every step (module docstring, "Block layout").

    Returns:
        (candidate bool [M, NB], resident bool [M, NB]), NB = ceil((N + M) / P).
    """
    p = layout.block_size
    num_blocks = -(-(context_tokens + steps) // p)
    ctx_blocks = -(-(context_tokens + 1 + torch.arange(steps, device=device)) // p)  # [M] blocks in use at step t
    b = torch.arange(num_blocks, device=device)[None, :]
    in_use = b < ctx_blocks[:, None]
    sink = b < layout.sink_tokens // p
    recent = b >= ctx_blocks[:, None] - layout.recent_tokens // p
    resident = in_use & (sink | recent)
    return in_use & ~resident, resident


@torch.no_grad()
def teacher_forced_trace(
    config: DecoderConfig,
    weights: DecoderWeights,
    tokens: torch.Tensor,
    context_tokens: int,
    layout: BlockLayout,
    chunk_tokens: int = 512,
) -> TeacherForcedTrace:
    """Dense prefill of tokens[:N], then one batched teacher-forced pass over the M = len(tokens) - N rest.

    Args:
        config, weights: the decoder.
        tokens: int64 [N + M], on the weights' device; M >= 1.
        context_tokens: N >= 1.
        layout: block size, sink and recent window.
        chunk_tokens: prefill chunk.

    Raises:
        ValueError: if tokens is not 1-D int64 longer than context_tokens.
    """
    from engine.generate import prefill_chunked

    if tokens.dim() != 1 or tokens.dtype != torch.int64 or not 1 <= context_tokens < tokens.shape[0]:
        raise ValueError(
            f"tokens (shape {tuple(tokens.shape)}, {tokens.dtype}) must be 1-D int64 with more than "
            f"context_tokens={context_tokens} >= 1 entries"
        )
    _, prefix = prefill_chunked(config, weights, tokens[:context_tokens], chunk_tokens=chunk_tokens)
    steps = tokens.shape[0] - context_tokens
    positions = torch.arange(context_tokens, tokens.shape[0], device=tokens.device)
    x = weights.embed[tokens[context_tokens:]]
    x_in, qs, kv, summaries = [], [], [], []
    for layer, (k_prefix, v_prefix) in zip(weights.layers, prefix):
        x_in.append(x)
        q, k, v = project_qkv(config, layer, x, positions)
        k_all, v_all = torch.cat([k_prefix, k]), torch.cat([v_prefix, v])
        qs.append(q)
        kv.append((k_all, v_all))
        summaries.append(_summaries(k_all, layout.block_size))
        probs = attention_probs(q, k_all, positions)
        x = finish_layer(config, layer, x, dense_output(probs, v_all).to(x.dtype))
    candidate, resident = block_masks(context_tokens, steps, layout, tokens.device)
    logits = logits_of(config, weights, x)
    return TeacherForcedTrace(context_tokens, x_in, qs, kv, summaries, logits, candidate, resident)


def _summaries(keys: torch.Tensor, block_size: int) -> torch.Tensor:
    """keys [T, Hkv, D] -> [NB, 2, Hkv, D]: full blocks summarised, the partial tail (never a candidate) zero."""
    t, hkv, d = keys.shape
    full = t // block_size
    out = torch.zeros(-(-t // block_size), 2, hkv, d, dtype=keys.dtype, device=keys.device)
    out[:full] = summarize_keys(keys[: full * block_size].view(full, block_size, hkv, d))
    return out


def attention_probs(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Dense causal attention probabilities of M queries: q [M, H, D], k [T, Hkv, D], positions int64 [M].

    Returns:
        float32 [M, Hkv, G, T]; zero beyond each query's position.
    """
    m, h, d = q.shape
    hkv = k.shape[1]
    logits = torch.einsum("mkgd,tkd->mkgt", q.float().view(m, hkv, h // hkv, d), k.float()) / d**0.5
    future = torch.arange(k.shape[0], device=q.device)[None, :] > positions[:, None]  # [M, T]
    return logits.masked_fill(future[:, None, None, :], float("-inf")).softmax(-1)


def dense_output(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """probs float32 [M, Hkv, G, T], v [T, Hkv, D] -> float32 [M, H, D]."""
    m, hkv, g, _ = probs.shape
    return torch.einsum("mkgt,tkd->mkgd", probs, v.float()).reshape(m, hkv * g, -1)


def block_mass(probs: torch.Tensor, block_size: int) -> torch.Tensor:
    """Attention probability per block: probs [M, Hkv, G, T] -> float32 [M, Hkv, G, NB]."""
    t = probs.shape[-1]
    pad = -t % block_size
    padded = torch.nn.functional.pad(probs, (0, pad))
    return padded.view(*probs.shape[:-1], -1, block_size).sum(-1)


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


def token_mask(blocks: torch.Tensor, block_size: int, num_tokens: int) -> torch.Tensor:
    """Block mask [..., NB] -> token mask [..., T]."""
    return blocks.repeat_interleave(block_size, dim=-1)[..., :num_tokens]


def sparse_output(probs: torch.Tensor, attended: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention restricted to the attended tokens, from the dense probabilities of the same query.

    Softmax over a subset equals the dense softmax renormalised on it, so this is exact sparse attention.

    Args:
        probs: float32 [M, Hkv, G, T].
        attended: bool [M, Hkv, T].
        v: [T, Hkv, D].

    Returns:
        (output float32 [M, H, D], captured mass float32 [M, H]).
    """
    m, hkv, g, _ = probs.shape
    kept = probs * attended[:, :, None, :]
    mass = kept.sum(-1)  # [M, Hkv, G]
    out = torch.einsum("mkgt,tkd->mkgd", kept, v.float()) / mass.clamp_min(1e-30)[..., None]
    return out.reshape(m, hkv * g, -1), mass.reshape(m, hkv * g)


@torch.no_grad()
def evaluate_accuracy(
    config: DecoderConfig,
    weights: DecoderWeights,
    tokens: torch.Tensor,
    settings: AccuracySettings,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """Sparse vs dense attention on one text (module docstring), every selection × budget.

    Args:
        config, weights: the decoder.
        tokens: int64 [>= context_tokens + steps] on the weights' device; the first N are the context, the
            next M the teacher-forced decode tokens (the rest is ignored).
        settings: what to evaluate.
        progress: called with 1 after each of `num_work_units(settings)` units of work.

    Returns:
        DataFrame with ACCURACY_COLUMNS, one row per (selection, budget_tokens) in settings order.

    Raises:
        ValueError: if tokens is too short or dense_layers > num_layers.
    """
    n, m = settings.context_tokens, settings.steps
    if tokens.shape[0] < n + m:
        raise ValueError(f"tokens has {tokens.shape[0]} entries; context_tokens + steps = {n + m} are needed")
    if settings.dense_layers > config.num_layers:
        raise ValueError(f"dense_layers={settings.dense_layers} must be <= num_layers={config.num_layers}")
    tick = progress or (lambda _: None)
    trace = teacher_forced_trace(config, weights, tokens[: n + m], n, settings.layout, settings.chunk_tokens)
    tick(1)
    stream = dense_stream_metrics(trace, settings)
    tick(1)
    rows = []
    for selection in settings.selections:
        for budget in settings.budgets_tokens:
            logits = sparse_forward(config, weights, trace, selection, budget, settings)
            argmax, kl = next_token_agreement(trace.logits, logits)
            rows.append((selection, budget, n, *stream[(selection, budget)], argmax, kl))
            tick(1)
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS)


def num_work_units(settings: AccuracySettings) -> int:
    """Progress units of `evaluate_accuracy`: trace, dense-stream metrics, one sparse forward per pair."""
    return 2 + len(settings.selections) * len(settings.budgets_tokens)


@torch.no_grad()
def dense_stream_metrics(
    trace: TeacherForcedTrace, settings: AccuracySettings
) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(mass_mean, mass_worst_head, rel_l2) per (selection, budget_tokens), on the dense residual stream."""
    p = settings.layout.block_size
    masses: dict[tuple[str, int], list[torch.Tensor]] = {}
    errors: dict[tuple[str, int], list[torch.Tensor]] = {}
    for layer in range(settings.dense_layers, len(trace.q)):
        q, (k, v) = trace.q[layer], trace.kv[layer]
        probs = attention_probs(q, k, trace.positions)
        dense = dense_output(probs, v)
        scores = LayerScores(q, trace.summaries[layer])
        for selection in settings.selections:
            for budget in settings.budgets_tokens:
                blocks = select_attended(
                    selection, q, trace.summaries[layer], trace.candidate, trace.resident, budget // p, probs, p, scores
                )
                out, mass = sparse_output(probs, token_mask(blocks, p, k.shape[0]), v)
                masses.setdefault((selection, budget), []).append(mass)
                errors.setdefault((selection, budget), []).append(_rel_l2(out, dense))
    result = {}
    for key in [(s, b) for s in settings.selections for b in settings.budgets_tokens]:
        if key not in masses:  # every layer is dense
            result[key] = (1.0, 1.0, 0.0)
            continue
        mass = torch.stack(masses[key], dim=1)  # [M, layers, H]
        worst = mass.flatten(1).amin(1).mean()
        result[key] = (float(mass.mean()), float(worst), float(torch.stack(errors[key]).mean()))
    return result


def _rel_l2(out: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """||out - dense|| / ||dense|| per step over [H, D]: float32 [M]."""
    return (out - dense).flatten(1).norm(dim=1) / dense.flatten(1).norm(dim=1).clamp_min(1e-30)


@torch.no_grad()
def sparse_forward(
    config: DecoderConfig,
    weights: DecoderWeights,
    trace: TeacherForcedTrace,
    selection: str,
    budget_tokens: int,
    settings: AccuracySettings,
) -> torch.Tensor:
    """Next-token logits float32 [M, V] when layers >= dense_layers attend sparsely over the dense K/V."""
    p = settings.layout.block_size
    positions = trace.positions
    start = settings.dense_layers
    if start >= config.num_layers:
        return trace.logits
    x = trace.x_in[start]
    for li in range(start, config.num_layers):
        layer, (k, v) = weights.layers[li], trace.kv[li]
        q = project_query(config, layer, x, positions)
        probs = attention_probs(q, k, positions)
        blocks = select_attended(
            selection, q, trace.summaries[li], trace.candidate, trace.resident, budget_tokens // p, probs, p
        )
        out, _ = sparse_output(probs, token_mask(blocks, p, k.shape[0]), v)
        x = finish_layer(config, layer, x, out.to(x.dtype))
    return logits_of(config, weights, x)


def next_token_agreement(dense_logits: torch.Tensor, sparse_logits: torch.Tensor) -> tuple[float, float]:
    """(argmax agreement in [0, 1], mean KL(p_dense || p_sparse) in nats) over the M rows of [M, V] logits."""
    agree = (dense_logits.argmax(-1) == sparse_logits.argmax(-1)).float().mean()
    log_p = dense_logits.float().log_softmax(-1)
    log_s = sparse_logits.float().log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_s)).sum(-1).clamp_min(0.0).mean()
    return float(agree), float(kl)


def format_accuracy(table: pd.DataFrame, selections: Sequence[str] | None = None) -> str:
    """A plain-text table of `evaluate_accuracy` rows (masses and agreement in %, rel_l2 and KL as numbers)."""
    rows = table if selections is None else table[table["selection"].isin(list(selections))]
    header = (
        f"{'selection':<14}{'budget':>7}{'context':>8}{'mass %':>8}{'worst %':>8}{'rel_l2':>8}{'argmax %':>9}"
        f"{'KL nats':>9}"
    )
    lines = [header]
    for r in rows.itertuples(index=False):
        lines.append(
            f"{r.selection:<14}{r.budget_tokens:>7}{r.context_tokens:>8}{100 * r.mass_mean:>8.2f}"
            f"{100 * r.mass_worst_head:>8.2f}{r.rel_l2:>8.4f}{100 * r.argmax_agreement:>9.1f}{r.kl_nats:>9.4f}"
        )
    return "\n".join(lines)
