"""Reading the scenario folder's YAML files, and the one error every scenario input problem raises.

Both the scenario loader (sim/config/loader.py) and the profile reader (sim/config/profiles.py) read YAML
through :func:`read_yaml` and report through :class:`ScenarioError`, so neither imports the other.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

POLICY_KINDS = ("dense", "offload")  # pydantic's discriminator tags, hidden from error locations


class ScenarioError(ValueError):
    """Bad scenario input: unknown key, wrong value, missing file. The message is one line."""


def scenarios_dir() -> Path:
    """Folder of the shipped scenarios and cards."""
    return Path(str(files("scenarios")))


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping.

    Raises:
        ScenarioError: unreadable file, invalid YAML or a top level that is not a mapping.
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read as UTF-8 text ({exc.__class__.__name__}: {exc})") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def format_validation_error(exc: ValidationError) -> str:
    """``a.b: message (got value)`` for each error, joined by ``; ``."""
    parts = []
    for err in exc.errors():
        loc_parts = list(err["loc"])
        if len(loc_parts) > 2 and loc_parts[0] == "policy" and loc_parts[2] in POLICY_KINDS:
            del loc_parts[2]  # pydantic puts the discriminator tag in the path; users never write it
        loc = ".".join(str(p) for p in loc_parts)
        got = err.get("input")
        shown = "" if err["type"] == "missing" or isinstance(got, dict) else f" (got {got!r})"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc or 'scenario'}: {msg}{shown}")
    # A section filled from a profile fails twice (as `hardware.x` and `profile.hardware.x`): report it once.
    return "; ".join(p for p in parts if not (p.startswith("profile.") and p.removeprefix("profile.") in parts))
