"""Shared pieces of the scenario schema: the frozen pydantic base, unit constants and constrained types.

Every section of a scenario (sim/config/*.py) is a frozen pydantic v2 model that rejects unknown keys, so a
typo comes back with its dotted location (``workload.time_scal: Extra inputs are not permitted``). Units
follow the key names: ``_gib`` = 2**30 bytes, ``_gbps`` = 1e9 bytes/s, ``_us`` = 1e-6 s. These models are the
*edge*: the simulator's hot loops copy what they need into plain locals once.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]


class Spec(BaseModel):
    """Base of every scenario section: frozen, unknown keys rejected, no inf/NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
