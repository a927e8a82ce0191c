"""Published cases: small scenarios that mimic public measurements, and their comparison with the simulator.

A case file (``scenarios/cases/<name>.yaml``, schema :class:`CaseSpec`) names a published figure, its source,
the tolerance (stated in the file before anyone looked at the simulated value) and how the simulator computes
the same metric:

- ``kind: simulate``: one simulation per named point (a scenario plus shared overrides plus the point's own);
  the metric is ``numerator`` (optionally over ``denominator``) × ``scale``, each a column of a point's summary
  row or the mean of a ``steps.csv`` column over decode steps (optionally only those with ``batch_size``); a
  quantity whose ``point`` is a list takes the largest value over those points (a peak);
- ``kind: link``: a closed-form figure of ``sim/step/link.py``'s :class:`LinkModel` on a hardware card.

:func:`run_case` is a pure function of the case file (and the shipped scenarios); :func:`compare` turns a
simulated value into an error and a verdict. Verdicts: ``within`` (|error_pct| ≤ tolerance_pct), ``outside``,
``not_modelled`` (the case needs a model this build lacks, e.g. an ``io`` mode; the reason is in ``note``).
For a published range ``[low, high]`` the error is counted from the nearer end (0 inside the range).
Sources of every shipped case: docs/sources.md §9.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.config import OffloadPolicy, load_scenario, read_yaml, scenarios_dir
from sim.config.files import format_validation_error

CASE_COLUMNS = ["case", "source", "metric", "published", "simulated", "error_pct", "tolerance_pct", "verdict", "note"]


class CaseError(ValueError):
    """A bad case file or case name; the message is one line naming the file (and key)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Quantity(_Strict):
    """One number from the simulated points: a summary column, or a steps column's mean over decode steps."""

    point: str | list[str]  # a list: the largest value over those points
    column: str
    table: Literal["summary", "steps"] = "summary"
    batch_size: int | None = None  # steps only: keep decode steps with exactly this batch


class SimulateSpec(_Strict):
    """Simulations of ``scenario`` with ``overrides`` + each point's overrides; the metric from their results."""

    kind: Literal["simulate"]
    scenario: str = "default"
    overrides: list[str] = []
    points: dict[str, list[str]]
    numerator: Quantity
    denominator: Quantity | None = None
    scale: float = 1.0


class LinkSpec(_Strict):
    """A closed-form link figure on one card (sim/step/link.py).

    ``quantity``: ``copy_us`` (µs per copy in a loop of ``fragments`` copies of ``fragment_bytes``, per_fragment),
    ``io_ratio`` (seconds of those copies with ``io_base`` over with ``io``, host gather included),
    ``d2h_stretch`` (H2D time factor while D2H keeps its copy engine busy the whole step).
    """

    kind: Literal["link"]
    hardware: str
    quantity: Literal["copy_us", "io_ratio", "d2h_stretch"]
    fragments: Annotated[int, Field(gt=0)] = 1
    fragment_bytes: Annotated[int, Field(gt=0)] = 4096
    io: str = "per_fragment"
    io_base: str = "per_fragment"


class CaseSpec(_Strict):
    """One case file. ``published``: a value or a ``[low, high]`` range; ``tolerance_pct`` in percent."""

    name: str
    source: str
    metric: str
    published: float | tuple[float, float]
    tolerance_pct: Annotated[float, Field(ge=0)]
    requires_io: list[str] = []  # OffloadPolicy.io modes the case needs; missing → not_modelled
    note: str = ""
    compute: Annotated[SimulateSpec | LinkSpec, Field(discriminator="kind")]


def cases_dir() -> Path:
    """Folder of the shipped case files."""
    return scenarios_dir() / "cases"


def case_names() -> list[str]:
    """Names of the shipped cases (file stems), sorted."""
    return sorted(p.stem for p in cases_dir().glob("*.yaml"))


def load_case(path: Path) -> CaseSpec:
    """Read and validate one case file.

    Raises:
        CaseError: one line naming the file and the bad key (unreadable YAML, unknown or missing key, bad value,
            a simulate case whose quantities name an unknown point).
    """
    try:
        raw = read_yaml(path)
        spec = CaseSpec.model_validate(raw)
    except ValidationError as exc:
        raise CaseError(f"{path}: {format_validation_error(exc)}") from None
    except ValueError as exc:  # read_yaml's ScenarioError already names the file
        message = str(exc)
        raise CaseError(message if str(path) in message else f"{path}: {message}") from None
    if isinstance(spec.compute, SimulateSpec):
        for key, quantity in (("numerator", spec.compute.numerator), ("denominator", spec.compute.denominator)):
            for point in _points(quantity):
                if point not in spec.compute.points:
                    raise CaseError(f"{path}: compute.{key}.point: unknown point {point!r}, expected one of "
                                    f"{sorted(spec.compute.points)}")  # fmt: skip
    return spec


def select_cases(only: list[str] | None = None) -> list[Path]:
    """Paths of the shipped cases, or of the named ones (in the order given).

    Raises:
        CaseError: a name that is not a shipped case.
    """
    names = case_names()
    if not only:
        return [cases_dir() / f"{n}.yaml" for n in names]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise CaseError(f"--only: unknown case {unknown[0]!r}, expected some of {', '.join(names)}")
    return [cases_dir() / f"{n}.yaml" for n in only]


def io_modes() -> tuple[str, ...]:
    """The ``io`` modes this build's offload policy schema accepts (from ``OffloadPolicy.model_fields``)."""
    return tuple(typing.get_args(OffloadPolicy.model_fields["io"].annotation))


def run_case(spec: CaseSpec, on_sim: Callable[[str], None] | None = None) -> dict:
    """Simulate (or compute) one case and compare it with its published value: one row with CASE_COLUMNS keys.

    ``on_sim(point)`` is called before each simulation. Raises ``ScenarioError`` for overrides the scenario
    schema rejects.
    """
    missing = [io for io in spec.requires_io if io not in io_modes()]
    if missing:
        reason = f"needs policy io mode {missing[0]!r}; this build's OffloadPolicy.io accepts {list(io_modes())}"
        return _row(spec, math.nan, "not_modelled", reason)
    if isinstance(spec.compute, LinkSpec):
        value = link_value(spec.compute)
    else:
        value = simulate_value(spec.compute, on_sim)
    error = error_pct(value, spec.published)
    return _row(spec, value, verdict(error, spec.tolerance_pct), spec.note)


def link_value(spec: LinkSpec) -> float:
    """The case's link figure from :class:`sim.step.link.LinkModel` on ``spec.hardware`` (see :class:`LinkSpec`)."""
    from sim.step.link import LinkModel

    link = LinkModel(load_scenario("default", [f"hardware={spec.hardware}"]).hardware)
    if spec.quantity == "d2h_stretch":
        step_s = 1e-3
        return link.d2h_slowdown(link.d2h_bps * step_s, step_s)
    if spec.quantity == "copy_us":
        return link.fragments_s(spec.fragments, spec.fragment_bytes) / spec.fragments * 1e6

    def seconds(io: str) -> float:
        gather, copy = link.layer_times([spec.fragments * spec.fragment_bytes], [spec.fragments], io)
        return float(gather[0] + copy[0])

    return seconds(spec.io_base) / seconds(spec.io)


def simulate_value(spec: SimulateSpec, on_sim: Callable[[str], None] | None = None) -> float:
    """Run one simulation per point used by the metric and compute ``numerator / denominator × scale``."""
    from sim.run import simulate

    used = sorted({p for q in (spec.numerator, spec.denominator) for p in _points(q)})
    results = {}
    for point in used:
        if on_sim is not None:
            on_sim(point)
        scn = load_scenario(spec.scenario, [*spec.overrides, *spec.points[point]])
        policy = scn.policies[0]
        results[point] = simulate(scn).policies[policy]
    value = _quantity(spec.numerator, results)
    if spec.denominator is not None:
        value /= _quantity(spec.denominator, results)
    return value * spec.scale


def _quantity(q: Quantity, results: dict) -> float:
    return max(_one(q, results[p]) for p in _points(q))


def _one(q: Quantity, result) -> float:
    if q.table == "summary":
        return float(result.summary[q.column])
    steps = result.steps[result.steps["phase"] == "decode"]
    if q.batch_size is not None:
        steps = steps[steps["batch_size"] == q.batch_size]
    return float(steps[q.column].mean()) if len(steps) else math.nan


def _points(q: Quantity | None) -> list[str]:
    if q is None:
        return []
    return [q.point] if isinstance(q.point, str) else list(q.point)


def error_pct(simulated: float, published: float | tuple[float, float]) -> float:
    """Percent error of ``simulated`` against a value, or against the nearer end of a range (0 inside it)."""
    low, high = (published, published) if isinstance(published, int | float) else published
    if not math.isfinite(simulated):
        return math.nan
    if simulated < low:
        return (simulated - low) / low * 100
    if simulated > high:
        return (simulated - high) / high * 100
    return 0.0


def verdict(error: float, tolerance_pct: float) -> str:
    """``within`` when |error| ≤ tolerance, else ``outside`` (a NaN error — nothing simulated — is outside)."""
    return "within" if math.isfinite(error) and abs(error) <= tolerance_pct else "outside"


def _row(spec: CaseSpec, value: float, result: str, note: str) -> dict:
    published = spec.published
    shown = f"{published[0]:g}-{published[1]:g}" if isinstance(published, tuple) else f"{published:g}"
    return {
        "case": spec.name,
        "source": spec.source,
        "metric": spec.metric,
        "published": shown,
        "simulated": value,
        "error_pct": error_pct(value, published) if result != "not_modelled" else math.nan,
        "tolerance_pct": spec.tolerance_pct,
        "verdict": result,
        "note": note,
    }


def cases_table(rows: list[dict]) -> pd.DataFrame:
    """Rows of :func:`run_case` as a table with :data:`CASE_COLUMNS`."""
    return pd.DataFrame(rows, columns=CASE_COLUMNS)
