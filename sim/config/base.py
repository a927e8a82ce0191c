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
        """A YAML ``true``/``false`` (``--set key=yes``) is not a number (pydantic's lax mode reads it as 1 or 0)."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if field is not None and isinstance(value, bool) and not _accepts_bool(field.annotation):
                    got = str(value).lower()
                    raise ValueError(f"{name}: expected a number or a name, got the boolean {got} ({BOOL_WORDS})")
        return data


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
