"""The shared HBM recall cache's hit model (one LRU cache per GPU over (request, layer, block) fragments; the
recall model, sim/step/recall.py ``RecallModel.shared_hit``, supplies K and G).
"""

from __future__ import annotations

import numpy as np

from sim.step.distributions import GRID_U, difference_cdf


def lru_hits(
    total: np.ndarray, growth: np.ndarray, capacity_fragments: np.ndarray | float, working_set_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """(hit fraction of the blocks a stream keeps from its previous selection, hit fraction of its returning
    blocks), float [...] each, for a batch that touches ``total`` = K fragments per step, ``growth`` = G of them new
    to their stream's recent selections (float [...] each, the step axis leading), a cache of
    ``capacity_fragments`` C (float [...] or a float) and w = ``working_set_steps``.

    An LRU cache of C fragments hits a reference exactly when fewer than C distinct fragments were referenced
    since the previous reference to the same fragment (its stack distance; Mattson, Gecsei, Slutz and Traiger,
    "Evaluation techniques for storage hierarchies", IBM Systems Journal 9(2), 1970). Per step every stream
    (request, layer) touches its selection once: the batch's K = Σ k fragments, of which G = Σ k · growth / w
    are new to their stream's recent selections (what the working sets add per step; sim/step/recall.py's
    W − k over its w steps). Model assumption: a step's recalls reach the cache in an order drawn afresh each
    step, a stream at position u ~ Uniform(0, 1) one step and u' the next. Then a kept block's stack distance is
    K · (1 − u (1 − u')) + G · (1 − u) u' (the streams touched after it in the last step or before it in this
    one; those touched in both add their new blocks), and a returning block's, last touched j steps before it
    left (j uniform in 1..w), K + G · (j + u' − u). Hence::

        h_keep   = P(K (1 − u (1 − u')) + G (1 − u) u' < C)        (a 32 × 32 midpoint grid over u, u')
        h_return = mean_j F((C − K) / G − j),   F the CDF of u' − u (triangular on (−1, 1))

    Smooth through C = K (the old closed form jumped there from "every kept block hits" to "every selected
    block misses": a strictly cyclic order does thrash at C = K; a varying order smooths it), and h_keep = 1
    from C ≥ K + G / 4 on. Fresh selections always miss. tests/sim/test_recall_reference.py checks both
    against an explicit LRU cache of block ids, below and above C = K.
    """
    cap = np.asarray(capacity_fragments, dtype=float)
    u, u2 = GRID_U[:, None], GRID_U[None, :]
    covered, both = (1.0 - u * (1.0 - u2)).ravel(), ((1.0 - u) * u2).ravel()
    distance = total[..., None] * covered + growth[..., None] * both  # [..., 1024]
    keep = np.where(total > 0, (distance < cap[..., None]).mean(axis=-1), 1.0)
    j = np.arange(1, working_set_steps + 1, dtype=float)
    reach = np.where(
        growth > 0, (cap - total) / np.where(growth > 0, growth, 1.0), np.where(cap >= total, np.inf, -np.inf)
    )
    back = difference_cdf(reach[..., None] - j).mean(axis=-1)
    return keep, back
