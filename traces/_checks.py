"""Argument checks shared by the public functions of `traces`: errors name the argument and its value."""

from __future__ import annotations

import math
from numbers import Real

import numpy as np


def check_number(name: str, value: object) -> float:
    """`value` as a float; TypeError for bools and non-numbers, ValueError for NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_positive(name: str, value: object) -> float:
    """`value` as a float; ValueError unless it is > 0."""
    number = check_number(name, value)
    if number <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return number


def check_non_negative(name: str, value: object) -> float:
    """`value` as a float; ValueError unless it is >= 0."""
    number = check_number(name, value)
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return number


def check_int(name: str, value: object, minimum: int) -> int:
    """`value` as an int; TypeError for bools and non-integers, ValueError unless it is >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)
