"""The recall model over k decode steps at once (skip-ahead over offloaded steps, sim/policies/offload_run.py).

:func:`recall_run` gives, for a batch whose membership does not change for k steps, what k calls of
:meth:`RecallModel.step <sim.step.recall.RecallModel.step>` give one after another — the same numbers, not just
the same distribution. Each kind of draw comes from its own stream (sim/step/draws.py), so a kind's values for k
steps are the next values of its stream in step order; they are only *peeked* here, and :meth:`RecallRun.commit`
consumes (and writes the per-request state of) the first j ≤ k steps once the caller knows how many ran. Every
element-wise formula is the per-step one applied to [k, ...] arrays; the drift's AR(1) recurrence, the only
quantity that carries from one step to the next, is iterated step by step. tests/sim/test_offload_run.py checks
equality with stepping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.step.draws import DrawStream, RecallDraws
from sim.step.recall import RecallModel


@dataclass(slots=True)
class RecallRun:
    """What k steps recall (one micro-batch group) and how to commit the first j of them."""

    fragments: np.ndarray  # int64 [k, L] fragments recalled per step and layer
    selected_fragments: np.ndarray  # int64 [k] fragments selected over every layer and request, per step
    _used: list[tuple[DrawStream, np.ndarray]] = field(default_factory=list)  # stream, draws taken by step t (cum.)
    _state: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # factors [n, L], drift [k, n], shift left [k, n]

    def commit(self, steps: int, state: np.ndarray | None) -> None:
        """Consume the draws of the first ``steps`` steps and write the requests' recall state after them into
        ``state`` (float [n, state_width], in place; None when the model keeps none)."""
        for stream, used in self._used:
            stream.consume(int(used[steps - 1]))
        if self._state is not None and state is not None:
            factors, drift, left = self._state
            L = factors.shape[1]
            state[:, :L] = factors
            state[:, L] = drift[steps - 1]
            state[:, L + 1] = left[steps - 1]


def recall_run(
    model: RecallModel,
    ctx: np.ndarray,
    cold: np.ndarray,
    draws: RecallDraws,
    state: np.ndarray | None,
    cache_fragments: np.ndarray | None,
) -> RecallRun:
    """The recall of k consecutive steps of the same offloaded requests (one group), draws peeked, not consumed.

    Args:
        model: the policy's recall model (selection ``solohead`` or ``headwise``).
        ctx: int64 [k, n] KV tokens each request attends at each step.
        cold: bool [n], first step after (re)admission (only step 0 can be cold).
        draws: the replica's streams.
        state: float [n, state_width] the requests' recall state before the run (read only), or None.
        cache_fragments: float64 [k] shared recall cache capacity per step in fragments, or None (per-request).

    Raises:
        ValueError: selection ``all`` (it draws nothing and has its own cost path).
    """
    if model.selection == "all":
        raise ValueError("recall_run covers selection solohead and headwise, not 'all'")
    k, n = ctx.shape
    L, st = model.num_layers, model.stats
    out = RecallRun(np.zeros((k, L), dtype=np.int64), np.zeros(k, dtype=np.int64))
    used = out._used
    steps = np.arange(1, k + 1)
    selected = model.selected_blocks(ctx)  # int64 [k, n]
    if model.fixed_miss_frac is not None:
        q = np.full((k, n, L), model.fixed_miss_frac)
        q[0][cold] = 1.0
    else:
        u = draws.change.peek(k * n * L).reshape(k, n, L)
        used.append((draws.change, steps * (n * L)))
        change = (1.0 - (1.0 - u) ** model.inv_b) ** model.inv_a
        if model.selection == "headwise":
            change *= st.headwise_miss_ratio
        shifting = None
        if state is not None and model.structured:
            log_factor, shifting = _advance_run(model, state, cold, draws, k, out)
            change *= np.exp(log_factor)
        np.minimum(change, 1.0, out=change)
        if cache_fragments is None:
            hit = model.buffer_hit(selected)  # float [k, n, L]
            q = change * (1.0 - model.returning * hit)
            thrashing = None
        else:
            shared = [model.shared_hit(selected[t], float(cache_fragments[t])) for t in range(k)]
            hit_scalar = np.array([h for h, _ in shared])[:, None, None]
            q = change * (1.0 - model.returning * hit_scalar)
            thrashing = np.array([t for _, t in shared])
        if shifting is not None and shifting.any():
            q = np.where(shifting[:, :, None], np.maximum(q, st.burst_change_frac), q)
        q[0][cold] = 1.0
        if thrashing is not None and thrashing.any():
            q[thrashing] = 1.0
    rounding = draws.rounding.peek(k * n * L).reshape(k, n, L)
    used.append((draws.rounding, steps * (n * L)))
    cell = (selected * model.heads)[:, :, None]  # fragments each (step, request, layer) selects
    missing = np.floor(cell * q + rounding).astype(np.int64)
    frac = st.fresh_block_frac
    if frac > 0 and model.fixed_miss_frac is None:
        w, bs = model.window_tokens, model.block_size
        fresh = (ctx > w) & ((ctx - w) % bs == 0)
        fresh[0] &= ~cold
        per_step = fresh.sum(axis=1)
        if per_step.any():
            stream = draws.binomial(model.heads, frac)
            total = int(per_step.sum())
            missing[fresh] += stream.peek(total * L).reshape(total, L)
            used.append((stream, np.cumsum(per_step) * L))
            np.minimum(missing, cell, out=missing)  # the fresh block is one of the selected (RecallModel.step)
    out.fragments = missing.sum(axis=1)
    out.selected_fragments = (selected * model.heads).sum(axis=1) * L
    return out


def _advance_run(
    model: RecallModel, state: np.ndarray, cold: np.ndarray, draws: RecallDraws, k: int, out: RecallRun
) -> tuple[np.ndarray, np.ndarray]:
    """The joins (step 0) and k steps of drift and topic shifts: (log-factor float [k, n, L], shifting bool [k, n]);
    records the streams used and the state after each step in ``out``."""
    st, L, n = model.stats, model.num_layers, len(state)
    work = state.copy()
    if cold.any():
        count = model.join_draws(int(cold.sum()))
        model._join(work, cold, draws.join.peek(count))
        out._used.append((draws.join, np.full(k, count)))
    z = draws.drift.peek(k * n).reshape(k, n)
    out._used.append((draws.drift, np.arange(1, k + 1) * n))
    burst = st.burst_prob > 0
    if burst:
        starts = draws.burst.peek(k * n).reshape(k, n)
        geometric = draws.geometric(1.0 / st.burst_steps)
        lengths = geometric.peek(k * n).reshape(k, n)
        out._used += [(draws.burst, np.arange(1, k + 1) * n), (geometric, np.arange(1, k + 1) * n)]
    else:
        starts = lengths = np.zeros((k, n))
    corr, scale = st.drift_corr, float(np.sqrt(1.0 - st.drift_corr**2))
    drift, lefts, shifting = _drift(
        work[:, L].copy(),
        work[:, L + 1].copy(),
        z,
        starts,
        lengths.astype(np.float64),
        corr,
        scale,
        st.burst_prob,
        burst,
    )
    out._state = (work[:, :L].copy(), drift, lefts)
    log_factor = work[:, :L][None, :, :] + st.drift_sigma * drift[:, :, None] - 0.5 * st.drift_sigma**2
    return log_factor, shifting


def _drift_py(x, left, z, starts, lengths, corr, scale, burst_prob, burst):  # noqa: PLR0913
    """RecallModel._advance's recurrence over k steps, element by element in the same operations: the drift
    x ← corr·x + scale·z, a shift starting where none runs (uniform < burst_prob) with its geometric length, the
    steps of shift left counting down. Returns (drift float64 [k, n], left float64 [k, n], shifting bool [k, n])."""
    k, n = z.shape
    drift = np.empty((k, n))
    lefts = np.empty((k, n))
    shifting = np.empty((k, n), dtype=np.bool_)
    for t in range(k):
        for r in range(n):
            x[r] = corr * x[r] + scale * z[t, r]
            if burst and left[r] <= 0 and starts[t, r] < burst_prob:
                left[r] = lengths[t, r]
            shifting[t, r] = left[r] > 0
            left[r] = max(left[r] - 1.0, 0.0)
            drift[t, r] = x[r]
            lefts[t, r] = left[r]
    return drift, lefts, shifting


_compiled: list = []  # the compiled _drift_py, made at the first call (numba is imported only when runs need it)


def _drift(*args):
    """:func:`_drift_py`, compiled when numba is installed (the ``fast`` extra), else as it is."""
    if not _compiled:
        try:
            from numba import njit

            _compiled.append(njit(cache=True)(_drift_py))
        except ImportError:  # pragma: no cover - exercised where numba is absent
            _compiled.append(_drift_py)
    return _compiled[0](*args)
