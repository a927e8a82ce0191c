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
(eager backup, as SGLang HiSparse does, docs/sources.md §5.4): ``DecodeRun.d2h_bytes``, carried by the
GPU's D2H queue (sim/step/timing.py), which slows H2D by the hardware's ``d2h_coupling`` while busy.

Selection (sparse policies, every step with offloaded requests, whether it recalls or not): per layer and
micro-batch group, ``select_s(C) = base_us + per_block_ns · C`` over the group's C candidate blocks
(sim/config/measured.py ``SelectionProfile``): the policy's ``selection_launch_us`` and ``selection_per_block_ns``
(the top-k kernel; the block summaries are read as attended tokens), or, with a calibrated profile
(sim/config/profiles.py) that has a ``selection`` section, its measured figures, which include reading the
summaries (they then leave the attended tokens). A hardware whose ``io_overlaps_compute`` is false (the CPU
engine) adds each layer's gather and copy time to that layer's compute instead of overlapping them.

What a step that recalls pays beyond its copies (docs/design.md §8, docs/sources.md §10.1), when the recall is
issued by the host (every ``io`` but ``gpu_gather``, whose kernel a graph captures) on a GPU (I/O overlaps
compute): the step runs eagerly — a CUDA graph cannot capture data-dependent copies — so each of its layers pays
``eager_launch_us_per_layer``; each (layer, group) that recalls pays ``event_wait_us`` for its wait on the
copy's event. A step that recalls nothing keeps the graph and pays neither.

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

from sim.config import OffloadPolicy, Scenario, SelectionProfile
from sim.policies.base import Policy
from sim.step.cost import DecodeRun
from sim.step.draws import RecallDraws
from sim.step.recall import RecallModel


class OffloadServing(Policy):
    """Requests with prompts of at least ``offload_threshold_tokens`` run offloaded; others run dense."""

    params: OffloadPolicy

    def __init__(self, scenario: Scenario, name: str, params: OffloadPolicy) -> None:
        super().__init__(scenario, name, params)
        self.link = self.gpu.link  # one GPU's link share (tp_size)
        # recall per GPU of its own KV heads (self.model is one GPU's shard at tp_size > 1)
        self.recall = RecallModel(self.model, params, scenario.recall_stats, self.link, scenario.run.kernels)
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
        measured = profile.selection if profile is not None else None
        # A measured selection cost read the summaries itself; the default model charges them as attended tokens.
        self.summaries_attended = not self.full and measured is None
        default = SelectionProfile(base_us=params.selection_launch_us, per_block_ns=params.selection_per_block_ns)
        if self.full or (measured is None and not (default.base_us or default.per_block_ns)):
            self.selection_cost: SelectionProfile | None = None  # nothing selected, or selection costs nothing
        else:
            self.selection_cost = measured if measured is not None else default
        self.io_overlaps = scenario.hardware.io_overlaps_compute
        self.sm_frac = scenario.hardware.gpu_gather_sm_frac
        # Host-issued copies on a GPU break the step's graph into eager launches and event waits (module docstring).
        pays = self.io_overlaps and params.io != "gpu_gather"
        self.eager_launch_s = params.eager_launch_us_per_layer * 1e-6 if pays else 0.0
        self.event_wait_s = params.event_wait_us * 1e-6 if pays else 0.0
        self._recall_table = np.zeros((0, 4))  # the recall costs of 0, 1, ... fragments (step_costs)

    def io_layer_s(self) -> tuple[float, float]:
        """Expected per-layer I/O-path seconds (:meth:`layer_path_s`) of one warm offloaded request and of one cold
        one (its recall buffer empty: it recalls its whole selection): what IO-adaptive admission's bound takes
        (sim/serving/policy_admission.py)."""
        fb = self.recall.fragment_bytes
        warm, cold = (self.recall.expected_layer_fragments(c) for c in (False, True))
        return self.layer_path_s(warm * fb, warm), self.layer_path_s(cold * fb, cold)

    def wants_offload(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.params.offload_threshold_tokens

    def device_blocks(self, tokens, offloaded, held: bool = True):
        """The offload policy's block rule (:meth:`Policy.device_blocks`; one definition for one request, in plain
        Python, and for arrays): a dense request's ceil(tokens / block_size); an offloaded one's block summaries (or,
        with ``selection: all``, two layers of staging), plus, when ``held``, its sink, recent window and recall
        buffer, at most the dense count. ``held=False``: the growth of ``tokens`` more tokens (summaries or staging
        alone)."""
        bs = self.block_size
        dense = -(-tokens // bs)
        if not isinstance(dense, np.ndarray):  # one request
            if not offloaded:
                return dense
            extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // bs)  # staging or summaries
            return min(dense, self.resident_blocks + extra) if held else extra
        if not np.count_nonzero(offloaded):  # (a dense batch: the usual case on the scheduler's hot path)
            return dense
        extra = -(-2 * dense // self.num_layers) if self.full else -(-dense // bs)
        return np.where(offloaded, np.minimum(dense, self.resident_blocks + extra) if held else extra, dense)

    def layer_link_s(self, nbytes: float, fragments: float) -> tuple[float, float]:
        """(host gather seconds, link seconds) of one layer's recall under this policy's ``io``; link seconds
        are PCIe time only (copy, or the GPU gather kernel), never host gather."""
        gather, link = self.link.layer_times([nbytes], [fragments], self.link_io, self.params.chunk_bytes)
        return float(gather[0]), float(link[0])

    def layer_path_s(self, nbytes: float, fragments: float) -> float:
        """Seconds one layer's recall needs from its I/O path while layers follow one another: the streamed job's
        completion (gather and copy pipelined), max(gather, copy) for sequential gather-scatter (gather of the next
        layer overlaps this layer's copy), else the link time. What a recall-vs-compute bound should compare."""
        gather, link = self.layer_link_s(nbytes, fragments)
        if self.link_io == "streamed":
            return float(self.link.streamed_s([gather], [link], [nbytes], self.params.chunk_bytes)[0])
        return max(gather, link)

    def step_costs(
        self,
        ctx: np.ndarray,
        offloaded: np.ndarray,
        cold: np.ndarray,
        draws: RecallDraws,
        recall_state: np.ndarray | None,
        free_hbm_bytes: np.ndarray,
    ) -> DecodeRun:
        """The costs of k decode steps of one batch (its membership fixed), recall draws peeked, not consumed
        (``DecodeRun.commit`` consumes those of the steps taken). The one definition of an offloaded step's cost: a
        single step is k = 1, a skip-ahead run (sim/serving/decode.py) takes k at once where :meth:`runs_offloaded`
        holds.

        Args:
            ctx: int64 [k, n] KV tokens each request attends at each step.
            offloaded: bool [n]; cold: bool [n] (step 0 only: the first step after (re)admission).
            draws: the replica's streams (sim/step/draws.py).
            recall_state: float [n, recall_state_width] before the run (read only), or None.
            free_hbm_bytes: int64 [k] KV-pool bytes free at each step (a dynamically sized shared cache lives there).
        """
        k, batch = ctx.shape
        L, G, params = self.num_layers, self.groups, self.params
        if self.full:
            attended_each = ctx
        elif not self.summaries_attended:  # a measured selection cost replaces reading summaries as tokens
            attended_each = np.where(offloaded, np.minimum(ctx, self.sparse_tokens), ctx)
        else:
            attended_each = np.where(offloaded, np.minimum(ctx, self.sparse_tokens) + -(-ctx // self.block_size), ctx)
        attended = attended_each.sum(axis=1)
        candidates = self.candidate_blocks(ctx, offloaded) if self.selection_cost is not None else None  # int64 [k, n]
        groups = None  # micro-batch group of each request (None: one group)
        if G == 1:
            sizes, att = (batch,), attended[:, None]
            cand = None if candidates is None else candidates.sum(axis=1)[:, None]
        else:  # micro-batches: each group runs every layer on its own (re-reading the weights)
            groups = np.arange(batch) % G
            sizes = np.bincount(groups, minlength=G)
            cells = (np.arange(k)[:, None], groups[None, :])
            att, cand = np.zeros((k, G), np.int64), np.zeros((k, G), np.int64)
            np.add.at(att, cells, attended_each)
            if candidates is not None:
                np.add.at(cand, cells, candidates)
        # Seconds of one layer of each group at each step: compute, plus the selection time of the group's candidate
        # blocks (SelectionProfile.seconds_array: the policy's default or a profile's measured figures) where selection
        # costs anything. One step: the compute model's scalar form (numpy's per-call cost dominates there).
        group_s = np.empty((k, G))
        for g in range(G):
            layer_s = self.compute.decode_layer_s(int(sizes[g]), int(att[0, g]) if k == 1 else att[:, g])
            if self.selection_cost is not None:
                layer_s = layer_s + self.selection_cost.seconds_array(cand[:, g])
            group_s[:, g] = layer_s
        n_off = int(np.count_nonzero(offloaded))
        head_s, d2h_bytes = self.compute.decode_head_s(batch), n_off * self.kv_bytes_per_token
        lookahead = params.lookahead_layers * G
        if not n_off:  # nothing recalled
            per_step, per_layer = np.zeros(k, dtype=np.int64), np.zeros((k, L), dtype=np.int64)
            return DecodeRun(
                group_s, None, head_s, d2h_bytes, L, attended, per_layer, per_layer, per_step, per_step, per_step,
                per_step, lookahead, params.chunk_bytes,
            )  # fmt: skip
        cache = None
        if self.shared_cache:  # fragments the shared cache holds: a fixed size, or what the pool leaves free
            cache_bytes = np.full(k, self.reserved_hbm_bytes) if self.reserved_hbm_bytes else free_hbm_bytes
            cache = cache_bytes / self.recall.fragment_bytes
        every = n_off == batch  # (the recall model reads its arrays: no copies of them when all are offloaded)
        state = None
        if self.recall_state_width and recall_state is not None:
            state = recall_state if every else recall_state[offloaded]
        gid = None if groups is None else groups[offloaded]
        off_ctx, off_cold = (ctx, cold) if every else (ctx[:, offloaded], cold[offloaded])
        rec = self.recall.run(off_ctx, off_cold, draws, gid, G, state, cache)
        nbytes, frags = rec.nbytes, rec.fragments  # int64 [k, G, L]
        if rec.contiguous_s is None:  # sparse selection: a cell's recall costs are a function of its fragments alone,
            table = self._recall_table  # computed once per count and looked up (the same numbers, per cell)
            if len(table) <= frags.max():
                fragments = np.arange(max(int(frags.max()) + 1, 2 * len(table), 64))
                table = self._recall_table = self._cell_costs(fragments * self.recall.fragment_bytes, fragments)
            cells = np.take(table, frags, axis=0)
        elif params.io == "per_fragment":  # selection all: one copy per request
            link = np.where(nbytes > 0, rec.contiguous_s[:, :, None], 0.0)
            cells = np.stack((nbytes.astype(float), link, link, np.zeros_like(link)), axis=-1)
        else:  # selection all: one contiguous fragment per request, of its own size
            cells = self._cell_costs(nbytes, frags)
        gather, link = cells[..., 3], cells[..., 2]  # float64 [k, G, L] host gather and link seconds
        if G == 1:  # per layer, summed over the groups (one group: the same numbers, reshaped)
            layer_bytes, layer_frags = nbytes.reshape(k, L), frags.reshape(k, L)
        else:
            layer_bytes, layer_frags = nbytes.sum(axis=1), frags.sum(axis=1)
        recall_bytes, num_fragments = layer_bytes.sum(axis=1), layer_frags.sum(axis=1)
        if params.io == "per_fragment":
            transfers = num_fragments
        else:  # one copy, batched call or kernel per (group, layer)
            transfers = (nbytes != 0).reshape(k, -1).sum(axis=1)
        costs = DecodeRun(
            group_s, None, head_s, d2h_bytes, L, attended, layer_bytes, layer_frags, recall_bytes, num_fragments,
            transfers, rec.selected_fragments, lookahead, params.chunk_bytes, rec,
        )  # fmt: skip
        # [k, G, L] -> [k, L·G] in GPU order (layer-major, group-minor)
        overhead = None  # float64 [k, L·G] eager launches and event waits of the steps that recall, or None
        if self.eager_launch_s or self.event_wait_s:  # (a step recalls where it moves any bytes)
            moves = nbytes.transpose(0, 2, 1).reshape(k, L * G) > 0
            overhead = self.eager_launch_s * (recall_bytes > 0)[:, None] + self.event_wait_s * moves
        if not self.io_overlaps:  # recall runs inline on the computing thread (CPU engine): it adds to the layer
            inline = (gather.transpose(0, 2, 1).reshape(k, L * G), link.transpose(0, 2, 1).reshape(k, L * G))
            costs.compute_s = np.tile(group_s, L) + inline[0] + inline[1]
        elif not self.interruptible:
            costs.sequential = (link[:, 0], gather[:, 0] if params.io == "gather_scatter" else np.zeros((k, L)))
            if params.io == "gpu_gather":
                costs.compute_s = self._sm_shared(np.tile(group_s, L), link[:, 0], 1)
            elif overhead is not None:  # overhead plus each group's layer seconds at every layer (no tiled copy)
                overhead.reshape(k, L, G)[...] += group_s[:, None, :]
                costs.compute_s = overhead
        else:  # items in GPU order, split into prefetch and urgent correction
            parts = cells.transpose(0, 2, 1, 3).reshape(k, L * G, 4)  # float64 [k, L·G, 4]
            if params.io == "gpu_gather":
                costs.compute_s = self._sm_shared(np.tile(group_s, L), parts[..., 2], costs.lookahead_items)
            if overhead is not None:  # (never with gpu_gather: its recall is in the graph)
                overhead.reshape(k, L, G)[...] += group_s[:, None, :]
                costs.compute_s = overhead
            f = self.correction_frac
            costs.jobs = ((1 - f) * parts, f * parts)
        return costs

    def _cell_costs(self, nbytes: np.ndarray, fragments: np.ndarray) -> np.ndarray:
        """What (group, layer) recalls of ``nbytes`` in ``fragments`` (int64 arrays of one shape) cost on the link:
        float64 [..., 4] of bytes, link-held seconds (the streamed job, else the link's), link seconds and host gather
        seconds (:meth:`LinkModel.layer_times`, :meth:`LinkModel.streamed_s`; the interruptible jobs' columns)."""
        gather, link = self.link.layer_times(nbytes, fragments, self.link_io, self.params.chunk_bytes)
        held = link
        if self.link_io == "streamed":
            held = self.link.streamed_s(gather, link, nbytes.astype(float), self.params.chunk_bytes)
        return np.stack((nbytes.astype(float), held, link, gather), axis=-1)

    def runs_offloaded(self) -> bool:
        """Whether skip-ahead times k offloaded steps at once (sim/serving/decode.py, compiled run kernels):
        one micro-batch on a card whose I/O overlaps compute, sparse selection, any ``io`` but ``gpu_gather`` (its
        SM sharing makes a step's layers differ); other configurations step one at a time through the same
        :meth:`step_costs`."""
        return not self.full and self.groups == 1 and self.io_overlaps and self.params.io != "gpu_gather"

    def is_recall_free(self, offloaded: np.ndarray) -> bool:
        """With no offloaded request and one micro-batch, a step costs what a dense one does (the measured
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

    def candidate_blocks(self, ctx: np.ndarray, offloaded: np.ndarray) -> np.ndarray:
        """Blocks selection scores per request (int64 [..., n] for ``ctx`` [..., n]; bool [n] ``offloaded``): an
        offloaded request's blocks outside the sink and window, none of a dense one's (it reads no summaries)."""
        return np.where(offloaded, self.recall.offloaded_blocks(ctx), 0)

    def _sm_shared(self, compute_s: np.ndarray, kernel_s: np.ndarray, lookahead: int) -> np.ndarray:
        """Per-item compute (float64 [k, items]) with the SM time GPU gather kernels (float64 [k, m]) take
        (``io: gpu_gather``; module docstring): item i − lookahead is slowed by ``sm_frac × min(kernel_s[i], its
        compute)``."""
        out = compute_s.copy()
        m = kernel_s.shape[1] - lookahead
        if m > 0:
            out[:, :m] += self.sm_frac * np.minimum(kernel_s[:, lookahead:], compute_s[:, :m])
        return out
