"""One step of the recall model through its own code: ``RecallModel.run`` (sim/step/recall.py) of one step,
committed (draws consumed, ``state`` advanced in place). The simulator only ever calls ``run`` and commits what ran;
tests of a single step call these. Unlike tests/sim/oracles/recall.py (a separate per-step reference), these run the
code under test."""

from __future__ import annotations

import numpy as np

from sim.step.draws import RecallDraws, as_draws
from sim.step.recall import RecallModel, RecallRun


def step(
    model: RecallModel,
    ctx: np.ndarray,
    cold: np.ndarray,
    rng: np.random.Generator | RecallDraws,
    groups: np.ndarray | None = None,
    num_groups: int = 1,
    state: np.ndarray | None = None,
    cache_fragments: float | None = None,
) -> RecallRun:
    """Recall of one step: ``model.run`` of one step, committed. ``ctx``: int64 [n]; ``cache_fragments``: the shared
    recall cache's capacity in fragments, or None (per-request buffers); the rest as ``RecallModel.run``. Returns
    the run of one step (arrays with a step axis of length 1)."""
    cache = None if cache_fragments is None else np.array([cache_fragments], dtype=float)
    run = model.run(ctx[None, :], cold, as_draws(rng), groups, num_groups, state, cache)
    run.commit(1, state)
    return run


def miss_frac(
    model: RecallModel,
    selected: np.ndarray,
    cold: np.ndarray,
    rng: np.random.Generator | RecallDraws,
    state: np.ndarray | None = None,
    cache_fragments: float | None = None,
) -> np.ndarray:
    """Fraction of each request's selection to recall at one step, per layer: float [n, num_layers] (the first step
    of ``model._miss_frac_run``, its draws consumed and ``state`` advanced in place). ``selected``: int64 [n] blocks
    selected per layer; ``cold``: bool [n]; ``state``: float [n, state_width] or None for independent draws."""
    cache = None if cache_fragments is None else np.array([cache_fragments], dtype=float)
    out = RecallRun.empty()
    q = model._miss_frac_run(selected[None, :], cold, as_draws(rng), state, cache, out)
    out.commit(1, state)
    return q[0]


def fresh_misses(
    model: RecallModel, ctx: np.ndarray, cold: np.ndarray, rng: np.random.Generator | RecallDraws
) -> np.ndarray | int:
    """Fragments of the block that just left the recent window, recalled where a layer selects it, at one step
    (int64 [n, L], or 0 where no block is fresh; draws consumed): ``model._fresh_run`` of one step."""
    out = RecallRun.empty()
    fresh = model._fresh_run(ctx[None, :], cold, as_draws(rng), out)
    out.commit(1, None)
    if fresh is None:
        return 0
    misses = np.zeros((len(ctx), model.num_layers), dtype=np.int64)
    misses[fresh[0][0]] = fresh[1]
    return misses
