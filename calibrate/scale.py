"""The model a calibration measures: a model card, scaled down where the device cannot run it whole.

Per-layer decode time does not depend on how many layers a model has, so the engine runs a few layers of
the card (``layers``, default 4) and the profile's compute is per layer. On a CPU the layer itself is also
scaled: KV heads, query heads, hidden and FFN widths are divided by ``scale`` (default: KV heads / 2, so
GQA grouping and head_dim stay the card's), the vocabulary is capped at 4,096 and the dtype is fp32 (the
CPU runs bf16 GEMMs through slower paths). The scaled card is written into the profile as its ``model``,
and the simulator uses that card with that profile (sim/config/scenario.py refuses a different one).
"""

from __future__ import annotations

from sim.config import ModelSpec

CPU_VOCAB = 4096


def scaled_card(card: ModelSpec, cuda: bool, layers: int | None = None, scale: int | None = None) -> ModelSpec:
    """The card the engine runs on this device (module docstring).

    Args:
        card: the model card to calibrate for.
        cuda: whether the device is a GPU (no width scaling, the card's dtype).
        layers: decoder layers to run (default 4, at most the card's).
        scale: width divisor (default 1 on a GPU; on a CPU ``max(1, num_kv_heads // 2)``).

    Raises:
        ValueError: for an MoE card (the engine's decoder is dense), a scale that does not divide the KV
            heads, or layers < 1.
    """
    if card.is_moe:
        raise ValueError(f"model {card.name!r} is MoE; the engine runs dense decoders only (pick a dense card)")
    layers = min(card.num_layers, 4) if layers is None else layers
    if layers < 1:
        raise ValueError(f"layers={layers} must be >= 1")
    if scale is None:
        scale = 1 if cuda else max(1, card.num_kv_heads // 2)
    if scale < 1 or card.num_kv_heads % scale:
        raise ValueError(f"scale={scale} must be >= 1 and divide num_kv_heads={card.num_kv_heads}")
    heads = card.num_heads // scale
    name = card.name if (scale == 1 and layers == card.num_layers and cuda) else f"{card.name}-{layers}l"
    if scale > 1:
        name += f"-w{scale}"
    dtype = card.dtype if cuda else "fp32"
    if dtype != card.dtype:
        name += f"-{dtype}"
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=card.hidden_size // scale,
        num_heads=heads,
        num_kv_heads=card.num_kv_heads // scale,
        head_dim=card.head_dim,
        intermediate_size=max(1, card.intermediate_size // scale),
        vocab_size=card.vocab_size if cuda else min(card.vocab_size, CPU_VOCAB),
        tie_word_embeddings=card.tie_word_embeddings,
        max_seq_len=card.max_seq_len,
        dtype=dtype,
    )
