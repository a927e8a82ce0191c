"""KV offloading with sparse (SoloHead or head-wise) or full recall: ``full_offload``, ``headwise``,
``pulseinfer`` and their ablation variants.

What an offloaded request keeps in the device pool (Model assumption, docs/design.md "Recall model"): the sink
(``sink_tokens``), the recent window (``recent_tokens`` plus the block being filled), a recall buffer of
``recall_buffer_blocks`` (per KV head for head-wise selection: the same bytes) and one block summary
(per-channel key min and max) per KV block. A summary has the size of one token's K and V, so
``ceil(num_blocks / block_size)`` pool blocks hold them. With ``selection: all`` there is no buffer and
no summaries; instead two layers of the request's KV are staged on the GPU (double buffering).
Everything else lives in host DRAM. Attention reads the sink, the recent window and the selected blocks
(all blocks for ``selection: all``); selection reads every summary.

Offload writes (D2H): each step the new token's KV of every offloaded request is backed up to host
(eager backup, as SGLang HiSparse does, docs/sources.md §5.4); its D2H time slows H2D by the hardware's
``d2h_coupling``.

With a calibrated profile (sim/config/profiles.py): its ``selection`` section charges measured selection time per
layer (for the candidate blocks of the offloaded requests) instead of counting summaries as attended
tokens; a hardware whose ``io_overlaps_compute`` is false (the CPU engine) adds each layer's gather and
copy time to that layer's compute instead of overlapping them.

Link cost of one layer's recall by ``io``: ``per_fragment`` — one copy per fragment;
``gather_scatter`` with sequential scheduling — host gather, then one copy; with interruptible
scheduling — gather and copy stream in chunks (sim/step/link.py ``layer_times`` in ``streamed`` mode).
"""

from __future__ import annotations

import numpy as np

from sim.config import OffloadPolicy, Scenario
from sim.policies.base import Policy
from sim.serving.admission import Admission, IoAdaptiveAdmission, RecallBudget
from sim.step.cost import InterruptPlan, StepCost
from sim.step.link import LinkModel
from sim.step.recall import RecallModel


class OffloadServing(Policy):
    """Requests with prompts of at least ``offload_threshold_tokens`` run offloaded; others run dense."""

    params: OffloadPolicy

    def __init__(self, scenario: Scenario, name: str, params: OffloadPolicy) -> None:
        super().__init__(scenario, name, params)
        self.link = LinkModel(self.hardware)  # one GPU's link share (tp_size)
        # recall per GPU of its own KV heads (self.model is one GPU's shard at tp_size > 1)
        self.recall = RecallModel(self.model, params, scenario.recall_stats, self.link)
        bs = params.block_size
        self.window_blocks = -(-params.sink_tokens // bs) + -(-params.recent_tokens // bs) + 1
        self.full = params.selection == "all"
        self.resident_blocks = self.window_blocks + (0 if self.full else params.recall_buffer_blocks)
        self.sparse_tokens = params.sink_tokens + params.recent_tokens + params.budget_tokens
        self.num_layers = self.model.num_layers
        self.kv_bytes_per_token = self.model.kv_bytes_per_token
        self.interruptible = params.scheduling == "interruptible"
        # How the link model charges a layer's recall: gather-scatter streams in chunks when interruptible.
        self.link_io = "streamed" if params.io == "gather_scatter" and self.interruptible else params.io
        self.groups = params.micro_batches
        self.correction_frac = min(1.0, params.late_correction_frac * (params.lookahead_layers - 1))
        profile = scenario.profile
        self.selection_cost = profile.selection if profile is not None and not self.full else None
        self.io_overlaps = scenario.hardware.io_overlaps_compute
        self.admission = self._make_admission()

    def _make_admission(self) -> Admission:
        """Memory-only admission, or the IO-adaptive kind with this policy's recall-vs-compute bound."""
        params = self.params
        if params.admission != "io_adaptive":
            return Admission(self)
        fb = self.recall.fragment_bytes
        warm, cold = (self.recall.expected_layer_fragments(c) for c in (False, True))
        budget = RecallBudget(
            params.admission_slack,
            params.stall_target_frac,
            self.layer_link_s(warm * fb, warm)[1],
            self.layer_link_s(cold * fb, cold)[1],
        )
        return IoAdaptiveAdmission(self, budget)

    def wants_offload(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.params.offload_threshold_tokens

    def device_blocks(self, ctx: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        bs = self.block_size
        dense = -(-ctx // bs)
        extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // bs)  # staging or summaries
        return np.where(offloaded, np.minimum(dense, self.resident_blocks + extra), dense)

    def blocks_one(self, ctx: int, offloaded: bool) -> int:
        dense = -(-ctx // self.block_size)
        if not offloaded:
            return dense
        extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // self.block_size)
        return min(dense, self.resident_blocks + extra)

    def growth_one(self, future_tokens: int, offloaded: bool) -> int:
        dense = -(-future_tokens // self.block_size)
        if not offloaded:
            return dense
        return -(-2 * dense // self.num_layers) if self.full else -(-dense // self.block_size)

    def growth_blocks(self, future_tokens: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        dense = -(-future_tokens // self.block_size)
        extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // self.block_size)
        return np.where(offloaded, extra, dense)

    def layer_link_s(self, nbytes: float, fragments: float) -> tuple[float, float]:
        """(host gather seconds, link seconds) of one layer's recall under this policy's ``io``."""
        gather, link = self.link.layer_times([nbytes], [fragments], self.link_io, self.params.chunk_bytes)
        return float(gather[0]), float(link[0])

    def step_cost(self, ctx: np.ndarray, offloaded: np.ndarray, cold: np.ndarray, rng: np.random.Generator) -> StepCost:
        batch, L, G = len(ctx), self.num_layers, self.groups
        if self.full:
            attended_each = ctx
        elif self.selection_cost is not None:  # measured selection cost replaces reading summaries as tokens
            attended_each = np.where(offloaded, np.minimum(ctx, self.sparse_tokens), ctx)
        else:
            attended_each = np.where(offloaded, np.minimum(ctx, self.sparse_tokens) + -(-ctx // self.block_size), ctx)
        attended = int(attended_each.sum())
        candidates = self._candidates(ctx, offloaded)
        layer_s = self.compute.decode_layer_s(batch, attended) + self._select_s(candidates.sum())
        cost = StepCost([layer_s] * L, None, None, self.compute.decode_head_s(batch), 0, 0, 0, attended)
        n_off = int(offloaded.sum())
        if not n_off and G == 1:
            return cost
        groups = np.arange(batch) % G
        if G > 1:  # micro-batches: each group runs every layer on its own (re-reading the weights)
            sizes = np.bincount(groups, minlength=G)
            att = np.bincount(groups, weights=attended_each, minlength=G)
            cand = np.bincount(groups, weights=candidates, minlength=G)
            cost.compute_s = [
                self.compute.decode_layer_s(int(b), int(a)) + self._select_s(c) for b, a, c in zip(sizes, att, cand)
            ] * L
        rec = self.recall.step(ctx[offloaded], cold[offloaded], rng, groups[offloaded], G) if n_off else None
        if rec is None or not rec.nbytes.any():
            return cost
        slow = self.link.d2h_slowdown(n_off * self.kv_bytes_per_token, sum(cost.compute_s))
        gather, link = self._link_times(rec)  # float [G, L]
        link *= slow
        cost.recall_bytes = int(rec.nbytes.sum())
        cost.num_fragments = int(rec.fragments.sum())
        cost.layer_bytes, cost.layer_fragments = rec.nbytes.sum(axis=0), rec.fragments.sum(axis=0)
        if self.params.io == "per_fragment":
            cost.num_transfers = cost.num_fragments
        else:
            cost.num_transfers = int(np.count_nonzero(rec.nbytes))
        if not self.io_overlaps:  # recall runs inline on the computing thread (CPU engine): it adds to the layer
            cost.compute_s = (np.asarray(cost.compute_s) + gather.T.ravel() + link.T.ravel()).tolist()
            return cost
        if not self.interruptible:
            cost.recall_s = link[0].tolist()
            cost.gather_s = gather[0].tolist() if self.params.io == "gather_scatter" else None
            return cost
        # items in GPU order (layer-major, group-minor), split into prefetch and urgent correction
        f = self.correction_frac
        item_bytes, item_s = rec.nbytes.T.ravel().astype(float), link.T.ravel()
        prefetch = list(zip(((1 - f) * item_bytes).tolist(), ((1 - f) * item_s).tolist()))
        correction = list(zip((f * item_bytes).tolist(), (f * item_s).tolist()))
        lookahead = self.params.lookahead_layers * self.groups
        cost.interrupt = InterruptPlan(prefetch, correction, lookahead, self.params.chunk_bytes)
        return cost

    def _candidates(self, ctx: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        """Blocks selection scores per request (int64 [n]); zeros without a measured selection cost (not needed)."""
        if self.selection_cost is None:
            return np.zeros(len(ctx), dtype=np.int64)
        return np.where(offloaded, self.recall.offloaded_blocks(ctx), 0)

    def _select_s(self, candidate_blocks: float) -> float:
        """Measured selection seconds of one layer (0 without a profile: summaries count as attended tokens)."""
        return self.selection_cost.seconds(float(candidate_blocks)) if self.selection_cost is not None else 0.0

    def _link_times(self, rec) -> tuple[np.ndarray, np.ndarray]:
        """(gather, link) seconds, float [G, L], under this policy's ``io``."""
        if rec.contiguous_s is not None and self.params.io == "per_fragment":
            link = np.where(rec.nbytes > 0, rec.contiguous_s[:, None], 0.0)
            return np.zeros_like(link), link
        return self.link.layer_times(rec.nbytes, rec.fragments, self.link_io, self.params.chunk_bytes)
