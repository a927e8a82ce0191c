"""Reading the scenario folder's YAML files, and the one error every scenario input problem raises.

Both the scenario loader (sim/config/loader.py) and the profile reader (sim/config/profiles.py) read YAML
through :func:`read_yaml` and report through :class:`ScenarioError`, so neither imports the other.

:func:`read_yaml` is strict where ``yaml.safe_load`` is silent: a key repeated in one mapping (the last one
would win and the first be lost) is refused naming the key and both lines, and a syntax error names the
file, line and column. It is also bounded, so a hostile file cannot hang the loader: a file over
:data:`MAX_YAML_BYTES` is refused before it is read, and composing refuses nesting deeper than
:data:`MAX_YAML_DEPTH` and aliases whose expansion would exceed :data:`MAX_YAML_NODES` nodes (a "billion
laughs" of 300 bytes expands to 9^9 values). Error messages show input values through :func:`short_repr`, so
no message ever formats a large value in full.
"""

from __future__ import annotations

import importlib.util
import reprlib
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


MAX_YAML_BYTES = 1 << 20  # 1 MiB: the shipped files are under 4 KiB
MAX_YAML_NODES = 1_000_000  # values after alias expansion (a 1 MiB file without aliases holds fewer)
MAX_YAML_DEPTH = 100  # levels of nesting (much deeper exhausts Python's recursion while composing)
SHOWN_CHARS = 80  # longest input value (or key) an error message shows
SHOWN_MESSAGE_CHARS = 400  # longest message of one validation error (a validator may quote values)
SHOWN_ERRORS = 10  # validation errors listed in one message

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, SHOWN_CHARS, SHOWN_CHARS
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6


def short_repr(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (``...`` marks a cut), in time and memory bounded by
    the limit whatever the value's size: error messages show input values through it."""
    try:
        text = _SHORT.repr(value)
    except Exception:  # noqa: BLE001 (a value whose repr fails, e.g. an int beyond Python's digit limit)
        text = f"<{type(value).__name__}>"
    return cut(text, limit)


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit - 3`` characters and ``...`` when it is longer than ``limit``."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice (raised while parsing, caught by :func:`read_yaml`)."""


class YamlLimitError(yaml.YAMLError):
    """A document beyond the loader's bounds (nesting depth, alias expansion), raised while composing; the message
    names the line and the limit."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping (YAML 1.2 requires unique keys) and
    bounds the work a document can cause (see the module docstring).

    Composing records on each node how many nodes it stands for with aliases expanded (``node.expanded``): an
    alias stands for its anchor's count, so the counts stay exact while composing touches each written node
    once. An alias to a collection that contains it (an infinite expansion) is refused too.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if not hasattr(node, "expanded"):  # its anchor's collection is still being composed
                raise YamlLimitError(
                    f"line {mark.line + 1}: an alias refers to a collection that contains it (an endless expansion)"
                )
            return node
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            line = self.peek_event().start_mark.line + 1
            raise YamlLimitError(
                f"line {line}: values nested more than {MAX_YAML_DEPTH} levels deep, the YAML loader's limit"
            )
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        node.expanded = 1 + _children_expanded(node)
        if node.expanded > MAX_YAML_NODES:
            raise YamlLimitError(
                f"line {node.start_mark.line + 1}: aliases expand to more than {MAX_YAML_NODES:,} values, "
                "the YAML loader's limit"
            )
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except ValueError as exc:  # an int beyond Python's digit limit, an impossible date (2020-13-45)
            reason = str(exc).partition(";")[0]
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read {short_repr(node.value)} as {node.tag.rpartition(':')[2]} ({reason})",
                node.start_mark,
            ) from None

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
                raise DuplicateKeyError(
                    f"key {short_repr(key)} appears twice in one mapping, at line {first} and line {line}"
                )
        return super().construct_mapping(node, deep=deep)


def _children_expanded(node: yaml.Node) -> int:
    """Sum of the ``expanded`` counts of a collection node's children (0 for a scalar)."""
    if isinstance(node, yaml.SequenceNode):
        return sum(child.expanded for child in node.value)
    if isinstance(node, yaml.MappingNode):
        return sum(key.expanded + value.expanded for key, value in node.value)
    return 0


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text with unique keys, within the loader's bounds; ``where`` (a file name) leads the message.

    Raises:
        ScenarioError: text over :data:`MAX_YAML_BYTES`, nesting deeper than :data:`MAX_YAML_DEPTH` or aliases
            expanding beyond :data:`MAX_YAML_NODES` (each naming the limit), a syntax error or an unreadable
            value (``where: line L, column C: problem``), or a repeated key (both lines).
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise ScenarioError(f"{where}: {size:,} bytes, more than the YAML loader's limit of {MAX_YAML_BYTES:,}")
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except (YamlLimitError, DuplicateKeyError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = cut(getattr(exc, "problem", None) or str(exc).splitlines()[0], SHOWN_MESSAGE_CHARS)
        raise ScenarioError(f"{where}: not valid YAML at {at}{problem}") from None


def read_yaml(path: Path, what: str = "") -> dict[str, Any]:
    """A YAML file whose top level is a mapping, parsed by :func:`parse_yaml` (unique keys).

    Args:
        path: the file.
        what: leads every message (e.g. ``"profile: "``), so the error names the field that named the file.

    Raises:
        ScenarioError: unreadable file, a file over :data:`MAX_YAML_BYTES` (refused before it is read), any
            :func:`parse_yaml` error, or a top level that is not a mapping.
    """
    try:
        data = parse_yaml(_read_bounded(path), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{what}{path}: cannot read as UTF-8 text ({exc.__class__.__name__}: {exc})") from None
    except ScenarioError as exc:
        raise type(exc)(f"{what}{exc}") from None
    if data is None:
        raise ScenarioError(f"{what}{path}: the file is empty (or only comments); expected a mapping of keys")
    if not isinstance(data, dict):
        raise ScenarioError(f"{what}{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _read_bounded(path: Path) -> str:
    """The file's text; ScenarioError when it holds more than :data:`MAX_YAML_BYTES`, found with ``stat`` before
    reading (of a file whose size ``stat`` does not tell, at most the limit plus one byte is read)."""
    size = path.stat().st_size
    if size <= MAX_YAML_BYTES:
        with path.open("rb") as stream:
            data = stream.read(MAX_YAML_BYTES + 1)
        if len(data) <= MAX_YAML_BYTES:
            return data.decode("utf-8")
    held = f"{size:,} bytes, more" if size > MAX_YAML_BYTES else "more"
    raise ScenarioError(f"{path}: {held} than the YAML loader's limit of {MAX_YAML_BYTES:,} bytes")


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
    when ``root`` (the validated model) is given.

    Bounded whatever the input: values show through :func:`short_repr`, a long key or message is cut, and only
    the first :data:`SHOWN_ERRORS` errors are listed (then how many more there are).
    """
    parts = []
    for err in exc.errors():
        loc_parts = list(err["loc"])
        if len(loc_parts) > 2 and loc_parts[0] == "policy" and loc_parts[2] in POLICY_KINDS:
            del loc_parts[2]  # pydantic puts the discriminator tag in the path; users never write it
        loc = ".".join(cut(str(p), SHOWN_CHARS) for p in loc_parts)
        got = err.get("input")
        shown = "" if err["type"] == "missing" or isinstance(got, dict) else f" (got {short_repr(got)})"
        msg = cut(err["msg"].removeprefix("Value error, "), SHOWN_MESSAGE_CHARS)
        keys = known_keys(root, loc_parts) if root is not None and err["type"] == "extra_forbidden" else None
        if keys:
            msg = f"unknown key; expected one of {', '.join(keys)}"
        parts.append(f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}")  # a whole-model check names its keys
    # A section filled from a profile fails twice (as `hardware.x` and `profile.hardware.x`): report it once.
    given = set(parts)
    parts = [p for p in parts if not (p.startswith("profile.") and p.removeprefix("profile.") in given)]
    more = f"; and {len(parts) - SHOWN_ERRORS} more error(s)" if len(parts) > SHOWN_ERRORS else ""
    return "; ".join(parts[:SHOWN_ERRORS]) + more
