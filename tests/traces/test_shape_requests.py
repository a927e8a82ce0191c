"""shape_requests: window, prompt filter, max rows, rebase, time scaling, metadata and errors."""

from __future__ import annotations

import re

import pytest

from traces import REQUEST_COLUMNS, load_trace, shape_requests


def test_window_is_relative_to_first_arrival_and_end_exclusive(make_requests):
    df = make_requests([10.0, 11.0, 12.0, 13.0, 14.0], prompt_tokens=[1, 2, 3, 4, 5])
    out = shape_requests(df, start_s=1.0, end_s=3.0)
    assert out["prompt_tokens"].tolist() == [2, 3]
    assert out.attrs["num_dropped_window"] == 3


def test_arrivals_are_rebased_to_start_at_zero(make_requests):
    out = shape_requests(make_requests([10.0, 11.5, 14.0]), start_s=1.0)
    assert out["arrival_s"].tolist() == [0.0, 2.5]
    assert out.attrs["arrival_offset_s"] == 11.5


def test_request_ids_are_renumbered_from_zero(make_requests):
    out = shape_requests(make_requests([0.0, 1.0, 2.0, 3.0]), start_s=2.0)
    assert out["request_id"].tolist() == [0, 1]
    assert out.index.tolist() == [0, 1]


def test_prompt_filter_bounds_are_inclusive(make_requests):
    df = make_requests([0.0, 1.0, 2.0, 3.0], prompt_tokens=[99, 100, 200, 201])
    out = shape_requests(df, min_prompt_tokens=100, max_prompt_tokens=200)
    assert out["prompt_tokens"].tolist() == [100, 200]
    assert out.attrs["num_dropped_prompt_filter"] == 2


def test_max_requests_keeps_the_earliest_rows(make_requests):
    out = shape_requests(make_requests([0.0, 1.0, 2.0, 3.0], prompt_tokens=[1, 2, 3, 4]), max_requests=2)
    assert out["prompt_tokens"].tolist() == [1, 2]
    assert out.attrs["num_dropped_max_requests"] == 2


def test_max_requests_applies_after_window_and_prompt_filter(make_requests):
    df = make_requests([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], prompt_tokens=[9, 9, 9, 1, 9, 9])
    out = shape_requests(df, start_s=2.0, min_prompt_tokens=5, max_requests=2)
    assert out["arrival_s"].tolist() == [0.0, 2.0]  # input rows at 2 s and 4 s
    assert out.attrs["num_dropped_window"] == 2
    assert out.attrs["num_dropped_prompt_filter"] == 1
    assert out.attrs["num_dropped_max_requests"] == 1


def test_time_scale_above_one_stretches_arrivals(make_requests):
    out = shape_requests(make_requests([5.0, 6.0, 8.0]), time_scale=2.0)
    assert out["arrival_s"].tolist() == [0.0, 2.0, 6.0]
    assert out.attrs["time_scale_applied"] == 2.0


def test_target_rate_sets_n_minus_one_over_span(make_requests):
    out = shape_requests(make_requests([0.0, 1.0, 3.0, 4.0, 8.0]), target_rate_per_s=2.0)
    assert out["arrival_s"].iloc[-1] == pytest.approx(2.0)  # 4 gaps at 2 req/s
    assert out.attrs["time_scale_applied"] == pytest.approx(0.25)


def test_no_options_keeps_every_row_and_records_zero_drops(make_requests):
    out = shape_requests(make_requests([3.0, 4.0]))
    assert out["arrival_s"].tolist() == [0.0, 1.0]
    assert out.attrs["num_input_rows"] == 2
    assert out.attrs["num_dropped_window"] == 0
    assert out.attrs["num_dropped_prompt_filter"] == 0
    assert out.attrs["num_dropped_max_requests"] == 0
    assert out.attrs["time_scale_applied"] == 1.0


def test_input_table_is_not_modified(make_requests):
    df = make_requests([3.0, 4.0, 5.0])
    before = df.copy()
    shape_requests(df, start_s=1.0, time_scale=3.0)
    assert df.equals(before)


def test_input_attrs_are_kept(make_requests):
    df = make_requests([0.0, 1.0])
    df.attrs["source"] = "x.jsonl"
    assert shape_requests(df).attrs["source"] == "x.jsonl"


def test_shipped_trace_shaped_to_a_window_and_rate():
    out = shape_requests(load_trace("mooncake_conversation"), start_s=300.0, end_s=900.0, target_rate_per_s=10.0)
    assert list(out.columns) == REQUEST_COLUMNS
    assert (len(out) - 1) / out["arrival_s"].iloc[-1] == pytest.approx(10.0)
    assert out.attrs["num_dropped_window"] + len(out) == 5719


def test_both_time_scale_and_target_rate_raise(make_requests):
    with pytest.raises(ValueError, match="either time_scale or target_rate_per_s, not both"):
        shape_requests(make_requests([0.0, 1.0]), time_scale=2.0, target_rate_per_s=1.0)


def test_target_rate_with_zero_span_raises(make_requests):
    with pytest.raises(ValueError, match=r"target_rate_per_s=1.0 needs rows spread over a span > 0 s"):
        shape_requests(make_requests([4.0, 4.0]), target_rate_per_s=1.0)


def test_window_removing_every_row_names_start_and_end(make_requests):
    with pytest.raises(ValueError, match=r"^start_s=50.0, end_s=60.0 removed every row"):
        shape_requests(make_requests([0.0, 1.0]), start_s=50.0, end_s=60.0)


def test_prompt_filter_removing_every_row_names_the_bounds(make_requests):
    with pytest.raises(ValueError, match=r"^min_prompt_tokens=1000, max_prompt_tokens=None removed every row"):
        shape_requests(make_requests([0.0, 1.0]), min_prompt_tokens=1000)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"time_scale": -1.0}, "time_scale must be > 0, got -1.0"),
        ({"time_scale": 0}, "time_scale must be > 0, got 0"),
        ({"target_rate_per_s": 0.0}, "target_rate_per_s must be > 0, got 0.0"),
        ({"start_s": -1.0}, "start_s must be >= 0, got -1.0"),
        ({"end_s": 0.0}, "end_s must be > 0, got 0.0"),
        ({"start_s": 5.0, "end_s": 5.0}, "end_s must be > start_s, got end_s=5.0, start_s=5.0"),
        ({"max_requests": 0}, "max_requests must be >= 1, got 0"),
        ({"min_prompt_tokens": 0}, "min_prompt_tokens must be >= 1, got 0"),
        ({"min_prompt_tokens": 10, "max_prompt_tokens": 5}, "max_prompt_tokens must be >= 10, got 5"),
    ],
)
def test_out_of_range_option_raises_value_error_naming_it(make_requests, options, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        shape_requests(make_requests([0.0, 1.0]), **options)


def test_non_integer_max_requests_raises_type_error(make_requests):
    with pytest.raises(TypeError, match="^max_requests must be an integer, got 2.5$"):
        shape_requests(make_requests([0.0, 1.0]), max_requests=2.5)


def test_unsorted_input_raises(make_requests):
    with pytest.raises(ValueError, match="arrival_s must be sorted ascending"):
        shape_requests(make_requests([1.0, 0.0]))


def test_empty_input_raises(make_requests):
    with pytest.raises(ValueError, match="df has no rows"):
        shape_requests(make_requests([]))


def test_missing_column_raises(make_requests):
    with pytest.raises(ValueError, match=r"missing request columns \['hash_ids'\]"):
        shape_requests(make_requests([0.0]).drop(columns="hash_ids"))
