"""The dense teacher-forced pass every accuracy evaluation and selection statistic starts from, and the
attention arithmetic on it.

Protocol (one prefill shared by every selection and budget):
  1. Dense chunked prefill of the first N = ``context_tokens`` tokens (`engine.generate.prefill_chunked`).
  2. Dense teacher-forced extension over the next M true tokens in one batched causal pass
     (`teacher_forced_trace`): step t feeds token N + t at position N + t and attends to keys 0..N+t, as
     M single decode steps would. Per layer it keeps the residual input x [M, E], the query q [M, H, D]
     and the whole K, V [N + M, Hkv, D]; it also keeps the dense next-token logits [M, V].

Block layout of step t (docs/design.md "sink", "recent window"; 16-token blocks as in docs/sources.md §8), given by the
engine's `SparsePolicy` (its ``budget_tokens`` is not read here: evaluations sweep their own budgets): the
context holds N + t + 1 tokens in ceil((N + t + 1) / P) blocks; the first ``sink_tokens`` / P and the last
``recent_tokens`` / P (the partly filled tail among them) are resident; the full blocks in between are the
candidates, of which a selection attends k = budget_tokens // P.

Dimension names: N context tokens, M steps, T = N + M tokens of K/V, NB = ceil(T / P) blocks, P block_size,
E hidden, H query heads, Hkv KV heads, G = H // Hkv, D head_dim, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.generate import prefill_chunked
from engine.kv_cache import SparsePolicy
from engine.model import DecoderConfig, DecoderWeights, finish_layer, logits_of, project_qkv
from engine.summaries import summarize_keys

# The layout every accuracy and selection-statistics run uses unless told otherwise: 16-token blocks
# (docs/sources.md §8), a 16-token sink and a 64-token recent window. budget_tokens = 0: evaluations sweep their own.
DEFAULT_LAYOUT = SparsePolicy(block_size=16, sink_tokens=16, recent_tokens=64, budget_tokens=0)


@dataclass
class TeacherForcedTrace:
    """The dense teacher-forced pass (module docstring); every tensor on the weights' device."""

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
        """M, the teacher-forced decode steps."""
        return self.logits.shape[0]

    @property
    def positions(self) -> torch.Tensor:
        """int64 [M], position of each step's token."""
        return self.context_tokens + torch.arange(self.steps, device=self.logits.device)


def block_masks(
    context_tokens: int, steps: int, layout: SparsePolicy, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate and resident blocks of every step (module docstring, "Block layout").

    Args:
        context_tokens: N >= 0.
        steps: M >= 1.
        layout: block size, sink and recent window (budget_tokens unused).
        device: where the masks live.

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
    layout: SparsePolicy,
    chunk_tokens: int = 512,
) -> TeacherForcedTrace:
    """Dense prefill of tokens[:N], then one batched teacher-forced pass over the M = len(tokens) - N rest.

    Args:
        config, weights: the decoder.
        tokens: int64 [N + M], on the weights' device; M >= 1.
        context_tokens: N >= 1.
        layout: block size, sink and recent window (budget_tokens unused).
        chunk_tokens: prefill chunk.

    Returns:
        The trace; tensors on the weights' device.

    Raises:
        ValueError: if tokens is not 1-D int64 longer than context_tokens.
    """
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


def token_mask(blocks: torch.Tensor, block_size: int, num_tokens: int) -> torch.Tensor:
    """Block mask bool [..., NB] -> token mask bool [..., T] (T = num_tokens <= NB * P)."""
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
