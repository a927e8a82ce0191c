"""Accuracy of a policy's sparse attention, interpolated from a measured table, and SLO bounds on it
(docs/search.md "Accuracy-aware search": which rows a policy reads, interpolation, SLO keys, caveats).

The table is what ``pulseinfer accuracy`` writes (``accuracy.csv``: ``selection, budget_tokens, context_tokens,
mass_mean, mass_worst_head, rel_l2, argmax_agreement, kl_nats``, fractions and nats; engine/accuracy.py defines
them); the shipped default is ``scenarios/accuracy/smollm2-2k.csv`` (provenance: ``scenarios/accuracy/README.md``).
:func:`policy_selection` picks the rows (dense and ``selection: all`` are exact); :meth:`AccuracyTable.interpolate`
interpolates piecewise linearly in log2(budget) — KL and rel L2 in log space — and raises :class:`AccuracyError`
outside the measured budgets (nothing is extrapolated).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config import Scenario, scenarios_dir
from study.executors import FieldError

DEFAULT_TABLE = "accuracy/smollm2-2k.csv"  # under scenarios/
TABLE_COLUMNS = ["selection", "budget_tokens", "mass_mean", "mass_worst_head", "rel_l2", "argmax_agreement", "kl_nats"]
# output column → (table column, factor, interpolate in log space)
OUTPUTS: dict[str, tuple[str, float, bool]] = {
    "kl_nats": ("kl_nats", 1.0, True),
    "rel_l2": ("rel_l2", 1.0, True),
    "mass_pct": ("mass_mean", 100.0, False),
    "worst_head_pct": ("mass_worst_head", 100.0, False),
    "argmax_pct": ("argmax_agreement", 100.0, False),
}
EXACT = {"kl_nats": 0.0, "rel_l2": 0.0, "mass_pct": 100.0, "worst_head_pct": 100.0, "argmax_pct": 100.0}
# SLO key → "max" (upper bound) or "min" (lower bound) on the output column of the same name
SLO_KEYS: dict[str, str] = {"kl_nats": "max", "rel_l2": "max", "mass_pct": "min", "worst_head_pct": "min",
                            "argmax_pct": "min"}  # fmt: skip
VIOLATION_NAN = 1e3
EXACT_SELECTION = "dense"


class AccuracyError(FieldError):
    """A bad accuracy table or bound, or a budget outside the measured ones; ``field`` is ``accuracy`` or ``slo``."""

    def __init__(self, message: str, field: str = "accuracy") -> None:
        super().__init__(message, field)


@dataclass(frozen=True, eq=False)
class AccuracyTable:
    """Measured accuracy per (selection, budget_tokens): ``frame`` has :data:`TABLE_COLUMNS` (duplicates averaged)."""

    source: str
    frame: pd.DataFrame

    def signature(self) -> str:
        """SHA-256 prefix of the table's contents (a resumed search must use the same table)."""
        return hashlib.sha256(self.frame.to_csv(index=False).encode()).hexdigest()[:16]

    def budgets(self, selection: str) -> list[int]:
        return sorted(int(b) for b in self.frame.loc[self.frame["selection"] == selection, "budget_tokens"])

    def interpolate(self, selection: str, budget_tokens: float) -> dict[str, float]:
        """Output columns (:data:`OUTPUTS`) at ``budget_tokens`` for ``selection``.

        Raises:
            AccuracyError: the selection is not in the table, or the budget lies outside its measured budgets.
        """
        rows = self.frame[self.frame["selection"] == selection].sort_values("budget_tokens")
        if rows.empty:
            have = ", ".join(sorted(set(self.frame["selection"])))
            raise AccuracyError(f"{self.source}: no rows for selection {selection!r} (has {have})")
        budgets = rows["budget_tokens"].to_numpy(dtype=float)
        if not budgets[0] <= budget_tokens <= budgets[-1]:
            raise AccuracyError(
                f"budget_tokens {budget_tokens:g} is outside the budgets measured for {selection} in {self.source} "
                f"({int(budgets[0])}..{int(budgets[-1])}); not extrapolated"
            )
        x, xs = math.log2(budget_tokens), np.log2(budgets)
        out = {}
        for name, (col, factor, log_space) in OUTPUTS.items():
            ys = rows[col].to_numpy(dtype=float)
            if log_space and np.all(ys > 0):
                out[name] = float(np.exp(np.interp(x, xs, np.log(ys)))) * factor
            else:
                out[name] = float(np.interp(x, xs, ys)) * factor
        return out


def load_accuracy_table(path: str | Path | None = None) -> AccuracyTable:
    """Read an ``accuracy.csv``; None = the shipped SmolLM2 2K table.

    Raises:
        AccuracyError: unreadable file, missing column, non-numeric or negative values, budgets <= 0.
    """
    source = str(path) if path is not None else f"scenarios/{DEFAULT_TABLE}"
    path = Path(path) if path is not None else scenarios_dir() / DEFAULT_TABLE
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise AccuracyError(f"accuracy table {path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    missing = [c for c in TABLE_COLUMNS if c not in frame.columns]
    if missing:
        raise AccuracyError(f"accuracy table {path}: missing column(s) {', '.join(missing)} (pulseinfer accuracy's)")
    frame = frame[TABLE_COLUMNS].copy()
    numeric = TABLE_COLUMNS[1:]
    values = frame[numeric].apply(pd.to_numeric, errors="coerce")
    bad = values.isna() | (values < 0)
    if bad.to_numpy().any() or (values["budget_tokens"] <= 0).any():
        row, col = next((r, c) for r in range(len(frame)) for c in numeric if bad.iloc[r][c] or values.iloc[r][c] <= 0)
        raise AccuracyError(
            f"accuracy table {path}: row {row + 2} {col}={frame.iloc[row][col]!r}; expected a number >= 0 "
            "(budget_tokens > 0)"
        )
    frame[numeric] = values
    frame = frame.groupby(["selection", "budget_tokens"], as_index=False, sort=True)[numeric[1:]].mean()
    return AccuracyTable(source, frame)


def policy_selection(scenario: Scenario, policy: str) -> str:
    """The table selection a policy's attention reads: ``dense`` (exact), ``solohead`` or ``headwise``."""
    spec = scenario.policy[policy]
    if spec.kind == "dense" or spec.selection == "all":
        return EXACT_SELECTION
    return spec.selection


def policy_accuracy(table: AccuracyTable, scenario: Scenario, policy: str) -> dict[str, float]:
    """Output columns of ``policy`` in ``scenario``: exact for dense attention, else interpolated.

    Raises:
        AccuracyError: the policy's budget is outside the measured budgets (see :meth:`AccuracyTable.interpolate`).
    """
    selection = policy_selection(scenario, policy)
    if selection == EXACT_SELECTION:
        return dict(EXACT)
    try:
        return table.interpolate(selection, scenario.policy[policy].budget_tokens)
    except AccuracyError as exc:
        raise AccuracyError(f"policy {policy} (selection {selection}): {exc}") from None


def accuracy_columns(table: AccuracyTable, scenario: Scenario, policy: str) -> dict[str, float | str]:
    """:func:`policy_accuracy` plus ``accuracy_selection`` and ``accuracy_note``; NaN and the reason when the
    budget is outside the table (never raises for that)."""
    selection = policy_selection(scenario, policy)
    try:
        values, note = policy_accuracy(table, scenario, policy), ""
    except AccuracyError as exc:
        values, note = dict.fromkeys(OUTPUTS, math.nan), str(exc)
    return {"accuracy_selection": selection, **values, "accuracy_note": note}


def output_columns() -> list[str]:
    """Columns :func:`accuracy_columns` adds, in order."""
    return ["accuracy_selection", *OUTPUTS, "accuracy_note"]


@dataclass(frozen=True, eq=False)
class AccuracySlo:
    """Bounds on the interpolated accuracy (``{SLO key: value}``, :data:`SLO_KEYS`) with the table they read."""

    table: AccuracyTable
    bounds: dict[str, float] = field(default_factory=dict)

    def violations(self, values: Mapping[str, float]) -> dict[str, float]:
        """Per bound, <= 0 when met: ``v / b - 1`` for an upper bound, ``1 - v / b`` for a lower one."""
        out = {}
        for key, bound in self.bounds.items():
            v = values.get(key, math.nan)
            if v is None or math.isnan(v):
                out[key] = VIOLATION_NAN
            else:
                out[key] = v / bound - 1.0 if SLO_KEYS[key] == "max" else 1.0 - v / bound
        return out

    def met(self, values: Mapping[str, float]) -> bool:
        return all(v <= 0 for v in self.violations(values).values())

    def describe(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.bounds.items())

    def check_points(self, points: Iterable[tuple[Scenario, str]]) -> None:
        """With bounds set, every (scenario, policy) must be covered by the table.

        Raises:
            AccuracyError (field ``slo``): naming the first policy and budget outside the measured budgets.
        """
        if self.bounds:
            for scenario, policy in points:
                try:
                    policy_accuracy(self.table, scenario, policy)
                except AccuracyError as exc:
                    raise AccuracyError(f"{self.describe()} cannot be checked: {exc}", "slo") from None


def split_slo(text: str | None) -> tuple[str | None, dict[str, float]]:
    """Split ``--slo`` text into the tail part (for :func:`study.slo.parse_slo`; None if empty) and the
    accuracy bounds.

    Raises:
        AccuracyError (field ``slo``): an accuracy key given twice, or a value that is not a positive number
            (percentages at most 100).
    """
    if text is None:
        return None, {}
    tail, bounds = [], {}
    for item in (p.strip() for p in text.split(",")):
        key, _, raw = (s.strip() for s in item.partition("="))
        if key not in SLO_KEYS:
            tail.append(item)
            continue
        if key in bounds:
            raise AccuracyError(f"{key}: given twice", "slo")
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        top = 100.0 if key.endswith("_pct") else math.inf
        if not (math.isfinite(value) and 0 < value <= top):
            expected = "a percentage in (0, 100]" if key.endswith("_pct") else "a positive number"
            raise AccuracyError(f"{key}: expected {expected}, got {raw!r}", "slo")
        bounds[key] = value
    rest = ",".join(t for t in tail if t)
    return (rest or None), bounds
