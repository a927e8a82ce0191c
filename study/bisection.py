"""The highest rate at which a feasibility test holds, by doubling or halving to a bracket and then bisecting
geometrically (``plan``'s max rate per replica, study/plan.py). Model assumption: feasibility falls with rate."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Bisection:
    """Result of :func:`bisect_max_rate`."""

    rate: float  # highest feasible rate simulated; 0.0 if none was
    tested: list[tuple[float, bool]]  # (rate, feasible) in the order simulated
    capped: bool = False  # still feasible at start × 2**max_steps


def bisect_max_rate(feasible: Callable[[float], bool], start: float, rel_tol: float, max_steps: int) -> Bisection:
    """Highest rate at which ``feasible`` holds, assuming it holds below some rate and fails above.

    Doubles (or halves, after trying ``start / 2**max_steps`` first) from ``start`` until a feasible and an
    infeasible rate bracket the boundary, then bisects geometrically. The bisection stops at
    ``hi / lo - 1 <= rel_tol`` or when no float lies between ``lo`` and ``hi``, so it ends for any ``rel_tol > 0``.

    Raises:
        ValueError: if ``start`` or ``rel_tol`` is not positive.
    """
    if not (start > 0 and rel_tol > 0):
        raise ValueError(f"start ({start}) and rel_tol ({rel_tol}) must be > 0")
    tested: list[tuple[float, bool]] = []

    def check(rate: float) -> bool:
        ok = feasible(rate)
        tested.append((rate, ok))
        return ok

    lo = hi = start
    if check(start):
        for _ in range(max_steps):
            hi = lo * 2
            if not check(hi):
                break
            lo = hi
        else:
            return Bisection(lo, tested, capped=True)
    else:
        floor = start / 2**max_steps
        if not check(floor):  # missed even when nearly idle (e.g. prefill alone breaks the TTFT bound)
            return Bisection(0.0, tested)
        while True:
            lo = hi / 2
            if lo <= floor:
                lo = floor
                break
            if check(lo):
                break
            hi = lo
    while hi / lo - 1 > rel_tol:
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:  # lo and hi are adjacent floats: no rate left between them (tiny rel_tol)
            break
        if check(mid):
            lo = mid
        else:
            hi = mid
    return Bisection(lo, tested)
