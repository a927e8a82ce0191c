"""Load a scenario YAML, resolve model, hardware and engine card names, apply ``key=value`` overrides, validate.

Flow: read YAML → dict → a named ``profile`` fills the sections the scenario leaves out (sim/config/profiles.py)
→ overrides (dotted keys; a card name met on the way is expanded to its card so
``hardware.h2d_bandwidth_gbps=25`` works on ``hardware: h200``) → remaining card names expanded →
``Scenario.model_validate``. Every failure is a :class:`ScenarioError` with one line naming the key, the
value and what was expected; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sim.config.engine import engine_card, known_lines, resolve_engine
from sim.config.engine_apply import DEFAULT_ENGINE_NAME, apply_engine
from sim.config.files import (
    SHOWN_CHARS,
    ScenarioError,
    UniqueKeyLoader,
    YamlLimitError,
    cut,
    format_validation_error,
    read_yaml,
    scenarios_dir,
    short_repr,
)
from sim.config.profiles import apply_profile, apply_profile_engine
from sim.config.scenario import Scenario

CARD_KINDS = {"model": "models", "hardware": "hardware", "engine": "engines"}
POLICY_DIR = "policies"
DEFAULT_POLICIES = ["sglang", "pulseinfer"]
DEFAULT_SCENARIO = "default"
LIST_KEYS = {"policies"}  # list fields settable as a comma-separated string
# An engine card's identity: which line and release it is; set by naming the engine, never by a dotted override.
ENGINE_IDENTITY = {f"engine.{key}" for key in ("name", "engine", "version", "versions", "built_from", "note")}


def card_names(kind: str) -> list[str]:
    """Names of the shipped cards of one kind (``"model"``, ``"hardware"`` or ``"engine"``)."""
    return sorted(p.stem for p in (scenarios_dir() / CARD_KINDS[kind]).glob("*.yaml"))


def load_card(kind: str, name: str) -> dict[str, Any]:
    """Read a card as a plain dict: a shipped card's name (``h200``), or the path of a card file of your own
    (``--set hardware=my-gpu.yaml``, ``--set engine=fit/engine-vllm-0.8.yaml``: a name ending in ``.yaml`` or
    ``.yml``, relative to the working folder; in a scenario file, to the scenario's folder).

    Raises:
        ScenarioError: if no card of that kind has that name (the message lists the shipped ones), or no such file.
    """
    if is_card_file(name):
        own = Path(name).expanduser()
        if not _is_file(own):
            stem = own.name.rsplit(".", 1)[0].lower()
            hint = f" (the shipped card is named {stem}, without .yaml)" if stem in card_names(kind) else ""
            raise ScenarioError(f"{kind}: no such card file {short_repr(name)}{hint}")
        data = read_yaml(own, f"{kind}: ")
        if isinstance(data.get(kind), dict):  # a profile (calibrate writes them beside its engine cards)
            raise ScenarioError(
                f"{kind}: {short_repr(name)} is a profile (it has a {kind} section), not a {kind} card: "
                f"use --set profile={name}"
            )
        return engine_card(data) if kind == "engine" else data
    if kind == "engine":
        return resolve_engine(name)
    path = scenarios_dir() / CARD_KINDS[kind] / f"{name.lower()}.yaml"
    if not _is_file(path):
        names = card_names(kind)
        near = difflib.get_close_matches(name, names, n=5, cutoff=0.0) if len(names) > 12 else names
        more = f", ... {len(names)} in scenarios/{CARD_KINDS[kind]}/" if len(near) < len(names) else ""
        raise ScenarioError(f"{kind}: unknown card {short_repr(name)} (shipped: {', '.join(near)}{more})")
    return read_yaml(path)


def is_card_file(name: str) -> bool:
    """Whether a card value names a file of your own (it ends in ``.yaml`` or ``.yml``) rather than a shipped card."""
    return name.lower().endswith((".yaml", ".yml"))


def _cards_beside(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """A scenario file's own card files (``hardware: my-gpu.yaml``) are read from the scenario's folder, as its
    profile is; ``--set hardware=PATH`` is relative to the working folder."""
    for kind in CARD_KINDS:
        value = raw.get(kind)
        if isinstance(value, str) and is_card_file(value) and not Path(value).expanduser().is_absolute():
            raw[kind] = str(base_dir / value)
    return raw


def resolve_scenario_path(scenario: str | Path | None) -> Path:
    """A path to a YAML file, or the name of a shipped scenario (``default``, ``examples/...``)."""
    if scenario is None:
        scenario = DEFAULT_SCENARIO
    path = Path(scenario)
    if path.is_file():
        return path
    shipped = scenarios_dir() / f"{scenario}.yaml"
    if shipped.is_file():
        return shipped
    shipped_names = sorted(p.stem for p in scenarios_dir().glob("*.yaml"))
    raise ScenarioError(f"scenario: no such file or shipped scenario {str(scenario)!r} (shipped: {shipped_names})")


def load_scenario(scenario: str | Path | None = None, overrides: list[str] | None = None) -> Scenario:
    """Load, override and validate a scenario.

    Args:
        scenario: YAML path or shipped scenario name; None means the shipped default.
        overrides: ``"dotted.key=value"`` strings; values parse as YAML scalars (``2048``, ``true``,
            ``null``); a comma-separated value sets a list field (``policies=sglang,pulseinfer``).

    Raises:
        ScenarioError: one line naming the key, the value and what was expected.
    """
    path = resolve_scenario_path(scenario)
    raw = apply_profile(_cards_beside(read_yaml(path), path.parent), path.parent)
    parsed = [_parse_override(item) for item in overrides or []]
    for key, _ in parsed:
        if key in ENGINE_IDENTITY:
            raise ScenarioError(
                f"--set {key}: a release line's identity is not a value to override; name the engine instead, e.g. "
                "--set engine=vllm-0.9.2 (a card of your own: --set engine=my-engine.yaml)"
            )
    for key, value in parsed:
        _set_dotted(raw, key, value)
    if isinstance(raw.get("profile"), str):  # named by an override
        apply_profile(raw)
    apply_profile_engine(raw)  # after the overrides: a measured file's `engine=` names the line the profile fitted
    raw.setdefault("engine", DEFAULT_ENGINE_NAME)
    if not isinstance(raw["engine"], (str, dict)) or (isinstance(raw["engine"], str) and not raw["engine"].strip()):
        raise ScenarioError(
            f"engine: expected an engine as it prints itself (vllm-0.11.0, sglang-0.5.5.post1, trtllm-1.2.0rc1), a "
            f"card file or a card, got {short_repr(raw['engine'])} (known lines: {known_lines()})"
        )
    for kind in CARD_KINDS:
        if isinstance(raw.get(kind), str):
            raw[kind] = load_card(kind, raw[kind])
    if isinstance(raw.get("engine"), dict):
        raw["engine"] = engine_card(raw["engine"])
    given = _given_keys(raw)
    raw["policy"] = resolve_policies(raw)
    apply_engine(raw, given)
    _check_policy_overrides([key for key, _ in parsed], raw["policies"])
    return validate_scenario(raw)


def _given_keys(raw: dict[str, Any]) -> dict[str, set[str]]:
    """The keys the scenario (its file, profile and ``--set`` overrides) sets itself, before presets and the engine's
    defaults fill the rest: ``serving`` and ``policy.<name>`` → key names."""
    serving, policies = raw.get("serving"), raw.get("policy")
    out = {"serving": set(serving) if isinstance(serving, dict) else set()}
    for name, entry in policies.items() if isinstance(policies, dict) else ():
        out[f"policy.{name}"] = set(entry) if isinstance(entry, dict) else set()
    return out


def policy_presets() -> list[str]:
    """Names of the shipped policy presets (``scenarios/policies/*.yaml``)."""
    return sorted(p.stem for p in (scenarios_dir() / POLICY_DIR).glob("*.yaml"))


def resolve_policies(raw: dict[str, Any]) -> dict[str, Any]:
    """Knobs of every policy in ``raw["policies"]``: its preset, then the scenario's ``policy.<name>`` keys.

    A name is a shipped preset, or any name whose ``policy.<name>.preset`` names one (ablation variants).

    Raises:
        ScenarioError: a policy that is neither a preset nor has a ``preset`` key, or an unknown preset.
    """
    names = raw.setdefault("policies", list(DEFAULT_POLICIES))
    given = raw.get("policy") or {}
    if not isinstance(names, list) or not isinstance(given, dict):
        return given  # let validation report the wrong type with its location
    resolved: dict[str, Any] = {}
    for name in names:
        entry = given.get(name) or {}
        if not isinstance(entry, dict) or not isinstance(name, str):
            resolved[str(name)] = entry
            continue
        entry = dict(entry)
        preset = entry.pop("preset", name)
        path = scenarios_dir() / POLICY_DIR / f"{preset}.yaml"
        if not _is_file(path) and "kind" in entry and "preset" not in (given.get(name) or {}):
            resolved[name] = entry  # a complete, already resolved entry (e.g. a written scenario.yaml)
            continue
        if not _is_file(path):
            shown = cut(name, SHOWN_CHARS)
            where = f"policy.{shown}.preset" if preset != name else "policies"
            raise ScenarioError(
                f"{where}: unknown policy {short_repr(preset)} (presets: {', '.join(policy_presets())}; "
                f"or define policy.{shown}.preset)"
            )
        resolved[name] = {**read_yaml(path), **entry}
    return resolved


def validate_scenario(raw: dict[str, Any]) -> Scenario:
    """Validate a plain dict as a :class:`Scenario`, turning pydantic errors into one line."""
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, Scenario)) from None


def dump_scenario(scenario: Scenario, path: Path) -> None:
    """Write the resolved scenario (cards expanded) so the run can be reproduced from it alone."""
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))


def _check_policy_overrides(keys: list[str], names: Any) -> None:
    """Refuse ``--set policy.NAME.KEY=...`` for a NAME that does not run (a typo would be dropped silently)."""
    if not isinstance(names, list):
        return  # validation reports the wrong type
    for key in keys:
        parts = key.split(".")
        if parts[0] == "policy" and len(parts) > 1 and parts[1] not in names:
            raise ScenarioError(
                f"--set {key}: policy {parts[1]!r} is not run (policies: {', '.join(map(str, names))}); "
                f"add it with --set policies={','.join(map(str, [*names, parts[1]]))} or fix the name"
            )


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False also for a path the system refuses to look up (a name too long, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {item!r}: expected key=value, e.g. workload.time_scale=0.5")
    return key.strip(), _yaml_value(text, key.strip()) if text.strip() else None


def _yaml_value(text: str, key: str) -> Any:
    """A ``--set`` value parsed as YAML by the bounded loader (an alias bomb is refused naming ``key``); text that
    is not YAML, or names a value Python cannot build (``2020-13-45``), stays a string."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except YamlLimitError as exc:
        raise ScenarioError(f"--set {key}: {exc}") from None
    except yaml.YAMLError:
        return text


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    node: Any = raw
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        if depth == 0 and part in CARD_KINDS and isinstance(node.get(part), str):
            node[part] = load_card(part, node[part])
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ScenarioError(f"--set {key}: {'.'.join(parts[: depth + 1])} is not a mapping")
        node = child
    leaf = parts[-1]
    if isinstance(value, str) and (isinstance(node.get(leaf), list) or key in LIST_KEYS):
        value = [_yaml_value(v.strip(), key) for v in value.split(",") if v.strip()]
    node[leaf] = value
