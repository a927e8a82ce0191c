"""Search spaces for ``pulseinfer search``: dotted scenario keys with a range or a list of choices.

A space is a YAML mapping (shipped example: ``scenarios/spaces/pulseinfer.yaml``)::

    policy: pulseinfer                 # the policy whose knobs are searched (optional: inferred from keys)
    params:
      policy.pulseinfer.budget_tokens: {low: 1024, high: 4096, step: 512}    # int range (all ints)
      policy.pulseinfer.offload_threshold_tokens: {low: 2048, high: 32768, log: true}
      policy.pulseinfer.admission_slack: {low: -0.25, high: 1.0}             # float range
      policy.pulseinfer.block_size: {choices: [16, 32]}

A range is an int range when ``low``, ``high`` (and ``step``) are all integers, else a float range.
``log`` samples on a log scale (needs ``low > 0``, no ``step``). Keys are any ``--set`` key of the
scenario; a ``policy.<name>.*`` key must name the searched policy.

:func:`check_space` validates every key against the scenario by applying each bound (or choice) on its
own through :func:`sim.config.loader.load_scenario`, so an unknown key or an out-of-range bound is an error
before any trial runs. Bounds that are valid alone can still clash in combination (e.g. ``budget_tokens``
above ``recall_buffer_blocks × block_size``); such trials fail and are recorded, not fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config import ScenarioError, load_scenario, read_yaml, scenarios_dir
from sim.config.files import short_repr

SPACES_DIR = "spaces"
RANGE_FIELDS = {"low", "high", "log", "step"}
TOP_LEVEL = {"policy", "params"}
Scalar = str | int | float | bool | None


class SpaceError(ValueError):
    """A bad search space; the message is one line naming the key."""


@dataclass(frozen=True)
class Param:
    """One searched key: a range (``low``..``high``) or ``choices``."""

    key: str
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[Scalar, ...] | None = None

    @property
    def is_int(self) -> bool:
        return self.choices is None and all(isinstance(v, int) for v in (self.low, self.high, self.step or 1))

    def suggest(self, trial: Any) -> Scalar:
        """Draw this parameter from an Optuna trial (the trial's param name is the dotted key)."""
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.is_int:
            return trial.suggest_int(self.key, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)

    def probe_values(self) -> list[Scalar]:
        """Values checked against the scenario: both bounds, or every choice."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]


@dataclass(frozen=True)
class SearchSpace:
    """The searched policy and its parameters, in file order."""

    policy: str
    params: tuple[Param, ...]

    def signature(self) -> str:
        """Canonical JSON of the space (a study records it; resuming with another space is an error)."""
        return json.dumps({"policy": self.policy, "params": [vars(p) for p in self.params]}, sort_keys=True)


def override(key: str, value: Scalar) -> str:
    """A ``--set`` item for one parameter value (JSON scalars parse as the same YAML scalars)."""
    return f"{key}={json.dumps(value)}"


def resolve_space_path(space: str | Path) -> Path:
    """A YAML path, or the name of a shipped space (``scenarios/spaces/<name>.yaml``).

    Raises:
        SpaceError: if neither exists.
    """
    path = Path(space)
    if path.is_file():
        return path
    shipped = scenarios_dir() / SPACES_DIR / f"{space}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in (scenarios_dir() / SPACES_DIR).glob("*.yaml"))
    raise SpaceError(f"--space: no such file or shipped space {str(space)!r} (shipped: {', '.join(names)})")


def load_space(space: str | Path) -> SearchSpace:
    """Read and parse a space file (structure only; see :func:`check_space` for the scenario check).

    Raises:
        SpaceError: unreadable or over-large file, bad YAML (``sim.config.files.read_yaml``) or a bad entry (the
            message names the key).
    """
    path = resolve_space_path(space)
    try:
        data = read_yaml(path, what="--space ")  # bounded: size, nesting, alias expansion
    except ScenarioError as exc:
        raise SpaceError(str(exc)) from None
    return parse_space(data)


def parse_space(data: Any) -> SearchSpace:
    """Parse a space mapping (see the module docstring).

    Raises:
        SpaceError: unknown top-level or range field, empty range or choices, wrong types, or keys that
            name another policy than the searched one.
    """
    if not isinstance(data, dict):
        raise SpaceError(f"space: expected a mapping with 'params', got {type(data).__name__}")
    unknown = sorted(set(data) - TOP_LEVEL)
    if unknown:
        raise SpaceError(f"space.{unknown[0]}: unknown field (expected {', '.join(sorted(TOP_LEVEL))})")
    raw_params = data.get("params")
    if not isinstance(raw_params, dict) or not raw_params:
        raise SpaceError("space.params: expected a non-empty mapping of dotted scenario keys to ranges or choices")
    params = tuple(_parse_param(str(key), spec) for key, spec in raw_params.items())
    return SearchSpace(_searched_policy(data.get("policy"), params), params)


def _parse_param(key: str, spec: Any) -> Param:
    where = f"space: params.{key}"
    if not key or any(not part for part in key.split(".")):
        raise SpaceError(f"{where}: expected a dotted scenario key such as policy.pulseinfer.budget_tokens")
    if key == "policies" or key.startswith(("policy.", "policies.")) and key.count(".") < 2:
        raise SpaceError(f"{where}: cannot search the policy list; search keys under policy.<name>.")
    if not isinstance(spec, dict):
        raise SpaceError(f"{where}: expected {{low, high[, log, step]}} or {{choices: [...]}}, got {short_repr(spec)}")
    if "choices" in spec:
        return _parse_choices(key, where, spec)
    unknown = sorted(set(spec) - RANGE_FIELDS)
    if unknown:
        raise SpaceError(f"{where}: unknown field {short_repr(unknown[0])} (expected low, high, log, step or choices)")
    low, high, log, step = spec.get("low"), spec.get("high"), spec.get("log", False), spec.get("step")
    for name, value in (("low", low), ("high", high)):
        if not _is_number(value):
            raise SpaceError(f"{where}: {name} must be a number, got {short_repr(value)}")
    if low > high:
        raise SpaceError(f"{where}: empty range (low={low} > high={high})")
    if not isinstance(log, bool):
        raise SpaceError(f"{where}: log must be true or false, got {short_repr(log)}")
    if step is not None and not (_is_number(step) and step > 0):
        raise SpaceError(f"{where}: step must be a positive number, got {short_repr(step)}")
    if log and step is not None:
        raise SpaceError(f"{where}: give log or step, not both")
    if log and low <= 0:
        raise SpaceError(f"{where}: log range needs low > 0, got low={low}")
    return Param(key, low, high, log, step)


def _parse_choices(key: str, where: str, spec: dict) -> Param:
    if set(spec) != {"choices"}:
        raise SpaceError(f"{where}: choices cannot be combined with {sorted(set(spec) - {'choices'})}")
    choices = spec["choices"]
    if not isinstance(choices, list) or not choices:
        raise SpaceError(f"{where}: choices must be a non-empty list, got {short_repr(choices)}")
    for value in choices:
        if value is not None and not isinstance(value, str | int | float | bool):
            raise SpaceError(f"{where}: choices must be scalars, got {short_repr(value)}")
    if len({json.dumps(v) for v in choices}) != len(choices):
        raise SpaceError(f"{where}: choices repeat a value: {choices}")
    return Param(key, choices=tuple(choices))


def _searched_policy(given: Any, params: tuple[Param, ...]) -> str:
    named = {p.key.split(".")[1] for p in params if p.key.startswith("policy.")}
    if given is not None:
        if not isinstance(given, str) or not given:
            raise SpaceError(f"space.policy: expected a policy name, got {short_repr(given)}")
        for p in params:
            if p.key.startswith("policy.") and p.key.split(".")[1] != given:
                raise SpaceError(
                    f"space: params.{p.key}: names policy {p.key.split('.')[1]!r}, not the searched {given!r}"
                )
        return given
    if len(named) != 1:
        found = ", ".join(sorted(named)) or "none"
        raise SpaceError(f"space.policy: give the searched policy (params name policy.<name>.* for: {found})")
    return named.pop()


def check_space(space: SearchSpace, scenario: str | Path | None, overrides: list[str]) -> None:
    """Apply each bound or choice alone to the scenario (searched policy only) and validate it.

    Raises:
        SpaceError: naming the key: unknown scenario key, or a value the scenario rejects.
        ScenarioError: the scenario itself (with ``overrides``) is bad.
    """
    base = [*overrides, f"policies={space.policy}"]
    load_scenario(scenario, base)
    for p in space.params:
        for value in p.probe_values():
            try:
                load_scenario(scenario, [*base, override(p.key, value)])
            except ScenarioError as exc:
                if "Extra inputs are not permitted" in str(exc) or "is not a mapping" in str(exc):
                    raise SpaceError(f"space: params.{p.key}: unknown scenario key ({exc})") from None
                raise SpaceError(f"space: params.{p.key}: value {value!r} is not valid here ({exc})") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value
