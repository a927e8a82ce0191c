"""Reading the scenario folder's YAML files, and the one error every scenario input problem raises.

Both the scenario loader (sim/config/loader.py) and the profile reader (sim/config/profiles.py) read YAML
through :func:`read_yaml` and report through :class:`ScenarioError`, so neither imports the other.

:func:`read_yaml` is strict where ``yaml.safe_load`` is silent: a key repeated in one mapping (the last one
would win and the first be lost) is refused naming the key and both lines, and a syntax error names the
file, line and column.
"""

from __future__ import annotations

import importlib.util
from importlib.resources import files
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

POLICY_KINDS = ("dense", "offload")  # pydantic's discriminator tags, hidden from error locations


class ScenarioError(ValueError):
    """Bad scenario input: unknown key, wrong value, missing file. The message is one line."""


PARQUET_INSTALL = "pip install 'pulseinfer[parquet]'"


def has_pyarrow() -> bool:
    """Whether ``pyarrow`` (the ``parquet`` extra) is installed (found, not imported: cheap)."""
    return importlib.util.find_spec("pyarrow") is not None


def table_format_problem(table_format: str) -> str | None:
    """Why ``run.table_format`` cannot be used here (``parquet`` without pyarrow), or None."""
    if table_format == "parquet" and not has_pyarrow():
        return f"parquet needs pyarrow, which is not installed: {PARQUET_INSTALL} (or set run.table_format=csv or auto)"
    return None


def resolve_table_format(table_format: str) -> str:
    """``csv`` or ``parquet`` for a ``run.table_format`` value (``auto``: parquet when pyarrow is installed)."""
    if table_format == "auto":
        return "parquet" if has_pyarrow() else "csv"
    return table_format


def scenarios_dir() -> Path:
    """Folder of the shipped scenarios and cards."""
    return Path(str(files("scenarios")))


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice (raised while parsing, caught by :func:`read_yaml`)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping (YAML 1.2 requires unique keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen[key] = line
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not None:
                raise DuplicateKeyError(f"key {key!r} appears twice in one mapping, at line {first} and line {line}")
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text with unique keys; ``where`` (a file name) leads the error message.

    Raises:
        ScenarioError: a syntax error (``where: line L, column C: problem``) or a repeated key (both lines).
    """
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKeyError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{where}: not valid YAML at {at}{problem}") from None


def read_yaml(path: Path, what: str = "") -> dict[str, Any]:
    """A YAML file whose top level is a mapping, parsed by :func:`parse_yaml` (unique keys).

    Args:
        path: the file.
        what: leads every message (e.g. ``"profile: "``), so the error names the field that named the file.

    Raises:
        ScenarioError: unreadable file, invalid YAML (file, line, column), a repeated key (both lines) or a
            top level that is not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{what}{path}: cannot read as UTF-8 text ({exc.__class__.__name__}: {exc})") from None
    try:
        data = parse_yaml(text, str(path))
    except ScenarioError as exc:
        raise type(exc)(f"{what}{exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{what}{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (through Optional, Annotated, unions), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        model = _model_in(arg)
        if model is not None:
            return model
    return None


def known_keys(root: type[BaseModel], loc: list) -> list[str] | None:
    """Field names of the section holding key ``loc[-1]`` (walked from ``root``), or None when not a plain model."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return None
    return sorted(model.model_fields)


def format_validation_error(exc: ValidationError, root: type[BaseModel] | None = None) -> str:
    """``a.b: message (got value)`` for each error, joined by ``; ``; an unknown key lists the section's keys
    when ``root`` (the validated model) is given."""
    parts = []
    for err in exc.errors():
        loc_parts = list(err["loc"])
        if len(loc_parts) > 2 and loc_parts[0] == "policy" and loc_parts[2] in POLICY_KINDS:
            del loc_parts[2]  # pydantic puts the discriminator tag in the path; users never write it
        loc = ".".join(str(p) for p in loc_parts)
        got = err.get("input")
        shown = "" if err["type"] == "missing" or isinstance(got, dict) else f" (got {got!r})"
        msg = err["msg"].removeprefix("Value error, ")
        keys = known_keys(root, loc_parts) if root is not None and err["type"] == "extra_forbidden" else None
        if keys:
            msg = f"unknown key; expected one of {', '.join(keys)}"
        parts.append(f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}")  # a whole-model check names its keys
    # A section filled from a profile fails twice (as `hardware.x` and `profile.hardware.x`): report it once.
    return "; ".join(p for p in parts if not (p.startswith("profile.") and p.removeprefix("profile.") in parts))
