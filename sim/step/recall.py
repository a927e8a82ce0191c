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
block ids. ``fresh`` is the block that just left the recent window when a layer selects it (:meth:`fresh_misses`);
it is one of the k selected, so a cell never recalls more than k. The first step after (re)admission is cold:
q = 1. A fixed ``miss_frac`` in the policy replaces c · (1 − ρ h) (for tests and what-ifs).

Selection modes:

* ``solohead`` — one set per (r, l); a fragment is one block with every KV head
  (block_size × kv_bytes_per_token_per_layer bytes).
* ``headwise`` — each of the H KV heads selects k blocks of its own; heads share the (r, l, t) change
  draw (Model assumption), so H·k·q head-blocks move, each its own fragment of
  block_size × head_dim × 2 × dtype bytes. The bytes equal SoloHead's at the same q; the fragments are
  H times as many, and small.
* ``all`` — FlexGen-like: every offloaded block, every step, no buffer; one contiguous fragment per
  (r, l) of n blocks.

Hot path: draws are (n_offloaded, num_layers) arrays, one vectorised pass per step; only per-layer sums
leave this module. Each kind of draw has its own stream (sim/step/draws.py), so k steps can be drawn at once
with the same numbers (sim/step/recall_run.py, skip-ahead over offloaded steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config import ModelSpec, OffloadPolicy, RecallStatsSpec
from sim.step.draws import RecallDraws, as_draws
from sim.step.link import LinkModel


@dataclass(slots=True)
class LayerRecall:
    """What one decode step recalls, per micro-batch group and layer (arrays [num_groups, num_layers])."""

    nbytes: np.ndarray  # int64 [G, L]
    fragments: np.ndarray  # int64 [G, L]
    contiguous_s: np.ndarray | None  # float [G]: selection "all", per_fragment: Σ per-request copy time per layer
    selected_fragments: int = 0  # fragments the step selected over every layer and request (miss fraction's base)


def kumaraswamy_b(mean: float, a: float) -> float:
    """The Kumaraswamy ``b`` giving ``mean`` for shape ``a`` (mean = b·B(1 + 1/a, b), decreasing in b)."""
    from math import lgamma

    def mean_of(b: float) -> float:
        return float(np.exp(np.log(b) + lgamma(1 + 1 / a) + lgamma(b) - lgamma(1 + 1 / a + b)))

    lo, hi = 1e-6, 1e6
    for _ in range(200):  # bisection in log space
        mid = (lo * hi) ** 0.5
        new = (mid, hi) if mean_of(mid) > mean else (lo, mid)
        if new == (lo, hi):  # a fixed point (~60 halvings): the remaining iterations would not move it
            break
        lo, hi = new
    return (lo * hi) ** 0.5


class RecallModel:
    """Per-layer recall of the offloaded part of a decode batch.

    Args:
        model: model card (KV bytes per token and layer, KV heads).
        policy: the offload policy (block size, budget, window, buffer, selection, io, miss_frac).
        stats: step-to-step selection statistics (per-layer change distribution, reuse).
        link: link and host-gather cost model.
    """

    def __init__(self, model: ModelSpec, policy: OffloadPolicy, stats: RecallStatsSpec, link: LinkModel) -> None:
        self.num_layers = L = model.num_layers
        self.selection, self.io, self.link = policy.selection, policy.io, link
        self.block_size = policy.block_size
        self.budget_blocks = policy.budget_tokens // policy.block_size
        self.buffer_blocks = policy.recall_buffer_blocks
        self.window_tokens = policy.sink_tokens + policy.recent_tokens
        self.fixed_miss_frac = policy.miss_frac
        self.block_bytes_layer = policy.block_size * model.kv_bytes_per_token_per_layer
        self.heads = model.num_kv_heads if policy.selection == "headwise" else 1
        self.fragment_bytes = self.block_bytes_layer // self.heads
        depth = np.linspace(0.0, 1.0, L) if L > 1 else np.zeros(1)
        knots = np.array(stats.change_mean_by_depth, dtype=float)
        self.change_mean = np.interp(depth, knots[:, 0], knots[:, 1])  # [L]
        self.inv_a = 1.0 / stats.change_shape_a
        self.inv_b = 1.0 / np.array([kumaraswamy_b(m, stats.change_shape_a) for m in self.change_mean])
        self.returning = stats.returning_frac
        self.stats = stats
        if stats.working_set_ratio is not None:  # measured W / k (calibrate selection)
            self.working_growth = np.full(L, max(stats.working_set_ratio - 1.0, 1e-9))
        else:
            self.working_growth = stats.working_set_steps * self.change_mean  # [L]: (W − k) / k

    def offloaded_blocks(self, ctx: np.ndarray) -> np.ndarray:
        """Blocks outside the sink and recent window, per request (int64 [n])."""
        return np.maximum(ctx - self.window_tokens, 0) // self.block_size

    def selected_blocks(self, ctx: np.ndarray) -> np.ndarray:
        """Blocks selected per layer (per head for headwise) for each request (int64 [n])."""
        n = self.offloaded_blocks(ctx)
        return n if self.selection == "all" else np.minimum(n, self.budget_blocks)

    # ---- per-request state: persistent factors, drift, topic shifts -------------------------------
    @property
    def state_width(self) -> int:
        """Columns of the per-request recall state: L log-factors, the drift x, the steps of shift left."""
        return self.num_layers + 2

    @property
    def structured(self) -> bool:
        """Whether any variation persists across steps (else draws are independent per cell, and no state)."""
        st = self.stats
        return st.request_sigma > 0 or st.layer_sigma > 0 or st.drift_sigma > 0 or st.burst_prob > 0

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

    def _advance(self, state: np.ndarray, draws: RecallDraws) -> tuple[np.ndarray, np.ndarray]:
        """One step of every request's drift and topic shifts: (log-factor float [n, L], in a shift bool [n])."""
        st, L, n = self.stats, self.num_layers, len(state)
        x = st.drift_corr * state[:, L] + np.sqrt(1.0 - st.drift_corr**2) * draws.drift.take(n)
        state[:, L] = x
        left = state[:, L + 1]
        if st.burst_prob > 0:
            start = (left <= 0) & (draws.burst.take(n) < st.burst_prob)
            left = np.where(start, draws.geometric(1.0 / st.burst_steps).take(n), left)
        shifting = left > 0
        state[:, L + 1] = np.maximum(left - 1, 0)
        log_factor = state[:, :L] + st.drift_sigma * x[:, None] - 0.5 * st.drift_sigma**2
        return log_factor, shifting

    # ---- buffer and cache hits ---------------------------------------------------------------------
    def buffer_hit(self, selected: np.ndarray) -> np.ndarray:
        """Per-request recall buffer: fraction of returning blocks still buffered, float [..., n, L] for int [..., n].

        A returning block left the selection j steps ago (j uniform in 1..w); the LRU buffer of B blocks still
        holds it when k + j·(W − k)/w ≤ B, hence h = clip((B − k) / (W − k), 0, 1) with W − k = k · growth.
        """
        k = np.maximum(selected, 1)[..., None].astype(float)
        return np.clip((self.buffer_blocks - k) / (k * self.working_growth), 0.0, 1.0)

    def shared_hit(self, selected: np.ndarray, capacity_fragments: float) -> tuple[float, bool]:
        """One HBM recall cache per GPU, LRU over (request, layer, block): (hit fraction of returning blocks,
        thrashing).

        Between two uses of a block, every stream (request, layer) of the batch touches its selection; a returning
        block that left its selection j steps ago is still cached when K + j · G ≤ C, where K = Σ k (fragments the
        batch selects per step over all layers), G = Σ k · growth / w (what the working sets add per step) and C
        the cache in fragments; hence h = clip((C − K) / (w · G), 0, 1) for j uniform in 1..w — the per-request
        formula with the batch in place of one stream. When K > C even the blocks selected at consecutive steps
        are evicted in between (LRU over a cyclic pattern larger than the cache): every selected block misses.
        tests/sim/test_recall_reference.py checks both regimes against an explicit LRU cache of block ids.
        """
        frags = (selected * self.heads).astype(float)
        total = float(frags.sum()) * self.num_layers
        if total > capacity_fragments:
            return 0.0, True
        growth = float(frags.sum() * self.working_growth.sum())
        return (float(np.clip((capacity_fragments - total) / growth, 0.0, 1.0)) if growth > 0 else 1.0), False

    def miss_frac(
        self,
        selected: np.ndarray,
        cold: np.ndarray,
        rng: np.random.Generator | RecallDraws,
        state: np.ndarray | None = None,
        cache_fragments: float | None = None,
    ) -> np.ndarray:
        """Fraction of each request's selection to recall, per layer: float [n, num_layers].

        Args:
            selected: int64 [n] blocks selected per layer (per head for head-wise).
            cold: bool [n], first step after (re)admission: everything is recalled, persistent factors are drawn.
            rng: the replica's draw streams (sim/step/draws.py), or a seeded generator to spawn one-off streams from.
            state: float [n, state_width] per-request recall state (updated in place), or None for independent
                draws.
            cache_fragments: capacity of the shared recall cache in fragments, or None for per-request buffers.
        """
        n = len(selected)
        if self.fixed_miss_frac is not None:
            q = np.full((n, self.num_layers), self.fixed_miss_frac)
            q[cold] = 1.0
            return q
        draws = as_draws(rng)
        u = draws.change.take(n * self.num_layers).reshape(n, self.num_layers)
        change = (1.0 - (1.0 - u) ** self.inv_b) ** self.inv_a  # Kumaraswamy inverse CDF
        if self.selection == "headwise":
            change *= self.stats.headwise_miss_ratio
        shifting = None
        if state is not None and self.structured:
            if cold.any():
                self._join(state, cold, draws.join.take(self.join_draws(int(cold.sum()))))
            log_factor, shifting = self._advance(state, draws)
            change *= np.exp(log_factor)
        np.minimum(change, 1.0, out=change)
        if cache_fragments is None:
            hit = self.buffer_hit(selected)
        else:
            hit, thrashing = self.shared_hit(selected, cache_fragments)
            if thrashing:
                return np.ones((n, self.num_layers))
        q = change * (1.0 - self.returning * hit)
        if shifting is not None and shifting.any():
            q[shifting] = np.maximum(q[shifting], self.stats.burst_change_frac)
        q[cold] = 1.0
        return q

    def fresh_misses(
        self, ctx: np.ndarray, cold: np.ndarray, rng: np.random.Generator | RecallDraws
    ) -> np.ndarray | int:
        """Fragments of the block that just left the recent window, recalled where a layer selects it (int [n, L]).

        Every ``block_size`` tokens a block leaves the window for the host; each layer selects it at once with
        probability ``fresh_block_frac`` (each KV head on its own, head-wise) and, never recalled before, it misses.
        """
        frac = self.stats.fresh_block_frac
        fresh = ~cold & (ctx > self.window_tokens) & ((ctx - self.window_tokens) % self.block_size == 0)
        if frac <= 0 or not fresh.any() or self.fixed_miss_frac is not None:
            return 0
        out = np.zeros((len(ctx), self.num_layers), dtype=np.int64)
        m = int(fresh.sum())
        out[fresh] = as_draws(rng).binomial(self.heads, frac).take(m * self.num_layers).reshape(m, self.num_layers)
        return out

    def step(
        self,
        ctx: np.ndarray,
        cold: np.ndarray,
        rng: np.random.Generator | RecallDraws,
        groups: np.ndarray | None = None,
        num_groups: int = 1,
        state: np.ndarray | None = None,
        cache_fragments: float | None = None,
    ) -> LayerRecall:
        """Recall of one step for offloaded requests.

        Args:
            ctx: int64 [n], KV tokens of each offloaded request.
            cold: bool [n], recall buffer empty (first step after admission).
            rng: the replica's draw streams (sim/step/draws.py), or a seeded generator to spawn one-off streams from.
            groups: int [n] micro-batch group of each request (None: all in group 0).
            num_groups: G.
            state: float [n, state_width] per-request recall state (see :meth:`miss_frac`), or None.
            cache_fragments: shared recall cache capacity in fragments, or None (per-request buffers).
        """
        selected = self.selected_blocks(ctx)
        L, G = self.num_layers, num_groups
        gid = np.zeros(len(ctx), dtype=np.int64) if groups is None else groups
        if self.selection == "all":
            per_group = np.bincount(gid, weights=selected, minlength=G).astype(np.int64)
            nbytes = np.repeat((per_group * self.block_bytes_layer)[:, None], L, axis=1)
            frags = np.repeat(np.bincount(gid[selected > 0], minlength=G)[:, None], L, axis=1).astype(np.int64)
            copy_s = self.link.copies_s(selected * self.block_bytes_layer)  # one contiguous copy per request,
            copy_s = np.where(copy_s > 0, np.maximum(copy_s, self.link.call_s), 0.0)  # at least one call's cost
            contiguous = np.bincount(gid, weights=copy_s, minlength=G)
            return LayerRecall(nbytes, frags, contiguous, int(frags.sum()))
        draws = as_draws(rng)
        q = self.miss_frac(selected, cold, draws, state, cache_fragments)
        rounding = draws.rounding.take(q.size).reshape(q.shape)
        cell = (selected * self.heads)[:, None]  # fragments each (request, layer) selects
        missing = np.floor(cell * q + rounding).astype(np.int64)  # <= cell, as q <= 1 and rounding < 1
        # The fresh block is one of the cell's selected blocks: where every selected block misses already (q = 1:
        # a thrashing shared cache, a topic shift of change 1) it is recalled once, so a cell never recalls more
        # than it selects (a fresh block on top of a whole selection gave miss fractions above 1).
        missing = np.minimum(missing + self.fresh_misses(ctx, cold, draws), cell)
        if G == 1:
            frags = missing.sum(axis=0)[None, :]
        else:
            frags = np.zeros((G, L), dtype=np.int64)
            np.add.at(frags, gid, missing)
        selected_frags = int((selected * self.heads).sum()) * L
        return LayerRecall(frags * self.fragment_bytes, frags, None, selected_frags)

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
