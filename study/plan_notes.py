"""What a plan's answers say about themselves: why a single replica's maximum is bounded by the sample rather than
the SLO (:func:`sample_note`, :func:`miss_note`), and the fleet answer kept consistent with the single-replica
maximum (:func:`agree_with_single`). study/plan.py plans; this module words and checks its answers. ``cell`` is the
cell's planner (study/plan.py ``CellPlanner``: its config, its memoised single-replica and fleet simulations).
"""

from __future__ import annotations

import math

from study.bisection import Bisection


def sample_note(cell, found: Bisection) -> str:
    """Why the single-replica answer is bounded by the sample rather than the SLO ('' when it is not)."""
    if found.capped:
        return f"still feasible at the highest rate tried ({found.rate:.3g}/s): the maximum may be higher"
    if found.rate <= 0 and found.tested:
        return miss_note(cell, min(r for r, _ in found.tested))
    above = [r for r, ok in found.tested if not ok and r > found.rate]
    if not above:
        return ""
    summary = cell.single(min(above))
    if cell.cfg.slo.met(summary) and summary.get("steady_problem"):
        return (
            f"sample-limited: at {min(above):.3g}/s the SLO held but the run was not steady "
            f"({summary['steady_problem']}); raise --max-requests for a longer sample"
        )
    return ""


def miss_note(cell, rate: float) -> str:
    """What one replica misses at ``rate`` (req/s; the lowest rate tried when it misses at every rate), e.g.
    ``at 0.0194/s, the lowest rate tried: ttft_p99_s 10.02 > 10`` (seconds, as the columns)."""
    summary = cell.single(rate)
    misses = []
    for col, bound in cell.cfg.slo.bounds().items():
        value = summary.get(col, math.nan)
        if value is None or math.isnan(value) or value > bound:
            misses.append(f"{col} {value:.4g} > {bound:.4g}")
    if summary.get("incomplete", 0):
        misses.append(f"{int(summary['incomplete'])} requests incomplete")
    if not summary.get("finished", 0):
        misses.append("no request finished")
    return f"at {rate:.3g}/s, the lowest rate tried: {', '.join(misses) or 'the SLO'}"


def agree_with_single(cell, router: str, n: int | None, summary: dict, max_rate: float):
    """Keep the fleet answer consistent with the single-replica maximum; returns (n, summary, note).

    A fleet of ``n`` is never credited with more than ``n × max_rate × (1 + rel_tol)`` (the bisection's
    bracket): fewer replicas found by the fleet search are raised to that bound. A fleet that needs more than
    ``ceil(target / max_rate)`` replicas keeps its answer, and the note says why.
    """
    target, tol = cell.cfg.target_rate_per_s, cell.cfg.rel_tol
    if n is None or max_rate <= 0:
        why = "one replica misses the SLO at every rate tried" if max_rate <= 0 else ""
        return n, summary, why or f"no fleet of <= {cell.cfg.max_replicas} replicas met the SLO at the target"
    least = math.ceil(target / (max_rate * (1 + tol)) - 1e-9)
    divided = math.ceil(target / max_rate - 1e-9)
    if n < least:
        note = (
            f"the {router} fleet met the SLO with {n} replicas at {target:.3g}/s, more than {n} x the single-replica "
            f"maximum ({max_rate:.3g}/s); reported {least}, the fewest the single-replica maximum supports"
        )
        if least > cell.cfg.max_replicas:
            return None, {}, f"{note.partition('; ')[0]}; {least} exceed max_replicas {cell.cfg.max_replicas}"
        return least, cell.cluster(least, router), note
    if n > divided:
        why = (
            f"needs {n} replicas, more than target / max rate = {divided}: the {router} fleet at {divided} "
            "missed the SLO (uneven routing or burstier per-replica arrivals than the single-replica sample)"
        )
        return n, summary, why
    return n, summary, ""
