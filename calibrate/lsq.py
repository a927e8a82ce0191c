"""Bounded least squares on a [0, 1] search scale: the one fitting procedure of the serving calibrations.

Each value is searched on its bounds mapped to [0, 1] (log-linearly where its range spans decades), so one
finite-difference step means the same share of every range. :func:`fit_bounded` runs scipy's trust-region
reflective least squares (robust soft-L1 loss) from a start, and reports the values within :data:`AT_BOUND` of a
bound and the values without effect at the start (a zero column of the first Jacobian: no residual moves, so the
data cannot inform them; they stay at their start and are never reported as fitted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Bounds = tuple[float, float, bool]  # (low, high, log scale)
AT_BOUND = 0.01  # a value within this share of its search range from a bound is reported as at the bound
DIFF_STEP = 0.02  # forward-difference step on the [0, 1] search scale
TRADE_OFF = 0.9  # |correlation| of two estimates from which the data are said not to tell them apart


def to_unit(bounds: Bounds, value: float) -> float:
    """``value`` on the [0, 1] scale of ``bounds`` (clipped to them)."""
    lo, hi, log = bounds
    value = min(max(value, lo), hi)
    return (math.log(value / lo) / math.log(hi / lo)) if log else (value - lo) / (hi - lo)


def from_unit(bounds: Bounds, u: float) -> float:
    """The value at ``u`` on the [0, 1] scale of ``bounds`` (``u`` clipped to [0, 1])."""
    lo, hi, log = bounds
    u = min(max(float(u), 0.0), 1.0)
    return lo * (hi / lo) ** u if log else lo + u * (hi - lo)


@dataclass
class BoundedFit:
    """What :func:`fit_bounded` found: every value (fitted ones moved, the rest at their start), the names fitted,
    those at a bound, those without effect, and the residual evaluations it took."""

    values: dict[str, float]
    fitted: list[str]
    at_bound: list[str] = field(default_factory=list)
    without_effect: list[str] = field(default_factory=list)
    evaluations: int = 0
    # pairs of fitted names the residuals cannot tell apart: (a, b, correlation of their estimates), |corr| >= TRADE_OFF
    trade_offs: list[tuple[str, str, float]] = field(default_factory=list)


def fit_bounded(
    residuals: Callable[[dict[str, float]], np.ndarray],
    bounds: dict[str, Bounds],
    start: dict[str, float],
    iterations: int,
    prior_rows: int = 0,
) -> BoundedFit:
    """Fit the names of ``bounds`` so that ``residuals(values)`` is smallest (soft-L1, f_scale 0.1).

    Args:
        residuals: values (every name of ``bounds``) → float64 residual vector of a fixed length; deterministic.
        bounds: name → (low, high, log scale).
        start: a start value per name of ``bounds``.
        iterations: the most steps taken (each after a Jacobian: one evaluation per free name, forward
            differences).
        prior_rows: how many trailing residuals are a pull toward the start rather than data; they do not count
            when telling whether a name has an effect.

    Returns:
        :class:`BoundedFit`. A name whose Jacobian column at the start is zero is left at its start and listed as
        without effect.
    """
    from scipy.optimize import least_squares

    names = list(bounds)
    cache: dict[tuple, np.ndarray] = {}

    def evaluate(u: np.ndarray, free: list[str]) -> np.ndarray:
        values = {**start, **{n: from_unit(bounds[n], x) for n, x in zip(free, u, strict=True)}}
        key = tuple(float(f"{values[n]:.12g}") for n in names)  # the same values, whichever names are free
        if key not in cache:
            cache[key] = np.asarray(residuals(values), dtype=float)
        return cache[key]

    def jacobian(u: np.ndarray, free: list[str]) -> np.ndarray:
        base = evaluate(u, free)
        columns = []
        for j in range(len(free)):
            h = DIFF_STEP if u[j] + DIFF_STEP <= 1.0 else -DIFF_STEP
            moved = u.copy()
            moved[j] += h
            columns.append((evaluate(moved, free) - base) / h)
        return np.stack(columns, axis=1) if columns else np.zeros((len(base), 0))

    u_all = np.array([to_unit(bounds[n], start[n]) for n in names])
    first = jacobian(u_all, names)
    data = first[: len(first) - prior_rows]
    live = [j for j in range(len(names)) if np.any(np.abs(data[:, j]) > 1e-12)]
    free = [names[j] for j in live]
    without_effect = [n for n in names if n not in free]
    u0 = u_all[live]
    if free:
        # the first Jacobian over the free names is the columns already taken (same evaluations, cached)
        found = least_squares(
            lambda u: evaluate(u, free), u0, jac=lambda u: jacobian(u, free), bounds=(0.0, 1.0), loss="soft_l1",
            f_scale=0.1, max_nfev=iterations + 1, method="trf", x_scale=1.0,
        )  # fmt: skip
        u = found.x
    else:
        u = u0
    values = {**start, **{n: from_unit(bounds[n], x) for n, x in zip(free, u, strict=True)}}
    at_bound = [n for n, x in zip(free, u, strict=True) if x < AT_BOUND or x > 1 - AT_BOUND]
    trade_offs = _trade_offs(jacobian(u, free), free) if len(free) > 1 else []
    return BoundedFit(values, free, at_bound, without_effect, len(cache), trade_offs)


def _trade_offs(jac: np.ndarray, names: list[str]) -> list[tuple[str, str, float]]:
    """Pairs of names whose estimates correlate by |r| >= :data:`TRADE_OFF` (Gauss-Newton covariance (JᵀJ)⁻¹ at the
    solution): moving one and the other together leaves the residuals nearly where they are."""
    cov = np.linalg.pinv(jac.T @ jac)
    sd = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    corr = cov / np.outer(sd, sd)
    return [(names[i], names[j], float(corr[i, j])) for i in range(len(names)) for j in range(i + 1, len(names))
            if abs(corr[i, j]) >= TRADE_OFF]  # fmt: skip
