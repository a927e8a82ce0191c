"""Tail-latency SLO targets for search and planning: ``tpot_p99_ms=50,ttft_p99_s=10``.

A :class:`TailSlo` bounds the p99 TPOT and TTFT over finished requests (``tpot_p99_s``, ``ttft_p99_s``); when a run
meets it is :meth:`TailSlo.met` (docs/design.md §12). :meth:`TailSlo.scenario_overrides` sets the scenario's
per-request ``slo`` block to the same numbers, so goodput counts the requests that meet the tail targets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sim.config import Scenario

# flag key → (summary column, factor from the flag's unit to seconds)
SLO_KEYS: dict[str, tuple[str, float]] = {
    "tpot_p99_ms": ("tpot_p99_s", 1e-3),
    "ttft_p99_s": ("ttft_p99_s", 1.0),
}
VIOLATION_NAN = 1e3  # violation reported for a metric that is NaN (nothing finished)


@dataclass(frozen=True)
class TailSlo:
    """Upper bounds on p99 TPOT and p99 TTFT in seconds; None = unbounded."""

    tpot_p99_s: float | None = None
    ttft_p99_s: float | None = None

    def bounds(self) -> dict[str, float]:
        """Summary column → bound in seconds, for the bounds that are set."""
        pairs = {"tpot_p99_s": self.tpot_p99_s, "ttft_p99_s": self.ttft_p99_s}
        return {col: bound for col, bound in pairs.items() if bound is not None}

    def violations(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Named constraint values, each <= 0 when satisfied (Optuna's convention).

        One per set bound, ``value / bound - 1`` (NaN counts as :data:`VIOLATION_NAN`); ``incomplete``:
        the number of incomplete requests; ``finished``: 1 if no request finished, else 0.
        """
        out = {}
        for col, bound in self.bounds().items():
            value = metrics.get(col, math.nan)
            out[col] = VIOLATION_NAN if value is None or math.isnan(value) else value / bound - 1.0
        out["incomplete"] = float(metrics.get("incomplete", 0))
        out["finished"] = 0.0 if metrics.get("finished", 0) > 0 else 1.0
        return out

    def met(self, metrics: Mapping[str, float]) -> bool:
        """Every bound holds, nothing is incomplete and something finished."""
        return all(v <= 0 for v in self.violations(metrics).values())

    def scenario_overrides(self) -> list[str]:
        """``--set`` items that make the scenario's per-request SLO (goodput) use these bounds."""
        tpot_ms = "null" if self.tpot_p99_s is None else repr(self.tpot_p99_s * 1e3)
        ttft_s = "null" if self.ttft_p99_s is None else repr(self.ttft_p99_s)
        return [f"slo.tpot_ms={tpot_ms}", f"slo.ttft_s={ttft_s}"]

    def describe(self) -> str:
        """The flag form, e.g. ``tpot_p99_ms=50,ttft_p99_s=10`` (``none`` when unbounded)."""
        parts = []
        if self.tpot_p99_s is not None:
            parts.append(f"tpot_p99_ms={self.tpot_p99_s * 1e3:g}")
        if self.ttft_p99_s is not None:
            parts.append(f"ttft_p99_s={self.ttft_p99_s:g}")
        return ",".join(parts) or "none"


def parse_slo(text: str) -> TailSlo:
    """Parse ``key=value[,key=value]`` with keys from :data:`SLO_KEYS`.

    Raises:
        ValueError: naming the key for an unknown or repeated key, a missing ``=``, or a value that is
            not a positive finite number.
    """
    values: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, raw = (s.strip() for s in item.partition("="))
        if not sep:
            raise ValueError(f"--slo {item!r}: expected key=value, e.g. tpot_p99_ms=50")
        if key not in SLO_KEYS:
            raise ValueError(f"--slo {key}: unknown key (known: {', '.join(SLO_KEYS)})")
        if key in values:
            raise ValueError(f"--slo {key}: given twice")
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--slo {key}: expected a positive number, got {raw!r}")
        values[key] = value
    if not values:
        raise ValueError(f"--slo {text!r}: give at least one of {', '.join(SLO_KEYS)}")
    return TailSlo(**{SLO_KEYS[k][0]: v * SLO_KEYS[k][1] for k, v in values.items()})


def slo_from_scenario(scenario: Scenario) -> TailSlo:
    """The scenario's per-request bounds read as p99 targets (the default when ``--slo`` is not given)."""
    tpot_ms, ttft_s = scenario.slo.tpot_ms, scenario.slo.ttft_s
    return TailSlo(None if tpot_ms is None else tpot_ms * 1e-3, ttft_s)
