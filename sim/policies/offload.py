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
(eager backup, as SGLang HiSparse does, docs/sources.md §5.4): ``StepCost.d2h_bytes``, carried by the
GPU's D2H queue (sim/step/timing.py), which slows H2D by the hardware's ``d2h_coupling`` while busy.

With a calibrated profile (sim/config/profiles.py): its ``selection`` section charges measured selection time per
layer (for the candidate blocks of the offloaded requests) instead of counting summaries as attended
tokens; a hardware whose ``io_overlaps_compute`` is false (the CPU engine) adds each layer's gather and
copy time to that layer's compute instead of overlapping them.

I/O cost of one layer's recall by ``io`` (sim/step/link.py): ``per_fragment`` — one copy per fragment;
``batched`` — one batched-copy call; ``gather_scatter`` with sequential scheduling — host gather (the
host-gather resource), then one copy (the link); with interruptible scheduling — gather and copy stream in
chunks (the job holds the link for the pipelined time, link busy counts the copy only); ``gpu_gather`` —
a GPU kernel reads pinned host memory: link time, no gather, and SM time taken from compute.

Model assumption (``gpu_gather``): the kernel holds ``gpu_gather_sm_frac`` of the SMs while it runs, so the
GPU work item during which a recall is issued (item i − K for item i's recall, K = look-ahead in items)
is slowed by ``gpu_gather_sm_frac × min(kernel seconds, that item's compute)``; a recall issued before
the step's first item (the first K items' prefetch) overlaps no compute and slows nothing. Its urgent
correction is charged to the same item.
"""

from __future__ import annotations

import numpy as np

from sim.config import OffloadPolicy, Scenario
from sim.policies.base import Policy
from sim.serving.admission import Admission, IoAdaptiveAdmission, RecallBudget
from sim.step.cost import InterruptPlan, StepCost
from sim.step.draws import RecallDraws
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
        self.shared_cache = params.recall_cache == "shared" and not self.full
        buffer_blocks = 0 if self.full or self.shared_cache else params.recall_buffer_blocks
        self.resident_blocks = self.window_blocks + buffer_blocks
        self.recall_state_width = self.recall.state_width if self.recall.structured and not self.full else 0
        fixed = params.recall_cache_gib if self.shared_cache else None
        self.reserved_hbm_bytes = int(fixed * 2**30) if fixed is not None else 0
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
        self.sm_frac = scenario.hardware.gpu_gather_sm_frac
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
            self.layer_path_s(warm * fb, warm),
            self.layer_path_s(cold * fb, cold),
        )
        return IoAdaptiveAdmission(self, budget)

    def wants_offload(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.params.offload_threshold_tokens

    def device_blocks(self, ctx: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        bs = self.block_size
        dense = -(-ctx // bs)
        if not np.count_nonzero(offloaded):  # (a dense batch: the usual case on the scheduler's hot path)
            return dense
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
        if not np.count_nonzero(offloaded):
            return dense
        extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // self.block_size)
        return np.where(offloaded, extra, dense)

    def layer_link_s(self, nbytes: float, fragments: float) -> tuple[float, float]:
        """(host gather seconds, link seconds) of one layer's recall under this policy's ``io``; link seconds
        are PCIe time only (copy, or the GPU gather kernel), never host gather."""
        gather, link = self.link.layer_times([nbytes], [fragments], self.link_io, self.params.chunk_bytes)
        return float(gather[0]), float(link[0])

    def layer_path_s(self, nbytes: float, fragments: float) -> float:
        """Seconds one layer's recall needs from its I/O path in steady state: the streamed job's completion
        (gather and copy pipelined), max(gather, copy) for sequential gather-scatter (gather of the next layer
        overlaps this layer's copy), else the link time. What a recall-vs-compute bound should compare."""
        gather, link = self.layer_link_s(nbytes, fragments)
        if self.link_io == "streamed":
            return float(self.link.streamed_s([gather], [link], [nbytes], self.params.chunk_bytes)[0])
        return max(gather, link)

    def step_cost(
        self,
        ctx: np.ndarray,
        offloaded: np.ndarray,
        cold: np.ndarray,
        rng: np.random.Generator | RecallDraws,
        recall_state: np.ndarray | None = None,
        free_hbm_bytes: int = 0,
    ) -> StepCost:
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
        cost.d2h_bytes = n_off * self.kv_bytes_per_token  # eager backup of each offloaded request's new token
        if not n_off:
            return cost
        rec = self._recall(ctx, offloaded, cold, rng, groups, recall_state, free_hbm_bytes)
        cost.selected_fragments = rec.selected_fragments
        if not rec.nbytes.any():
            return cost
        gather, link = self._link_times(rec)  # float [G, L]
        cost.recall_bytes = int(rec.nbytes.sum())
        cost.num_fragments = int(rec.fragments.sum())
        cost.layer_bytes, cost.layer_fragments = rec.nbytes.sum(axis=0), rec.fragments.sum(axis=0)
        if self.params.io == "per_fragment":
            cost.num_transfers = cost.num_fragments
        else:  # one copy, batched call or kernel per (group, layer)
            cost.num_transfers = int(np.count_nonzero(rec.nbytes))
        if not self.io_overlaps:  # recall runs inline on the computing thread (CPU engine): it adds to the layer
            cost.compute_s = (np.asarray(cost.compute_s) + gather.T.ravel() + link.T.ravel()).tolist()
            return cost
        if not self.interruptible:
            cost.recall_s = link[0].tolist()
            cost.gather_s = gather[0].tolist() if self.params.io == "gather_scatter" else None
            if self.params.io == "gpu_gather":
                cost.compute_s = self._sm_shared(cost.compute_s, cost.recall_s, 1)
            return cost
        # items in GPU order (layer-major, group-minor), split into prefetch and urgent correction
        f = self.correction_frac
        lookahead = self.params.lookahead_layers * self.groups
        item_bytes, item_copy, item_gather = rec.nbytes.T.ravel().astype(float), link.T.ravel(), gather.T.ravel()
        item_s = item_copy
        if self.link_io == "streamed":
            item_s = self.link.streamed_s(item_gather, item_copy, item_bytes, self.params.chunk_bytes)
        elif self.params.io == "gpu_gather":
            cost.compute_s = self._sm_shared(cost.compute_s, item_copy.tolist(), lookahead)
        parts = np.stack([item_bytes, item_s, item_copy, item_gather], axis=1)  # float64 [items, 4]
        cost.interrupt = InterruptPlan((1 - f) * parts, f * parts, lookahead, self.params.chunk_bytes)
        return cost

    def is_steady(self, offloaded: np.ndarray) -> bool:
        """With no offloaded request and one micro-batch, :meth:`step_cost` returns the dense cost (the measured
        selection time of no candidates is 0)."""
        return self.groups == 1 and not np.count_nonzero(offloaded)

    def cache_holds(self, num_offloaded: int, free_hbm_bytes: int) -> bool:
        """Shared recall cache: the offloaded requests' expected working sets (budget blocks × KV heads for
        head-wise × layers × W/k, sim/step/recall.py) within the cache (its fixed size, or the free pool)."""
        if not self.shared_cache:
            return True
        rec = self.recall
        working = rec.budget_blocks * rec.heads * float((1.0 + rec.working_growth).sum())
        cache_bytes = self.reserved_hbm_bytes or free_hbm_bytes
        return num_offloaded * working <= cache_bytes / rec.fragment_bytes

    def _recall(self, ctx, offloaded, cold, rng, groups, recall_state, free_hbm_bytes):
        """The recall model's answer for the offloaded requests (their state rows updated in place)."""
        cache = None
        if self.shared_cache:  # fragments the shared cache holds: a fixed size, or what the pool leaves free
            cache_bytes = self.reserved_hbm_bytes or free_hbm_bytes
            cache = cache_bytes / self.recall.fragment_bytes
        state = recall_state[offloaded] if self.recall_state_width and recall_state is not None else None
        rec = self.recall.step(ctx[offloaded], cold[offloaded], rng, groups[offloaded], self.groups, state, cache)
        if state is not None:
            recall_state[offloaded] = state
        return rec

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

    def _sm_shared(self, compute_s: list[float], kernel_s: list[float], lookahead: int) -> list[float]:
        """Per-item compute with the SM time GPU gather kernels take (``io: gpu_gather``; module docstring):
        item i − lookahead is slowed by ``sm_frac × min(kernel_s[i], its compute)``."""
        frac = self.sm_frac
        out = list(compute_s)
        for i in range(lookahead, len(kernel_s)):
            j = i - lookahead
            out[j] += frac * min(kernel_s[i], compute_s[j])
        return out
