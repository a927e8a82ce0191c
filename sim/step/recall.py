"""Recall model: which blocks each offloaded request moves per layer and step, as bytes and fragments.

For an offloaded request r with ``ctx`` KV tokens, at layer l and step t (docs/design.md "Recall model")::

    offloaded_blocks n  = max(0, ctx − sink_tokens − recent_tokens) // block_size   (sink, window resident)
    selected k          = min(budget_tokens // block_size, n)
    change c[r,l,t]     ~ Kumaraswamy(a, b_l), mean m_l from recall_stats.change_mean_by_depth
    miss fraction q     = c · (1 − ρ · h)        ρ = returning_frac
    buffer hit h        = clip((B − k) / (W − k), 0, 1),  W = k · (1 + w · m_l)
    missing             = min(⌊k · q + U⌋ + fresh, k), U ~ Uniform(0, 1)   (unbiased stochastic rounding)

W is what an LRU buffer must hold to keep the last w = ``working_set_steps`` steps: the current k plus
the m_l·k blocks each step drops from the selection (they stay in LRU order behind the selected ones), or
W = k · ``working_set_ratio`` when the statistics carry a measured ratio (a real model's selections flicker
among few blocks, so W is far smaller than the bound). A
returning block left the selection j steps ago (j uniform in 1..w); it is still buffered when
k + j·m_l·k ≤ B, hence h. A recall buffer of B = ``recall_buffer_blocks`` ≥ W serves every returning block
from HBM. ``tests/sim/test_recall_reference.py`` checks h against an explicit LRU buffer that tracks
block ids. ``fresh`` is the block that just left the recent window when a layer selects it (:meth:`RecallModel.run`);
it is one of the k selected, so a cell never recalls more than k. The first step after (re)admission is cold:
q = 1. A fixed ``miss_frac`` in the policy replaces c · (1 − ρ h) (for tests and what-ifs).

Selection modes (docs/design.md §7): ``solohead`` — one set per (r, l), a fragment is one block with every KV
head; ``headwise`` — each of the H KV heads selects k blocks, sharing the (r, l, t) change draw (Model assumption),
so H·k·q fragments of block_size × head_dim × 2 × dtype bytes move (SoloHead's bytes, H times the fragments);
``all`` — FlexGen-like: every offloaded block, every step, no buffer, one contiguous fragment per (r, l).

One definition over a step axis (docs/design.md §13): :meth:`RecallModel.run` computes k steps as
[k, n_offloaded, num_layers] arrays in one pass (only the drift's AR(1) recurrence is iterated, sim/step/drift.py);
a single step is a run of one. Draws come from one stream per kind (sim/step/draws.py) and are peeked; the decode
run's commit (sim/step/cost.py ``DecodeRun.commit``) consumes those of the steps taken. Oracle:
tests/sim/oracles/recall.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.config import ModelSpec, OffloadPolicy, RecallStatsSpec
from sim.step.distributions import kumaraswamy_b
from sim.step.draws import DrawStream, RecallDraws
from sim.step.drift import drift_kernel, fast_drift
from sim.step.link import LinkModel
from sim.step.shared_cache import lru_hits


@dataclass(slots=True)
class RecallRun:
    """What k consecutive steps recall, per step, micro-batch group and layer, and what committing the first j steps
    takes (:meth:`RecallModel.run`; a single step is a run of one; ``DecodeRun.commit``)."""

    nbytes: np.ndarray  # int64 [k, G, L]
    fragments: np.ndarray  # int64 [k, G, L]
    # float64 [k, G], selection "all" (io per_fragment): Σ per-request copy seconds of one layer; else None
    contiguous_s: np.ndarray | None
    selected_fragments: np.ndarray  # int64 [k] fragments selected over every layer and request (the miss base)
    # each stream drawn from, with its draws per step (int) or the draws taken by the end of each step (int64 [k])
    used: list[tuple[DrawStream, int | np.ndarray]] = field(default_factory=list)
    # the state after each step: factors float [n, L] (None: unchanged, nobody joined), drift and steps of shift
    # left float [k, n]
    state: tuple[np.ndarray | None, np.ndarray, np.ndarray] | None = None


_NO_CELLS = np.zeros((0, 0, 0), dtype=np.int64)  # the arrays of a run not computed yet
_NO_STEPS = np.zeros(0, dtype=np.int64)


class RecallModel:
    """Per-layer recall of the offloaded part of a decode batch.

    Args:
        model: model card (KV bytes per token and layer, KV heads).
        policy: the offload policy (block size, budget, window, buffer, selection, io, miss_frac).
        stats: step-to-step selection statistics (per-layer change distribution, reuse).
        link: link and host-gather cost model.
        kernels: ``run.kernels``: ``python`` runs the drift recurrence (sim/step/drift.py) as Python, else it is
            compiled when numba is installed (imported at the first run that drifts).
    """

    def __init__(
        self, model: ModelSpec, policy: OffloadPolicy, stats: RecallStatsSpec, link: LinkModel, kernels: str = "auto"
    ) -> None:
        self.num_layers = L = model.num_layers
        self.fast_drift = fast_drift(kernels)
        self.drift = None  # the drift recurrence (sim/step/drift.py drift_kernel), loaded at the first run that drifts
        self.selection, self.io, self.link = policy.selection, policy.io, link
        self.block_size = policy.block_size
        self.budget_blocks = policy.budget_tokens // policy.block_size
        self.buffer_blocks = policy.recall_buffer_blocks
        self.window_tokens = policy.sink_tokens + policy.recent_tokens
        self.fixed_miss_frac = policy.miss_frac
        self.block_bytes_layer = policy.block_size * model.kv_bytes_per_token_per_layer
        latent = model.is_mla and model.mla_cache  # one latent shared by every head: no per-head fragments
        self.heads = model.num_kv_heads if policy.selection == "headwise" and not latent else 1
        self.fragment_bytes = self.block_bytes_layer // self.heads
        depth = np.linspace(0.0, 1.0, L) if L > 1 else np.zeros(1)
        knots = np.array(stats.change_mean_by_depth, dtype=float)
        self.change_mean = np.interp(depth, knots[:, 0], knots[:, 1])  # [L]
        self.inv_a = 1.0 / stats.change_shape_a
        self.inv_b = 1.0 / np.array([kumaraswamy_b(m, stats.change_shape_a) for m in self.change_mean])
        self.returning = stats.returning_frac
        self.working_set_steps = stats.working_set_steps
        self.stats = stats
        # whether any variation persists across steps (else draws are independent per cell, and no state)
        self.structured = max(stats.request_sigma, stats.layer_sigma, stats.drift_sigma, stats.burst_prob) > 0
        self.drift_scale = float(np.sqrt(1.0 - stats.drift_corr**2))  # the drift's innovation scale
        self._budget_miss: np.ndarray | None = None  # 1 − ρ·h of a request selecting the full budget, per layer
        if stats.working_set_ratio is not None:  # measured W / k (calibrate selection)
            self.working_growth = np.full(L, max(stats.working_set_ratio - 1.0, 1e-9))
        else:
            self.working_growth = stats.working_set_steps * self.change_mean  # [L]: (W − k) / k

    def offloaded_blocks(self, ctx: np.ndarray) -> np.ndarray:
        """Blocks outside the sink and recent window, per request (int64 [n])."""
        return np.maximum(ctx - self.window_tokens, 0) // self.block_size

    # ---- per-request state: persistent factors, drift, topic shifts -------------------------------
    @property
    def state_width(self) -> int:
        """Columns of the per-request recall state: L log-factors, the drift x, the steps of shift left."""
        return self.num_layers + 2

    def join_draws(self, m: int) -> int:
        """Normals :meth:`_join` takes from the ``join`` stream for ``m`` joining requests."""
        return m * (self.num_layers + 2)

    def _join(self, state: np.ndarray, rows: np.ndarray, z: np.ndarray) -> None:
        """Set the persistent factors of the requests in ``rows`` (bool [n]), which just joined the batch, from
        ``z``: float64 [join_draws(m)] standard normals (per request, per (request, layer), the drift's start)."""
        st, L, m = self.stats, self.num_layers, int(rows.sum())
        z_request = z[:m, None]
        z_layer = z[m : m + m * L].reshape(m, L)
        mean_fix = 0.5 * (st.request_sigma**2 + st.layer_sigma**2)
        state[rows, :L] = st.request_sigma * z_request + st.layer_sigma * z_layer - mean_fix
        state[rows, L] = z[m + m * L :]  # the drift starts in its stationary distribution
        state[rows, L + 1] = 0.0

    # ---- buffer and cache hits ---------------------------------------------------------------------
    def buffer_hit(self, selected: np.ndarray) -> np.ndarray:
        """Per-request recall buffer: fraction of returning blocks still buffered, float [..., n, L] for int [..., n]
        (h of the module docstring, with W − k = k · growth)."""
        k = np.maximum(selected, 1)[..., None].astype(float)
        return np.clip((self.buffer_blocks - k) / (k * self.working_growth), 0.0, 1.0)

    def shared_hit(self, selected: np.ndarray, capacity_fragments: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """One HBM recall cache per GPU, LRU over (request, layer, block): (hit fraction of the blocks a stream keeps
        from its previous selection, hit fraction of its returning blocks), float [...] each, for ``selected`` int
        [..., n] and ``capacity_fragments`` float [...] (the step axis leading; a single step has none). The batch
        touches K = Σ k fragments per step, G = Σ k · growth / w of them new to their stream's recent selections
        (the module docstring's W − k over its w steps); the hit model is sim/step/shared_cache.py ``lru_hits``."""
        frags = np.asarray(selected * self.heads, dtype=float)
        total = frags.sum(axis=-1) * self.num_layers  # K [...]
        growth = frags.sum(axis=-1) * float(self.working_growth.sum()) / self.working_set_steps  # G [...]
        return lru_hits(total, growth, capacity_fragments, self.working_set_steps)

    def run(
        self,
        ctx: np.ndarray,
        cold: np.ndarray,
        draws: RecallDraws,
        groups: np.ndarray | None = None,
        num_groups: int = 1,
        state: np.ndarray | None = None,
        cache_fragments: np.ndarray | None = None,
    ) -> RecallRun:
        """Recall of k consecutive steps of the same offloaded requests, draws peeked, not consumed
        (sim/step/cost.py ``DecodeRun.commit`` consumes those of the steps taken); step t's numbers are what t + 1
        committed runs of one step give (each kind of draw has its own stream, sim/step/draws.py). The module
        docstring's formulas, in order: the selection, the change draws (Kumaraswamy), the persistent factors, drift
        and topic shifts (``state``), the buffer's or the shared cache's hits, the unbiased rounding and the fresh
        block.

        Args:
            ctx: int64 [k, n], KV tokens each offloaded request attends at each step.
            cold: bool [n], recall buffer empty (first step after admission; only step 0 can be cold: everything is
                recalled, persistent factors are drawn).
            draws: the replica's draw streams (sim/step/draws.py).
            groups: int [n] micro-batch group of each request (None: all in group 0).
            num_groups: G.
            state: float [n, state_width] per-request recall state before the run (read only; L log-factors, the
                drift, the steps of shift left), or None for independent draws.
            cache_fragments: float64 [k] shared recall cache capacity per step in fragments, or None (per-request
                buffers).
        """
        k, n = ctx.shape
        L, G, st = self.num_layers, num_groups, self.stats
        selected = self.offloaded_blocks(ctx)  # int64 [k, n] blocks selected per layer (per head for head-wise)
        gid = np.zeros(n, dtype=np.int64) if groups is None else groups
        if self.selection == "all":  # no draws: every offloaded block, one contiguous fragment per (request, layer)
            cell = (np.arange(k)[:, None] * G + gid).ravel()  # (step, group) of each (step, request), flat
            # Σ over each group's requests in request order
            copy_s = self.link.copies_s(selected * self.block_bytes_layer)  # one contiguous copy per request,
            weights = np.where(copy_s > 0, np.maximum(copy_s, self.link.call_s), 0.0).ravel()  # ≥ a call's cost
            contiguous = np.bincount(cell, weights, k * G).reshape(k, G)
            nbytes = np.bincount(cell, selected.ravel(), k * G).reshape(k, G).astype(np.int64) * self.block_bytes_layer
            frags = np.bincount(cell[selected.ravel() > 0], minlength=k * G).reshape(k, G)
            nbytes, frags = np.repeat(nbytes[:, :, None], L, axis=2), np.repeat(frags[:, :, None], L, axis=2)
            return RecallRun(nbytes, frags, contiguous, frags.sum(axis=(1, 2)))
        selected = np.minimum(selected, self.budget_blocks)
        out = RecallRun(_NO_CELLS, _NO_CELLS, None, _NO_STEPS)  # (arrays filled below)
        # miss fractions q, float [k, n, L]
        if self.fixed_miss_frac is not None:
            q = np.full((k, n, L), self.fixed_miss_frac)
            q[0][cold] = 1.0
        else:
            u = draws.change.peek(k * n * L).reshape(k, n, L)
            out.used.append((draws.change, n * L))
            # Hot path: the Kumaraswamy inverse CDF (1 − (1 − u)^(1/b))^(1/a), each pass in place (the same operations)
            change = 1.0 - u
            change **= self.inv_b
            np.subtract(1.0, change, out=change)
            change **= self.inv_a
            if self.selection == "headwise":
                change *= st.headwise_miss_ratio
            shifting = None
            if state is not None and self.structured:  # the joins (step 0), then k steps of drift and topic shifts
                joins = bool(np.count_nonzero(cold))
                work = state.copy() if joins else state  # read only unless someone joins
                if joins:
                    count = self.join_draws(int(cold.sum()))
                    self._join(work, cold, draws.join.peek(count))
                    out.used.append((draws.join, np.full(k, count)))
                z = draws.drift.peek(k * n).reshape(k, n)
                out.used.append((draws.drift, n))
                burst = st.burst_prob > 0
                if burst:
                    starts = draws.burst.peek(k * n).reshape(k, n)
                    geometric = draws.geometric(1.0 / st.burst_steps)
                    lengths = geometric.peek(k * n).reshape(k, n).astype(np.float64)
                    out.used += [(draws.burst, n), (geometric, n)]
                else:
                    starts = lengths = np.zeros((k, n))
                if self.drift is None:
                    self.drift = drift_kernel(self.fast_drift)
                drift, lefts, shifting = self.drift(
                    work[:, L].copy(), work[:, L + 1].copy(), z, starts, lengths, st.drift_corr, self.drift_scale,
                    st.burst_prob, burst,
                )  # fmt: skip
                out.state = (work[:, :L] if joins else None, drift, lefts)
                log_factor = work[:, :L][None, :, :] + st.drift_sigma * drift[:, :, None]
                log_factor -= 0.5 * st.drift_sigma**2
                change *= np.exp(log_factor, out=log_factor)
            np.minimum(change, 1.0, out=change)
            if cache_fragments is None:  # q = change · (1 − ρ · buffer_hit)
                q = change
                budget = self.budget_blocks
                if selected.size and selected.min() == budget == selected.max():  # every request at the full budget
                    row = self._budget_miss  # (the usual case: each cell's value, computed once per model)
                    if row is None:
                        row = self._budget_miss = (1.0 - self.returning * self.buffer_hit(np.array([budget])))[0]
                    q *= row
                else:
                    q *= 1.0 - self.returning * self.buffer_hit(selected)
            else:
                keep, back = self.shared_hit(selected, cache_fragments)  # float [k] each
                keep, back = keep[:, None, None], back[:, None, None]
                q = (1.0 - change) * (1.0 - keep) + change * (1.0 - self.returning * back)
            if shifting is not None and np.count_nonzero(shifting):
                q = np.where(shifting[:, :, None], np.maximum(q, st.burst_change_frac), q)
            q[0][cold] = 1.0
        rounding = draws.rounding.peek(k * n * L).reshape(k, n, L)
        out.used.append((draws.rounding, n * L))
        selected_fragments = selected * self.heads  # int64 [k, n]
        cell = selected_fragments[:, :, None]  # fragments each (step, request, layer) selects
        q *= cell  # (q is this run's own array) floor(cell · q + rounding), in place
        q += rounding
        missing = np.floor(q, out=q).astype(np.int64)  # <= cell, as q <= 1 and rounding < 1
        # The fresh block: every block_size tokens a block leaves the window for the host; each layer selects it at
        # once with probability fresh_block_frac (each KV head on its own, head-wise) and, never recalled before, it
        # misses. It is one of the cell's selected blocks: where every selected block misses already (q = 1: an empty
        # shared cache, a topic shift of change 1) it is recalled once, so a cell never recalls more than it selects.
        frac = st.fresh_block_frac
        if frac > 0 and self.fixed_miss_frac is None:
            w, bs = self.window_tokens, self.block_size
            fresh = (ctx > w) & ((ctx - w) % bs == 0)  # bool [k, n] the (step, request) cells with a fresh block
            fresh[0] &= ~cold
            total = int(np.count_nonzero(fresh))
            if total:
                upto = np.cumsum(fresh.sum(axis=1))  # fresh blocks by the end of each step
                stream = draws.binomial(self.heads, frac)
                out.used.append((stream, upto * L))
                missing[fresh] += stream.peek(total * L).reshape(total, L)
                np.minimum(missing, cell, out=missing)
        if G == 1:
            frags = missing.sum(axis=1)[:, None, :]
        else:
            frags = np.zeros((k, G, L), dtype=np.int64)
            np.add.at(frags, (np.arange(k)[:, None], gid[None, :]), missing)
        out.fragments, out.nbytes = frags, frags * self.fragment_bytes
        out.selected_fragments = selected_fragments.sum(axis=1) * L
        return out

    def expected_layer_fragments(self, cold: bool) -> float:
        """Expected fragments one offloaded request at the full budget recalls per layer and step (admission's
        estimate); warm, the block that leaves the recent window every ``block_size`` steps is averaged in."""
        k = self.budget_blocks * self.heads
        if cold or self.selection == "all":
            return float(k)
        if self.fixed_miss_frac is not None:
            return k * self.fixed_miss_frac
        hit = self.buffer_hit(np.array([self.budget_blocks]))[0]
        change = self.change_mean * (self.stats.headwise_miss_ratio if self.selection == "headwise" else 1.0)
        fresh = self.heads * self.stats.fresh_block_frac / self.block_size
        return float(k * np.mean(np.minimum(change, 1.0) * (1.0 - self.returning * hit))) + fresh
