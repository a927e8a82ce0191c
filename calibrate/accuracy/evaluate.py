"""Teacher-forced accuracy of sparse block attention against dense attention on one text.

Protocol (one prefill shared by every selection and budget):
  1-2. The dense teacher-forced pass of calibrate/accuracy/trace.py: dense chunked prefill of N =
     ``context_tokens`` tokens, then M = ``steps`` true tokens in one batched causal pass.
  3. Dense-stream metrics: at every layer >= ``dense_layers`` each selection (calibrate/accuracy/selections.py)
     picks blocks with the dense q; captured attention mass and the attention-output error are measured
     against dense attention of the same q, so errors of earlier layers do not feed in.
  4. Sparse forward, per (selection, budget): from layer ``dense_layers`` on, every layer attends only to
     its resident and selected blocks, selected with the query of the sparse residual stream; the
     next-token logits are compared with the dense ones (argmax agreement, KL).

Model assumption (KV of the sparse forward): keys and values are the dense pass's (the true tokens
through the dense model) at every position, the current one included; a sparse forward changes only
which of them each layer attends to. Steps are therefore independent: error does not build up through
the cache, so KL and argmax measure one step of sparse decoding, not a long sparse generation.

Metrics (`ACCURACY_COLUMNS`), over steps and layers >= ``dense_layers``:
  * ``mass_mean``: mean over (step, layer, query head) of the dense attention probability on attended
    tokens (dense stream).
  * ``mass_worst_head``: per step the minimum of that mass over (layer, query head), then the mean over
    steps: how badly the most starved head of a step fares, on average.
  * ``rel_l2``: per (step, layer) ||o_sparse - o_dense|| / ||o_dense|| over the layer's whole attention
    output [H * D] (the input of the output projection), then the mean (dense stream).
  * ``argmax_agreement``: fraction of steps whose sparse-forward argmax equals the dense argmax.
  * ``kl_nats``: mean over steps of KL(p_dense || p_sparse) of the next-token distributions, in nats.

Dimension names as in calibrate/accuracy/trace.py: N context tokens, M steps, H query heads, D head_dim,
V vocab.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from calibrate.accuracy.selections import ACCURACY_SELECTIONS, LayerScores, select_attended
from calibrate.accuracy.trace import (
    DEFAULT_LAYOUT,
    TeacherForcedTrace,
    attention_probs,
    dense_output,
    sparse_output,
    teacher_forced_trace,
    token_mask,
)
from engine.kv_cache import SparsePolicy
from engine.model import DecoderConfig, DecoderWeights, finish_layer, logits_of, project_query

ACCURACY_COLUMNS = [
    "selection", "budget_tokens", "context_tokens", "mass_mean", "mass_worst_head", "rel_l2", "argmax_agreement",
    "kl_nats",
]  # fmt: skip
DEFAULT_STEPS = 64  # decode steps per evaluation: 1/64 resolution of argmax agreement, seconds per sparse forward


@dataclass(frozen=True)
class AccuracySettings:
    """One evaluation: budgets × selections at one context length (see the module docstring).

    Raises:
        ValueError: (on construction) a count below 1, dense_layers < 0, no budget or one below a block, or
            no selection or an unknown one.
    """

    context_tokens: int = 2048  # N, prefilled tokens
    steps: int = DEFAULT_STEPS  # M, teacher-forced decode steps
    budgets_tokens: tuple[int, ...] = (256, 512, 1024)  # selected tokens per (layer, step); k = budget // P
    selections: tuple[str, ...] = ("headwise", "solohead", "solohead_norm", "solohead_box", "streaming", "oracle")
    dense_layers: int = 2  # layers below this attend densely (docs/sources.md §8: layers 0-1 attend diffusely)
    layout: SparsePolicy = DEFAULT_LAYOUT  # block size, sink and recent window; its budget_tokens is not read
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
    """Step 3 of the module docstring: attention mass and output error of every selection × budget.

    Args:
        trace: from `teacher_forced_trace` with ``settings.layout``.
        settings: selections, budgets, dense_layers and layout.

    Returns:
        (mass_mean, mass_worst_head, rel_l2) floats per (selection, budget_tokens); (1, 1, 0) when every layer
        is dense.
    """
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
    """Step 4 of the module docstring: next-token logits when layers >= dense_layers attend sparsely.

    Args:
        config, weights: the decoder the trace was taken with.
        trace: from `teacher_forced_trace` with ``settings.layout``.
        selection: one of ACCURACY_SELECTIONS.
        budget_tokens: selected tokens per (layer, step); k = budget_tokens // P blocks.
        settings: dense_layers and layout.

    Returns:
        float32 [M, V]; the trace's dense logits when dense_layers >= num_layers.

    Raises:
        ValueError: if selection is unknown.
    """
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
