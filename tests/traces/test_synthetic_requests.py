"""synthetic_requests: determinism, distribution moments, flooring and argument checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from traces import REQUEST_COLUMNS, synthetic_requests

BASE = dict(num_requests=4000, rate_per_s=5.0, prompt_tokens_mean=2000.0, output_tokens_mean=300.0)


def _generate(seed: int, **overrides) -> pd.DataFrame:
    return synthetic_requests(rng=np.random.default_rng(seed), **{**BASE, **overrides})


def test_same_seed_gives_identical_tables():
    pd.testing.assert_frame_equal(_generate(7), _generate(7))


def test_different_seeds_give_different_tables():
    a, b = _generate(1), _generate(2)
    assert not np.array_equal(a["arrival_s"], b["arrival_s"])
    assert not np.array_equal(a["prompt_tokens"], b["prompt_tokens"])


def test_global_numpy_random_state_is_untouched():
    before = np.random.get_state()[1].copy()
    _generate(0)
    assert np.array_equal(np.random.get_state()[1], before)


def test_columns_and_dtypes_follow_the_schema():
    df = _generate(0, num_requests=5)
    assert list(df.columns) == REQUEST_COLUMNS
    assert [str(t) for t in df.dtypes[:4]] == ["int64", "float64", "int64", "int64"]
    assert df["request_id"].tolist() == [0, 1, 2, 3, 4]
    assert df["hash_ids"].tolist() == [[], [], [], [], []]


def test_first_arrival_is_zero_and_arrivals_are_sorted():
    arrival_s = _generate(0)["arrival_s"].to_numpy()
    assert arrival_s[0] == 0.0
    assert np.all(np.diff(arrival_s) >= 0)


def test_mean_rate_is_within_five_percent():
    df = _generate(3)
    rate_per_s = (len(df) - 1) / df["arrival_s"].iloc[-1]
    assert rate_per_s == pytest.approx(5.0, rel=0.05)


def test_mean_prompt_tokens_are_within_five_percent():
    assert _generate(3)["prompt_tokens"].mean() == pytest.approx(2000.0, rel=0.05)


def test_mean_output_tokens_are_within_five_percent():
    assert _generate(3)["output_tokens"].mean() == pytest.approx(300.0, rel=0.05)


def test_output_tokens_cv_is_within_ten_percent():
    output = _generate(3)["output_tokens"].to_numpy(dtype=np.float64)
    assert output.std() / output.mean() == pytest.approx(0.5, rel=0.10)


def test_zero_cv_gives_constant_lengths():
    df = _generate(0, num_requests=50, prompt_tokens_cv=0.0, output_tokens_cv=0.0)
    assert set(df["prompt_tokens"]) == {2000}
    assert set(df["output_tokens"]) == {300}


def test_lengths_are_floored_at_min_tokens_and_counted():
    df = _generate(0, prompt_tokens_mean=3.0, prompt_tokens_cv=3.0, output_tokens_mean=2.0, min_tokens=2)
    assert df["prompt_tokens"].min() == 2
    assert df["output_tokens"].min() == 2
    assert df.attrs["num_floored_prompt"] > 0
    assert df.attrs["num_floored_output"] > 0


def test_no_flooring_recorded_when_lengths_stay_above_min_tokens():
    df = _generate(0, prompt_tokens_cv=0.1, output_tokens_cv=0.1)
    assert df.attrs["num_floored_prompt"] == 0
    assert df.attrs["num_floored_output"] == 0


def test_single_request_arrives_at_zero():
    df = _generate(0, num_requests=1)
    assert df["arrival_s"].tolist() == [0.0]


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("num_requests", 0, "num_requests must be >= 1, got 0"),
        ("rate_per_s", 0.0, "rate_per_s must be > 0, got 0.0"),
        ("rate_per_s", float("inf"), "rate_per_s must be finite, got inf"),
        ("prompt_tokens_mean", -1.0, "prompt_tokens_mean must be > 0, got -1.0"),
        ("output_tokens_mean", 0, "output_tokens_mean must be > 0, got 0"),
        ("prompt_tokens_cv", -0.5, "prompt_tokens_cv must be >= 0, got -0.5"),
        ("output_tokens_cv", float("nan"), "output_tokens_cv must be finite, got nan"),
        ("min_tokens", 0, "min_tokens must be >= 1, got 0"),
    ],
)
def test_out_of_range_argument_raises_value_error_naming_it(argument, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        _generate(0, **{argument: value})


@pytest.mark.parametrize(
    ("argument", "value"),
    [("num_requests", 10.0), ("num_requests", True), ("rate_per_s", "5"), ("min_tokens", 1.5)],
)
def test_wrong_type_argument_raises_type_error_naming_it(argument, value):
    with pytest.raises(TypeError, match=f"^{argument} must be"):
        _generate(0, **{argument: value})


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="^rng must be a numpy.random.Generator, got int$"):
        synthetic_requests(rng=0, **BASE)
