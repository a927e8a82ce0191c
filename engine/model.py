"""A Llama-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP) with seeded random weights.

This module owns the model shape (`DecoderConfig`), the weights and the per-layer pieces of a decode
step, plus `DenseDecoder`, the reference that keeps every request's whole KV cache contiguous. The
offloaded decoder (engine/pipeline.py) reuses the same pieces, so with a budget that covers the
context the two must give the same logits.

Dimension names: B batch (requests), T tokens, H query heads, Hkv KV heads, D head_dim,
E hidden_size, I intermediate_size, V vocab_size, G = H // Hkv query heads per KV head.
Keys are cached after RoPE (as in vLLM and SGLang), so cached keys never need their positions again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import dense_decode_attention


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of a Llama-style decoder. The engine's own card; it never imports the simulator's ModelSpec."""

    num_layers: int
    hidden_size: int  # E
    num_heads: int  # H, query heads
    num_kv_heads: int  # Hkv; H % Hkv == 0 (GQA)
    head_dim: int  # D
    intermediate_size: int  # I, SwiGLU width
    vocab_size: int  # V
    dtype: torch.dtype = torch.float32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_seq_len: int | None = None  # context-length cap the model was trained for (tokens); None: unknown

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"DecoderConfig.{name}={getattr(self, name)} must be >= 1")
        if self.vocab_size < 1:
            raise ValueError(f"DecoderConfig.vocab_size={self.vocab_size} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"DecoderConfig.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ValueError(f"DecoderConfig.max_seq_len={self.max_seq_len} must be >= 1 or None")
        if self.head_dim % 2:
            raise ValueError(f"DecoderConfig.head_dim={self.head_dim} must be even (RoPE rotates pairs)")

    @property
    def group_size(self) -> int:
        """G: query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """K and V bytes of one token in one layer: 2 * Hkv * D * dtype bytes."""
        return 2 * self.num_kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()


def tiny_cpu_config(dtype: torch.dtype = torch.float32) -> DecoderConfig:
    """A scaled-down card (4 layers, 8 query / 2 KV heads of 32 dims) that decodes in milliseconds on a CPU."""
    return DecoderConfig(
        num_layers=4,
        hidden_size=256,
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=512,
        vocab_size=512,
        dtype=dtype,
    )


@dataclass
class LayerWeights:
    """One decoder layer. Linear weights are [out, in] (torch convention: y = x @ w.T)."""

    attn_norm: torch.Tensor  # [E]
    wq: torch.Tensor  # [H * D, E]
    wk: torch.Tensor  # [Hkv * D, E]
    wv: torch.Tensor  # [Hkv * D, E]
    wo: torch.Tensor  # [E, H * D]
    mlp_norm: torch.Tensor  # [E]
    w_gate: torch.Tensor  # [I, E]
    w_up: torch.Tensor  # [I, E]
    w_down: torch.Tensor  # [E, I]


@dataclass
class DecoderWeights:
    """All weights of a decoder, in the config's dtype and on one device (E hidden, V vocab)."""

    embed: torch.Tensor  # [V, E]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [E]
    lm_head: torch.Tensor  # [V, E]


def init_weights(config: DecoderConfig, seed: int = 0, device: torch.device | str = "cpu") -> DecoderWeights:
    """Random weights drawn from one seeded generator on the CPU, then moved, so any device gets the same values.

    Linear weights are N(0, 1/in_features); norms start at 1 plus a little noise so they matter in tests.
    """
    gen = torch.Generator().manual_seed(seed)
    c = config

    def linear(out_f: int, in_f: int) -> torch.Tensor:
        w = torch.randn(out_f, in_f, generator=gen) / in_f**0.5
        return w.to(device=device, dtype=c.dtype)

    def norm() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(c.hidden_size, generator=gen)).to(device=device, dtype=c.dtype)

    layers = [
        LayerWeights(
            attn_norm=norm(),
            wq=linear(c.num_heads * c.head_dim, c.hidden_size),
            wk=linear(c.num_kv_heads * c.head_dim, c.hidden_size),
            wv=linear(c.num_kv_heads * c.head_dim, c.hidden_size),
            wo=linear(c.hidden_size, c.num_heads * c.head_dim),
            mlp_norm=norm(),
            w_gate=linear(c.intermediate_size, c.hidden_size),
            w_up=linear(c.intermediate_size, c.hidden_size),
            w_down=linear(c.hidden_size, c.intermediate_size),
        )
        for _ in range(c.num_layers)
    ]
    embed = torch.randn(c.vocab_size, c.hidden_size, generator=gen).to(device=device, dtype=c.dtype)
    return DecoderWeights(embed=embed, layers=layers, final_norm=norm(), lm_head=linear(c.vocab_size, c.hidden_size))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 and cast back to x.dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE.

    Args:
        x: [N, heads, D], any float dtype.
        positions: int64 [N], token positions, same device as x.
        theta: RoPE base.

    Returns:
        [N, heads, D], x.dtype.
    """
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [N, D/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :]
    x32 = x.float()
    rotated = torch.cat([-x32[..., d // 2 :], x32[..., : d // 2]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def project_qkv(
    config: DecoderConfig, layer: LayerWeights, x: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention input projections for N tokens: x [N, E] -> q [N, H, D], k [N, Hkv, D] (both after RoPE), v."""
    h = rms_norm(x, layer.attn_norm, config.rms_norm_eps)
    n = x.shape[0]
    q = (h @ layer.wq.T).view(n, config.num_heads, config.head_dim)
    k = (h @ layer.wk.T).view(n, config.num_kv_heads, config.head_dim)
    v = (h @ layer.wv.T).view(n, config.num_kv_heads, config.head_dim)
    return apply_rope(q, positions, config.rope_theta), apply_rope(k, positions, config.rope_theta), v


def project_query(config: DecoderConfig, layer: LayerWeights, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The layer's query alone, x [N, E] -> [N, H, D] after RoPE (the prefetch predicts with it)."""
    h = rms_norm(x, layer.attn_norm, config.rms_norm_eps)
    q = (h @ layer.wq.T).view(x.shape[0], config.num_heads, config.head_dim)
    return apply_rope(q, positions, config.rope_theta)


def finish_layer(config: DecoderConfig, layer: LayerWeights, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """Output projection, residual and SwiGLU MLP: x [N, E], attn [N, H, D] -> [N, E]."""
    x = x + attn.reshape(x.shape[0], -1) @ layer.wo.T
    h = rms_norm(x, layer.mlp_norm, config.rms_norm_eps)
    return x + (torch.nn.functional.silu(h @ layer.w_gate.T) * (h @ layer.w_up.T)) @ layer.w_down.T


def logits_of(config: DecoderConfig, weights: DecoderWeights, x: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head: x [N, E] -> float32 logits [N, V]."""
    return (rms_norm(x, weights.final_norm, config.rms_norm_eps) @ weights.lm_head.T).float()


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA self-attention of one prompt: q [T, H, D], k and v [T, Hkv, D] -> [T, H, D] (prefill)."""
    t, h, d = q.shape
    g = h // k.shape[1]
    qg = q.float().view(t, k.shape[1], g, d)
    scores = torch.einsum("qkgd,skd->kgqs", qg, k.float()) / d**0.5  # [Hkv, G, T, T]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("kgqs,skd->qkgd", probs, v.float()).reshape(t, h, d).to(q.dtype)


class DenseDecoder:
    """Reference decoder: every request's whole KV cache stays contiguous; dense attention every step."""

    def __init__(self, config: DecoderConfig, weights: DecoderWeights) -> None:
        self.config = config
        self.weights = weights

    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Run one prompt.

        Args:
            tokens: int64 [T], T >= 1, on the weights' device.

        Returns:
            (logits float32 [V] of the last token, per layer (k, v) each [T, Hkv, D] in config.dtype).
        """
        c, w = self.config, self.weights
        positions = torch.arange(tokens.shape[0], device=tokens.device)
        x = w.embed[tokens]
        kv = []
        for layer in w.layers:
            q, k, v = project_qkv(c, layer, x, positions)
            kv.append((k, v))
            x = finish_layer(c, layer, x, causal_attention(q, k, v))
        return logits_of(c, w, x[-1:])[0], kv

    def decode(
        self, tokens: torch.Tensor, caches: list[list[tuple[torch.Tensor, torch.Tensor]]]
    ) -> tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]]]:
        """One decode step for B requests; caches[r][layer] = (k, v) [T_r, Hkv, D] grows by one token.

        Returns:
            (float32 logits [B, V], the grown caches).
        """
        c, w = self.config, self.weights
        positions = torch.tensor([cache[0][0].shape[0] for cache in caches], device=tokens.device)
        x = w.embed[tokens]
        new_caches = [list(cache) for cache in caches]
        for li, layer in enumerate(w.layers):
            q, k, v = project_qkv(c, layer, x, positions)
            outs = []
            for r, cache in enumerate(new_caches):
                kr = torch.cat([cache[li][0], k[r : r + 1]])
                vr = torch.cat([cache[li][1], v[r : r + 1]])
                cache[li] = (kr, vr)
                outs.append(dense_decode_attention(q[r : r + 1], kr[None], vr[None]))
            x = finish_layer(c, layer, x, torch.cat(outs))
        return logits_of(c, w, x), new_caches
