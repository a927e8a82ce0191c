"""The offloaded decoder: batched decode steps with the KV offloaded and recalled layer by layer.

Per decode step (`decode_step`):
  1. `cache.prepare_step`: tails grow, blocks leaving the recent window are offloaded and summarised,
     the recall arena is allocated and the step's index tensors are built (once, for every layer).
  2. For each layer l:
       a. q, k, v = projections of the layer input x_l; the new token's k, v go into its tail block.
       b. Selection (Quest scores over the candidates' summaries, head-wise or SoloHead top-k) and
          recall of the selected blocks into the arena. Without prefetch: layer l, from q.
          With prefetch: layer 0 from its exact q, and layer l+1 from a query predicted from x_l, issued
          before layer l's attention so that, on CUDA, its copy (on the I/O stream) overlaps layer l's
          compute. Selection indices reach the host through a non-blocking copy and one event.
       c. `io.wait(l)` (a stream-side wait), then sparse attention over resident + arena blocks, the
          output projection and the MLP.
  3. `cache.finish_step` frees the arena; logits come from the last layer's output.

Model assumption (prefetch): the residual stream changes little across one layer, so layer l+1's
query computed from x_l picks nearly the same blocks (the premise of InfiniGen and SparDA;
see docs/sources.md section 2). With a budget that covers the context every block is recalled
whatever the scores, so the logits equal the dense decoder's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from engine.attention import sparse_decode_attention
from engine.io import make_io
from engine.kv_cache import OffloadedKVCache, SparsePolicy, StepIndices
from engine.model import (
    DecoderConfig,
    DecoderWeights,
    DenseDecoder,
    finish_layer,
    logits_of,
    project_qkv,
    project_query,
)
from engine.select import SELECTIONS, quest_scores, select_blocks
from engine.timing import Timer

RECALL_COLUMNS = ["step", "layer", "fragments", "bytes"]


@dataclass
class _Selection:
    """Selected host blocks of one layer on their way to the host (CUDA: valid once `ready` completes)."""

    layer: int
    host_ids: torch.Tensor  # int64 [B, Hkv, K], CPU
    chosen: torch.Tensor  # bool [B, Hkv, K], CPU
    ready: torch.cuda.Event | None


class OffloadedDecoder:
    """A `DenseDecoder`'s weights run over an `OffloadedKVCache` with sparse recall (see module docstring)."""

    def __init__(
        self,
        config: DecoderConfig,
        weights: DecoderWeights,
        policy: SparsePolicy,
        num_device_blocks: int,
        num_host_blocks: int,
        selection: str = "solohead",
        io: str = "gather_scatter",
        prefetch: bool = True,
        device: torch.device | str = "cpu",
        timer: Timer | None = None,
    ) -> None:
        """Raises ValueError for an unknown selection or io."""
        if selection not in SELECTIONS:
            raise ValueError(f"selection={selection!r} must be one of {SELECTIONS}")
        self.config, self.weights, self.selection, self.prefetch = config, weights, selection, prefetch
        self.device = torch.device(device)
        self.dense = DenseDecoder(config, weights)
        self.cache = OffloadedKVCache(
            config.num_layers, config.num_kv_heads, config.head_dim, config.dtype, policy,
            num_device_blocks, num_host_blocks, self.device,
        )  # fmt: skip
        self.io = make_io(io, self.cache.host_pool, self.cache.device_pool)
        self.timer = timer or Timer(self.device, enabled=False)
        self.step = 0
        self._recalls: list[tuple[int, int, int, int]] = []
        # CUDA: per layer, "attention done" on the compute stream; a recall into that layer's arena waits
        # only for it, not for compute queued later (so layer l+1's copy overlaps layer l's compute).
        self._attended = [torch.cuda.Event() for _ in range(config.num_layers)] if self.device.type == "cuda" else []

    def add_request(self, request_id: int, prompt: torch.Tensor) -> torch.Tensor | None:
        """Prefill a prompt (dense) and store its KV; prompt int64 [T] on the device.

        Returns:
            float32 logits [V] of the prompt's last token, or None if the pools have no room (nothing stored).
        """
        logits, kv = self.dense.prefill(prompt)
        return logits if self.cache.add_request(request_id, kv) else None

    def remove_request(self, request_id: int) -> None:
        """Free every block of the request. Raises KeyError for an unknown request."""
        self.cache.remove_request(request_id)

    def decode_step(self, request_ids: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """One token for each request: tokens int64 [B] on the device -> float32 logits [B, V]."""
        c, w = self.config, self.weights
        step_span = self.timer.start("step", self.step)
        st = self.cache.prepare_step(request_ids)
        x = w.embed[tokens]
        for li, layer in enumerate(w.layers):
            layer_span = self.timer.start("layer", self.step, li)
            q, k, v = project_qkv(c, layer, x, st.positions)
            self.cache.write_token(li, st, k, v)
            pending = self._select(li, q, st) if (li == 0 or not self.prefetch) else None
            ahead = None
            if self.prefetch and li + 1 < c.num_layers:
                ahead = self._select(li + 1, project_query(c, w.layers[li + 1], x, st.positions), st)
            self._recall(pending, st)
            self.io.wait(li)
            attn = sparse_decode_attention(
                q, self.cache.device_pool.layers[li], st.attend_block_ids, st.attend_tokens, st.attend_counts
            )
            if self._attended:
                self._attended[li].record()
            x = finish_layer(c, layer, x, attn)
            self._recall(ahead, st)  # on CUDA the copy overlaps the attention and MLP just queued
            self.timer.stop(layer_span)
        self.cache.finish_step(st)
        logits = logits_of(c, w, x)
        self.timer.stop(step_span)
        self.step += 1
        return logits

    def recall_table(self) -> pd.DataFrame:
        """Per (step, layer): fragments and bytes recalled."""
        return pd.DataFrame(self._recalls, columns=RECALL_COLUMNS)

    def _select(self, layer: int, q: torch.Tensor, st: StepIndices) -> _Selection | None:
        """Score the candidates and pick K per (request, KV head); start moving the picks to the host."""
        if st.budget_blocks == 0:
            return None
        with self.timer.span("select", self.step, layer):
            scores = quest_scores(q, self.cache.summaries.gather(layer, st.candidates))
            index, chosen = select_blocks(scores, st.candidate_valid, st.budget_blocks, self.selection)
            b, hkv, k = index.shape
            host_ids = st.candidates.gather(1, index.reshape(b, hkv * k)).view(b, hkv, k)
            if self.device.type != "cuda":
                return _Selection(layer, host_ids, chosen, None)
            host_ids, chosen = host_ids.to("cpu", non_blocking=True), chosen.to("cpu", non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            return _Selection(layer, host_ids, chosen, ready)

    def _recall(self, sel: _Selection | None, st: StepIndices) -> None:
        """Turn a selection into fragments (arena block i of request b takes its i-th pick) and recall them."""
        if sel is None:
            return
        if sel.ready is not None:
            sel.ready.synchronize()  # the selection's indices, not the compute stream's later work
        b, hkv, k = sel.host_ids.shape
        if self.selection == "solohead":
            mask = sel.chosen[:, 0]
            src, dst, heads = sel.host_ids[:, 0][mask], st.arena_cpu[mask], None
        else:
            mask = sel.chosen
            src = sel.host_ids[mask]
            dst = st.arena_cpu[:, None, :].expand(b, hkv, k)[mask]
            heads = torch.arange(hkv)[None, :, None].expand(b, hkv, k)[mask]
        with self.timer.span("recall", self.step, sel.layer, stream=self.io.stream):
            after = self._attended[sel.layer] if self._attended else None
            moved = self.io.recall(sel.layer, src, dst, heads, after=after)
        self._recalls.append((self.step, sel.layer, src.shape[0], moved))
