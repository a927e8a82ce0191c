"""Calibrated profiles: what `pulseinfer calibrate` measured, in a form the simulator reads without torch.

A profile is one YAML file (``profile.yaml`` in the calibration's output folder, or a shipped one in
``scenarios/profiles/``), validated as :class:`sim.config.Profile`. Every section is optional, so a profile
can carry the hardware measurements, the selection statistics of a real model, or both::

    name: cpu-2core                   # free text
    source: "pulseinfer calibrate --device cpu --quick"
    metadata: {device_name: ..., torch_version: ..., pinned: false, commit: ..., date: ...}
    hardware: {...}                   # a full HardwareSpec card, measured: true (link and gather fits)
    model: {...}                      # the ModelSpec the compute section was measured on (scaled on a CPU)
    compute: {...}                    # ComputeProfile: per-layer decode time = base + per_request·B + per_token·T
    selection: {...}                  # SelectionProfile: per-layer selection time = base + per_block·C
    recall_stats: {...}               # RecallStatsSpec fitted from a real model (`pulseinfer calibrate selection`)
    recall_stats_source: "..."        # what recall_stats were measured on

A scenario names it with ``profile: PATH_OR_NAME``. :func:`apply_profile` then fills, from the profile,
every section the scenario leaves out: ``hardware`` (so a profile replaces a datasheet card), ``model``
(the model the compute was measured on) and ``recall_stats``. A scenario that gives its own ``hardware``
(not null) as well as a profile with hardware is refused (one of the two would be ignored silently otherwise),
unless the two are identical (a ``scenario.yaml`` written by a run) or the scenario names the card the profile was
calibrated for (its hardware carries that name), which the profile then replaces. The simulator then takes link
times and gather cost from the profile's hardware, per-layer compute and the LM head from
``compute`` (sim/step/compute.py; a profile measured on a few layers of the scenario's model applies to the whole
model, since compute is per layer), selection cost from ``selection`` (sim/policies/offload.py) and the
recall model's statistics from ``recall_stats`` (sim/step/recall.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sim.config.files import ScenarioError, format_validation_error, read_yaml, scenarios_dir, short_repr
from sim.config.measured import Profile

PROFILE_DIR = "profiles"
FILLED_SECTIONS = ("hardware", "model", "recall_stats")


class ProfileError(ScenarioError):
    """A profile that cannot be read or validated; the message is one line naming file and field."""


def profiles_dir() -> Path:
    """Folder of the shipped profiles (``scenarios/profiles``)."""
    return scenarios_dir() / PROFILE_DIR


def profile_names() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def resolve_profile_path(profile: str | Path, base_dir: Path | None = None) -> Path:
    """A profile YAML path, a folder holding ``profile.yaml`` (a calibration's ``--out``), or a shipped name.

    A relative path is tried against ``base_dir`` (the folder of the scenario naming it) first, then the
    current directory.

    Raises:
        ProfileError: if none of these exists (the message lists the shipped profiles).
    """
    path = Path(profile)
    if base_dir is not None and not path.is_absolute() and (base_dir / path).exists():
        path = base_dir / path
    if path.is_dir():
        if (path / "profile.yaml").is_file():
            return path / "profile.yaml"
        raise ProfileError(
            f"profile: folder {path} has no profile.yaml (write one with `pulseinfer calibrate --out {path}`)"
        )
    if path.is_file():
        return path
    shipped = profiles_dir() / f"{profile}.yaml"
    if shipped.is_file():
        return shipped
    raise ProfileError(
        f"profile: no such file, calibration folder or shipped profile {short_repr(str(profile))} "
        f"(shipped: {', '.join(profile_names()) or 'none'})"
    )


def read_profile(profile: str | Path, base_dir: Path | None = None) -> dict[str, Any]:
    """The profile's YAML as a plain dict (not validated); ``base_dir`` as in :func:`resolve_profile_path`.

    Raises:
        ProfileError: missing file, unreadable YAML (with its line and column), or a top level that is not a
            mapping.
    """
    try:
        path = resolve_profile_path(profile, base_dir)
    except OSError as exc:  # a name the system will not look up (too long)
        raise ProfileError(f"profile: cannot look up {short_repr(str(profile))} ({exc.strerror})") from None
    try:
        data = read_yaml(path, what="profile: ")  # the shared reader: unique keys, line and column
    except ScenarioError as exc:
        raise ProfileError(str(exc)) from None
    keys = ", ".join(sorted(set(data) & {"workload", "serving", "policies", "policy", "run", "slo"})) or "card names"
    if keys != "card names" or any(isinstance(data.get(k), str) for k in FILLED_SECTIONS):
        raise ProfileError(f"profile: {path} is a scenario (it has {keys}), not a profile; give it as SCENARIO")
    return data


def load_profile(profile: str | Path) -> Profile:
    """Read and validate a profile.

    Raises:
        ProfileError: as :func:`read_profile`, or a field with a wrong value (``profile.<field>: ...``).
    """
    raw = read_profile(profile)
    try:
        return Profile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError("profile." + format_validation_error(exc)) from None


def write_profile(profile: Profile, path: Path) -> None:
    """Write a profile as YAML (the inverse of :func:`load_profile`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def apply_profile_engine(raw: dict[str, Any]) -> dict[str, Any]:
    """Lay a profile's ``engine`` section (host costs fitted on one release line) over the scenario's engine of that
    line (values the scenario changed from the line's card win). Raises ProfileError for another engine."""
    from sim.config.engine import engine_card

    prof = raw.get("profile")
    fitted = prof.get("engine") if isinstance(prof, dict) else None
    if not isinstance(fitted, dict):
        return raw
    line = engine_card(fitted)["name"]
    given = raw.get("engine")
    if given is not None:
        named = engine_card(given)["name"] if isinstance(given, (str, dict)) else None
        if named != line:
            raise ProfileError(
                f"engine: the scenario runs {short_repr(named)} and its profile carries host costs fitted on "
                f"{short_repr(line)}; give the profile's engine (--set engine={line}) or a profile fitted on yours"
            )
    if not isinstance(given, dict):
        raw["engine"] = {**fitted, "name": line}
    else:  # values the scenario or --set changed from the line's card are the user's and win over the fit
        card = engine_card(line)
        own = {k: v for k, v in given.items() if k in fitted and k != "name" and v != card.get(k)}
        raw["engine"] = {**given, **fitted, **own}
    return raw


def apply_profile(raw: dict[str, Any], base_dir: Path | None = None) -> dict[str, Any]:
    """Resolve ``raw["profile"]`` (a name or path) and fill the scenario sections it leaves out.

    Args:
        raw: a scenario as read from YAML (cards may still be names). Modified and returned.
        base_dir: the scenario file's folder, against which a relative profile path is tried first.

    Raises:
        ProfileError: the profile cannot be read, or the scenario gives a hardware card as well as a
            profile with different hardware (a profile whose hardware carries the name of the scenario's card
            replaces that card: ``pulseinfer calibrate serving`` and ``--from-measured`` write such profiles).
    """
    ref = raw.get("profile")
    if ref is None:
        return raw
    if isinstance(ref, (str, Path)):
        raw["profile"] = prof = read_profile(ref, base_dir)
    elif isinstance(ref, dict):
        prof = ref
    else:
        return raw  # validation reports the wrong type with its location
    for section in FILLED_SECTIONS:
        value = prof.get(section)
        if value is None:
            continue
        if raw.get(section) is None:
            raw[section] = value
        elif section == "hardware" and raw[section] == value.get("name"):
            raw[section] = value  # a profile calibrated for the named card replaces its datasheet figures
        elif section == "hardware" and raw[section] != value:
            given = raw[section] if isinstance(raw[section], str) else "an inline card"
            raise ProfileError(
                f"hardware: the scenario names {short_repr(given)} and its profile carries measured hardware "
                f"{short_repr(value.get('name', '?'))}; give one of the two (drop `hardware`, or --set hardware=null, "
                "to use the profile's)"
            )
    return raw
