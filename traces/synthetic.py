"""Synthetic request tables: Poisson arrivals and lognormal prompt/output lengths.

Use this when no recorded trace fits (or to sweep load). The lengths are lognormal, parameterised by their
mean and coefficient of variation (cv = std / mean) rather than by (mu, sigma), because those are the two
numbers a trace summary gives: sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2 / 2. cv = 0 gives constants.

Lengths are rounded to the nearest integer and floored at `min_tokens`. The floor is the only alteration
(there is no upper clip); it raises the sample mean slightly above the requested mean when much of the mass
lies below `min_tokens` (e.g. small means with a large cv). The number of floored values is in `df.attrs`.

All randomness comes from the `np.random.Generator` passed in , drawn in a fixed order: arrival
gaps, then prompt lengths, then output lengths.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from traces._checks import check_int, check_non_negative, check_positive
from traces.schema import REQUEST_COLUMNS


def synthetic_requests(
    num_requests: int,
    rate_per_s: float,
    prompt_tokens_mean: float,
    output_tokens_mean: float,
    rng: np.random.Generator,
    prompt_tokens_cv: float = 1.0,
    output_tokens_cv: float = 0.5,
    min_tokens: int = 1,
) -> pd.DataFrame:
    """Generate a request table with Poisson arrivals and lognormal lengths.

    Args:
        num_requests: number of rows, >= 1.
        rate_per_s: mean arrival rate in requests per second, > 0 (gaps are exponential with mean 1 / rate;
            the first arrival is at 0.0 s).
        prompt_tokens_mean: mean prompt length in tokens before rounding and flooring, > 0.
        output_tokens_mean: mean output length in tokens before rounding and flooring, > 0.
        rng: the only source of randomness.
        prompt_tokens_cv: coefficient of variation of prompt length, >= 0 (0 = constant).
        output_tokens_cv: coefficient of variation of output length, >= 0 (0 = constant).
        min_tokens: floor applied to both lengths after rounding, >= 1.

    Returns:
        DataFrame with `REQUEST_COLUMNS` (request_id 0..n-1, arrival_s float64 seconds from 0.0 upward,
        prompt_tokens and output_tokens int64, hash_ids `[]`). `df.attrs`: `source` ("synthetic"),
        `num_floored_prompt`, `num_floored_output` (values raised to `min_tokens`).

    Raises:
        TypeError: if `rng` is not a `np.random.Generator`, or a numeric argument is not a number.
        ValueError: if an argument is out of range (the message names it, its value and the expected range).
    """
    check_int("num_requests", num_requests, 1)
    check_positive("rate_per_s", rate_per_s)
    check_positive("prompt_tokens_mean", prompt_tokens_mean)
    check_positive("output_tokens_mean", output_tokens_mean)
    check_non_negative("prompt_tokens_cv", prompt_tokens_cv)
    check_non_negative("output_tokens_cv", output_tokens_cv)
    check_int("min_tokens", min_tokens, 1)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")

    gaps_s = rng.exponential(1.0 / rate_per_s, size=num_requests - 1)
    arrival_s = np.concatenate(([0.0], np.cumsum(gaps_s)))
    prompt_raw = _lognormal_counts(rng, prompt_tokens_mean, prompt_tokens_cv, num_requests)
    output_raw = _lognormal_counts(rng, output_tokens_mean, output_tokens_cv, num_requests)
    df = pd.DataFrame(
        {
            "request_id": np.arange(num_requests, dtype=np.int64),
            "arrival_s": arrival_s.astype(np.float64),
            "prompt_tokens": np.maximum(prompt_raw, min_tokens),
            "output_tokens": np.maximum(output_raw, min_tokens),
            "hash_ids": pd.Series([[] for _ in range(num_requests)], dtype=object),
        },
        columns=REQUEST_COLUMNS,
    )
    df.attrs["source"] = "synthetic"
    df.attrs["num_floored_prompt"] = int(np.count_nonzero(prompt_raw < min_tokens))
    df.attrs["num_floored_output"] = int(np.count_nonzero(output_raw < min_tokens))
    return df


def _lognormal_counts(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    """int64 [size]: lognormal draws with the given mean and cv, rounded to the nearest integer (no floor)."""
    if cv == 0:
        return np.full(size, round(mean), dtype=np.int64)
    sigma2 = math.log1p(cv * cv)
    values = rng.lognormal(mean=math.log(mean) - sigma2 / 2, sigma=math.sqrt(sigma2), size=size)
    return np.rint(values).astype(np.int64)
