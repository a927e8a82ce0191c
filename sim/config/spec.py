"""Shared pieces of the scenario schema: the frozen pydantic base, unit constants and constrained types.

Every section of a scenario (sim/config/*.py) is a frozen pydantic v2 model that rejects unknown keys, so a
typo comes back with its dotted location (``workload.time_scal: Extra inputs are not permitted``). Units
follow the key names: ``_gib`` = 2**30 bytes, ``_gbps`` = 1e9 bytes/s, ``_us`` = 1e-6 s. These models are the
*edge*: the simulator's hot loops copy what they need into plain locals once.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}

BOOL_WORDS = "YAML reads yes/no/on/off/true/false as booleans"
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]


class Spec(BaseModel):
    """Base of every scenario section: frozen, unknown keys rejected, no inf/NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_as_number(cls, data: object) -> object:
        """A YAML ``true``/``false`` (``--set key=yes``) is not a number (pydantic's lax mode reads it as 1 or 0), at
        the top of a field or inside a list or mapping of scalars (``cost.gpu_hour_usd.h200=yes``, a size table's
        row, ``policies=sglang,yes``)."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if field is None or _accepts_bool(field.annotation):
                    continue
                walk = isinstance(value, bool) or "value" not in _kinds(field.annotation)  # scalars, or containers
                found = _boolean_in(value, name) if walk else None  # of them (sections check their own fields)
                if found is not None:
                    where, got = found
                    expected = _expected(field.annotation)
                    raise ValueError(f"{where}: expected {expected}, got the boolean {str(got).lower()} ({BOOL_WORDS})")
        return data


def _boolean_in(value: object, where: str) -> tuple[str, bool] | None:
    """The dotted place and value of the first boolean in ``value`` (itself, or inside its lists, tuples and
    mappings), or None."""
    if isinstance(value, bool):
        return where, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _boolean_in(item, f"{where}.{key}")
        if found is not None:
            return found
    return None


def _kinds(annotation: object) -> set[str]:
    """What a field's type admits, in words: ``number``, ``name`` (a string or a string choice), ``value``; a list's
    or tuple's items and a mapping's values for a container."""
    if annotation is type(None):
        return set()
    if annotation in (int, float):
        return {"number"}
    if annotation is str:
        return {"name"}
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return {"name" if isinstance(a, str) else "number" for a in typing.get_args(annotation)}
    if origin is Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin in (list, tuple):  # what its items admit
        return set().union(*(_kinds(a) for a in typing.get_args(annotation) if a is not Ellipsis))
    if origin is dict:  # what its values admit
        return _kinds(typing.get_args(annotation)[1])
    if origin is not None:  # a union
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    return {"value"}


def _expected(annotation: object) -> str:
    """``a number``, ``a name``, ``a number or a name`` or ``a value``: what a field refusing a boolean wants."""
    kinds = _kinds(annotation)
    if kinds in ({"number"}, {"name"}):
        return f"a {kinds.pop()}"
    return "a number or a name" if kinds == {"number", "name"} else "a value"


def _accepts_bool(annotation: object) -> bool:
    """Whether a field's type admits a boolean (bool itself, or a union, Annotated or Literal holding one)."""
    if annotation is bool or annotation is typing.Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    if origin is Annotated:
        return _accepts_bool(typing.get_args(annotation)[0])
    return origin is not None and any(_accepts_bool(a) for a in typing.get_args(annotation))
