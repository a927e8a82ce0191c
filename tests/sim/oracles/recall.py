"""The recall model's per-step reference: one decode step of ``RecallModel`` written for one step, element-wise over
[n, L] arrays, as sim/step/recall.py computed it before the model was written once over a step axis
(``RecallModel.run``; a single step is a run of one). tests/sim/test_recall_oracle.py checks the model against it on
seeded random inputs, bit for bit, streams and state included."""

from __future__ import annotations

import numpy as np

from sim.step.draws import RecallDraws, as_draws
from sim.step.recall import RecallModel


def selected_blocks(model: RecallModel, ctx: np.ndarray) -> np.ndarray:
    """Blocks selected per layer (per head for headwise) for each request (int64 [n]): every offloaded block for
    ``selection: all``, else at most the budget."""
    n = model.offloaded_blocks(ctx)
    return n if model.selection == "all" else np.minimum(n, model.budget_blocks)


def join(model: RecallModel, state: np.ndarray, rows: np.ndarray, z: np.ndarray) -> None:
    """Persistent factors of the requests in ``rows`` (bool [n]) that just joined, from normals ``z``."""
    st, L, m = model.stats, model.num_layers, int(rows.sum())
    z_request = z[:m, None]
    z_layer = z[m : m + m * L].reshape(m, L)
    mean_fix = 0.5 * (st.request_sigma**2 + st.layer_sigma**2)
    state[rows, :L] = st.request_sigma * z_request + st.layer_sigma * z_layer - mean_fix
    state[rows, L] = z[m + m * L :]
    state[rows, L + 1] = 0.0


def advance(model: RecallModel, state: np.ndarray, draws: RecallDraws) -> tuple[np.ndarray, np.ndarray]:
    """One step of every request's drift and topic shifts: (log-factor float [n, L], in a shift bool [n])."""
    st, L, n = model.stats, model.num_layers, len(state)
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


def miss_frac(model: RecallModel, selected, cold, rng, state=None, cache_fragments=None) -> np.ndarray:
    """Fraction of each request's selection to recall, per layer: float [n, L] (``state`` advanced in place)."""
    n, L = len(selected), model.num_layers
    if model.fixed_miss_frac is not None:
        q = np.full((n, L), model.fixed_miss_frac)
        q[cold] = 1.0
        return q
    draws = as_draws(rng)
    u = draws.change.take(n * L).reshape(n, L)
    change = (1.0 - (1.0 - u) ** model.inv_b) ** model.inv_a
    if model.selection == "headwise":
        change *= model.stats.headwise_miss_ratio
    shifting = None
    if state is not None and model.structured:
        if cold.any():
            join(model, state, cold, draws.join.take(model.join_draws(int(cold.sum()))))
        log_factor, shifting = advance(model, state, draws)
        change *= np.exp(log_factor)
    np.minimum(change, 1.0, out=change)
    if cache_fragments is None:
        q = change * (1.0 - model.returning * model.buffer_hit(selected))
    else:
        keep, back = model.shared_hit(selected, cache_fragments)
        q = (1.0 - change) * (1.0 - keep) + change * (1.0 - model.returning * back)
    if shifting is not None and shifting.any():
        q[shifting] = np.maximum(q[shifting], model.stats.burst_change_frac)
    q[cold] = 1.0
    return q


def fresh_misses(model: RecallModel, ctx, cold, rng) -> np.ndarray | int:
    """Fragments of the block that just left the recent window, recalled where a layer selects it (int [n, L])."""
    frac = model.stats.fresh_block_frac
    fresh = ~cold & (ctx > model.window_tokens) & ((ctx - model.window_tokens) % model.block_size == 0)
    if frac <= 0 or not fresh.any() or model.fixed_miss_frac is not None:
        return 0
    out = np.zeros((len(ctx), model.num_layers), dtype=np.int64)
    m = int(fresh.sum())
    out[fresh] = as_draws(rng).binomial(model.heads, frac).take(m * model.num_layers).reshape(m, model.num_layers)
    return out


def step(model: RecallModel, ctx, cold, rng, groups=None, num_groups=1, state=None, cache_fragments=None):
    """One step's recall: (nbytes int64 [G, L], fragments int64 [G, L], contiguous seconds float [G] or None,
    selected fragments int); draws taken from ``rng``, ``state`` advanced in place."""
    selected = selected_blocks(model, ctx)
    L, G = model.num_layers, num_groups
    gid = np.zeros(len(ctx), dtype=np.int64) if groups is None else groups
    if model.selection == "all":
        per_group = np.bincount(gid, weights=selected, minlength=G).astype(np.int64)
        nbytes = np.repeat((per_group * model.block_bytes_layer)[:, None], L, axis=1)
        frags = np.repeat(np.bincount(gid[selected > 0], minlength=G)[:, None], L, axis=1).astype(np.int64)
        copy_s = model.link.copies_s(selected * model.block_bytes_layer)
        copy_s = np.where(copy_s > 0, np.maximum(copy_s, model.link.call_s), 0.0)
        return nbytes, frags, np.bincount(gid, weights=copy_s, minlength=G), int(frags.sum())
    draws = as_draws(rng)
    q = miss_frac(model, selected, cold, draws, state, cache_fragments)
    rounding = draws.rounding.take(q.size).reshape(q.shape)
    cell = (selected * model.heads)[:, None]
    missing = np.floor(cell * q + rounding).astype(np.int64)
    missing = np.minimum(missing + fresh_misses(model, ctx, cold, draws), cell)
    if G == 1:
        frags = missing.sum(axis=0)[None, :]
    else:
        frags = np.zeros((G, L), dtype=np.int64)
        np.add.at(frags, gid, missing)
    return frags * model.fragment_bytes, frags, None, int((selected * model.heads).sum()) * L
