"""The distributions the recall model (sim/step/recall.py) draws from and integrates over: the Kumaraswamy change
of a layer's selection, fitted to its measured mean (:func:`kumaraswamy_b`; also calibrate/selection_fit.py), and
the difference of two uniforms with its grid, for the stack distances of kept blocks in a shared recall cache."""

from __future__ import annotations

import numpy as np


def difference_cdf(x: np.ndarray) -> np.ndarray:
    """P(u' − u < x) for u, u' independent Uniform(0, 1): triangular on (−1, 1) (float array in, same shape out)."""
    x = np.clip(x, -1.0, 1.0)
    return np.where(x <= 0.0, 0.5 * (1.0 + x) ** 2, 1.0 - 0.5 * (1.0 - x) ** 2)


GRID_U = (np.arange(32) + 0.5) / 32  # midpoints of Uniform(0, 1) for the stack distances of kept blocks


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
