"""Run the engine's decode loop on pre-filled requests: the one code path both calibration and validation time.

The compute microbenchmark (calibrate/bench.py) and `pulseinfer validate` (calibrate/validate.py) both build
an :class:`engine.pipeline.OffloadedDecoder` from a model card, store requests whose KV is random (seeded;
decode cost does not depend on the values, and a real prefill of 16K tokens would cost minutes on a CPU),
and time decode steps with the engine's own :class:`engine.timing.Timer` spans (CUDA events on a GPU,
``perf_counter_ns`` on a CPU). A step's time is its ``step`` span: embedding, every layer (projections,
selection, recall, attention, MLP), final norm and LM head, greedy argmax and the per-step bookkeeping.

Engine policies mirror the simulator's (:data:`ENGINE_POLICIES`):

* ``sglang`` — every block stays resident (the recent window covers the whole context), dense attention
  over the paged pool, nothing selected or recalled.
* ``pulseinfer`` — SoloHead selection, gather-scatter recall, one-layer prefetch (the engine's pipeline);
  sink, recent window and budget as in ``scenarios/policies/pulseinfer.yaml`` with 16-token blocks.
* ``headwise`` — head-wise selection, per-fragment recall (the offloading baseline).

The engine keeps no recall buffer between steps (every selected block is recalled every step), so the
simulator's mirror policies set ``miss_frac: 1.0``; its prefetch is one layer ahead with no pre-emption
(``scheduling: sequential``, ``lookahead_layers: 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from engine.kv_cache import SparsePolicy
from engine.model import DecoderConfig, DecoderWeights, init_weights
from engine.pipeline import OffloadedDecoder
from engine.timing import Timer

STEP_TABLE_COLUMNS = ["step", "batch_size", "step_s"]


@dataclass(frozen=True)
class EnginePolicy:
    """What the engine does for one policy name (module docstring)."""

    name: str
    resident: bool  # every block stays on the device (dense)
    selection: str = "solohead"
    io: str = "gather_scatter"
    block_size: int = 16
    sink_tokens: int = 128
    recent_tokens: int = 512
    budget_tokens: int = 2048

    def sim_policy(self) -> dict:
        """The simulator's policy entry (``kind`` dense or offload) that models this engine policy."""
        if self.resident:
            return {"kind": "dense", "block_size": self.block_size, "chunked_prefill_tokens": 8192}
        return {
            "kind": "offload",
            "selection": self.selection,
            "io": self.io,
            "block_size": self.block_size,
            "budget_tokens": self.budget_tokens,
            "sink_tokens": self.sink_tokens,
            "recent_tokens": self.recent_tokens,
            "recall_buffer_blocks": self.budget_tokens // self.block_size,
            "offload_threshold_tokens": 1,
            "miss_frac": 1.0,  # the engine has no recall buffer: every selected block moves every step
            "scheduling": "sequential",
            "lookahead_layers": 1,
            "admission": "static",
        }


ENGINE_POLICIES = {
    "sglang": EnginePolicy("sglang", resident=True),
    "pulseinfer": EnginePolicy("pulseinfer", resident=False),
    "headwise": EnginePolicy("headwise", resident=False, selection="headwise", io="per_fragment"),
}


def engine_policy(name: str) -> EnginePolicy:
    """Look a policy up by name. Raises ValueError naming the known ones."""
    if name not in ENGINE_POLICIES:
        raise ValueError(f"policy {name!r} has no engine counterpart (known: {', '.join(ENGINE_POLICIES)})")
    return ENGINE_POLICIES[name]


def sparse_policy(policy: EnginePolicy, max_tokens: int) -> SparsePolicy:
    """The engine's SparsePolicy; ``resident`` ones get a recent window covering ``max_tokens`` (all KV)."""
    p = policy.block_size
    if policy.resident:
        return SparsePolicy(p, 0, -(-(max_tokens + p) // p) * p, 0)
    return SparsePolicy(p, policy.sink_tokens, policy.recent_tokens, policy.budget_tokens)


def pool_blocks(policy: EnginePolicy, contexts: list[int], max_new_tokens: int) -> tuple[int, int]:
    """(device, host) pool blocks :func:`build_decoder` allocates for these requests (per layer; a block holds
    K and V of ``policy.block_size`` tokens)."""
    p = policy.block_size
    sp = sparse_policy(policy, max(contexts) + max_new_tokens)
    total_blocks = sum(-(-(c + max_new_tokens) // p) + 1 for c in contexts)
    if policy.resident:
        return total_blocks + len(contexts), 1
    resident = (sp.sink_tokens + sp.recent_tokens) // p + 2
    return len(contexts) * (resident + sp.budget_tokens // p + 2), total_blocks


def build_decoder(
    config: DecoderConfig,
    policy: EnginePolicy,
    contexts: list[int],
    max_new_tokens: int,
    device: str,
    seed: int = 0,
    weights: DecoderWeights | None = None,
) -> OffloadedDecoder:
    """An OffloadedDecoder holding one request per context, with random (seeded) KV and timing enabled.

    Args:
        config: the decoder shape (seeded random weights).
        policy: what stays resident, selection and I/O mode.
        contexts: KV tokens of each request (request ids 0..n-1).
        max_new_tokens: decode steps the pools must leave room for.
        device: torch device.
        seed: seeds weights and KV.
        weights: reuse these (from ``init_weights(config, seed, device)``); drawing a full-size model's
            weights takes seconds, so callers that build many decoders draw them once.

    Raises:
        RuntimeError: if the pools cannot hold the requests (should not happen: they are sized here).
    """
    sp = sparse_policy(policy, max(contexts) + max_new_tokens)
    num_device, num_host = pool_blocks(policy, contexts, max_new_tokens)
    weights = weights if weights is not None else init_weights(config, seed=seed, device=device)
    timer = Timer(device, enabled=True)
    decoder = OffloadedDecoder(
        config, weights, sp, num_device, num_host, selection=policy.selection, io=policy.io,
        prefetch=True, device=device, timer=timer,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed + 1)
    shape = (config.num_kv_heads, config.head_dim)
    for rid, ctx in enumerate(contexts):
        # One random K and V per request, shared by every layer: decode cost does not depend on the values,
        # and drawing them per layer dominated the set-up time of long contexts.
        k, v = (torch.randn((ctx, *shape), generator=gen).to(device=device, dtype=config.dtype) for _ in range(2))
        kv = [(k, v)] * config.num_layers
        if not decoder.cache.add_request(rid, kv):
            raise RuntimeError(f"request {rid} with {ctx} tokens did not fit in the pools sized for it")
    return decoder


def timed_step(
    decoder: OffloadedDecoder, request_ids: list[int], tokens: torch.Tensor
) -> tuple[torch.Tensor, float, list[float]]:
    """One decode step with its spans read back: (logits float32 [B, V], step seconds, seconds of each layer).

    The step span covers embedding, every layer, final norm and LM head (engine/pipeline.py); the caller's
    argmax comes after it. The decoder's timer is cleared, so spans never accumulate.
    """
    first = decoder.step
    logits = decoder.decode_step(request_ids, tokens)
    table = decoder.timer.table()
    decoder.timer.clear()
    mine = table[table["step"] == first]
    step_s = float(mine.loc[mine["name"] == "step", "seconds"].sum())
    return logits, step_s, mine.loc[mine["name"] == "layer", "seconds"].tolist()


def run_decode(decoder: OffloadedDecoder, output_tokens: list[int], warmup_steps: int = 1) -> pd.DataFrame:
    """Decode every request until it has its output tokens; requests leave the batch when done.

    A request with ``o`` output tokens runs ``o - 1`` decode steps (its first token came from its prefill,
    as in the simulator). ``warmup_steps`` extra steps run first on the whole batch and are not recorded
    (allocator and cache warm-up); they do not count towards any request's tokens but grow the contexts by
    as many tokens.

    Returns:
        One row per recorded step (STEP_TABLE_COLUMNS): the step index, its batch size and its span (seconds).
    """
    remaining = {rid: max(o - 1, 0) for rid, o in zip(sorted(decoder.cache.lengths), output_tokens)}
    device = decoder.device
    tokens = torch.zeros(len(remaining), dtype=torch.int64, device=device)
    for _ in range(warmup_steps):
        tokens = decoder.decode_step(sorted(remaining), tokens).argmax(-1)
    decoder.timer.clear()
    rows = []
    active = [rid for rid in sorted(remaining) if remaining[rid] > 0]
    tokens = tokens[: len(active)]
    while active:
        logits, step_s, _ = timed_step(decoder, active, tokens)
        tokens = logits.argmax(-1)
        rows.append((len(rows), len(active), step_s))
        keep = []
        for i, rid in enumerate(active):
            remaining[rid] -= 1
            if remaining[rid] > 0:
                keep.append(i)
            else:
                decoder.remove_request(rid)
        active = [active[i] for i in keep]
        tokens = tokens[torch.tensor(keep, dtype=torch.int64, device=device)] if keep else tokens[:0]
    return pd.DataFrame(rows, columns=STEP_TABLE_COLUMNS)
