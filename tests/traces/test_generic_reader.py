"""read_csv_trace / read_jsonl_trace with a column mapping, and load_trace's generic formats."""

from __future__ import annotations

import re

import pytest

from traces import ColumnMap, TraceError, load_trace, read_csv_trace, read_jsonl_trace


@pytest.mark.parametrize(
    ("unit", "raw", "expected_s"), [("s", "1.5", 1.5), ("ms", "1500", 1.5), ("us", "1500000", 1.5)]
)
def test_numeric_arrival_units_convert_to_seconds(write_trace, unit, raw, expected_s):
    path = write_trace(["t,p,o", "0,10,2", f"{raw},20,3"], name="g.csv")
    df = read_csv_trace(path, ColumnMap(arrival="t", arrival_unit=unit, prompt_tokens="p", output_tokens="o"))
    assert df["arrival_s"].tolist() == [0.0, expected_s]
    assert df["prompt_tokens"].tolist() == [10, 20]


def test_datetime_arrivals_count_from_the_earliest_row(write_trace):
    path = write_trace(["when,in,out", "2024-01-01T00:00:10Z,5,1", "2024-01-01T00:00:00Z,5,1"], name="g.csv")
    df = read_csv_trace(path, ColumnMap("when", "in", "out", arrival_unit="datetime"))
    assert df["arrival_s"].tolist() == [0.0, 10.0]
    assert df.attrs["num_resorted"] == 1
    assert df.attrs["clock_origin"] == "2024-01-01 00:00:00+00:00"


def test_other_columns_are_ignored_and_quoted_fields_read(write_trace):
    path = write_trace(["id,t,note,p,o", '7,0,"a, b",10,2'], name="g.csv")
    df = read_csv_trace(path, ColumnMap("t", "p", "o"))
    assert df["prompt_tokens"].tolist() == [10]


def test_jsonl_reader_maps_keys_and_accepts_numeric_strings(write_trace):
    path = write_trace(['{"ts": "2000", "in": 10, "out": 0}', "", '{"ts": 1000, "in": 20.0, "out": 3}'])
    df = read_jsonl_trace(path, ColumnMap("ts", "in", "out", arrival_unit="ms"))
    assert df["arrival_s"].tolist() == [1.0, 2.0]
    assert df["prompt_tokens"].tolist() == [20, 10]
    assert df["output_tokens"].tolist() == [3, 0]
    assert df.attrs["num_blank_lines"] == 1


def test_jsonl_missing_key_names_file_line_and_field(write_trace):
    path = write_trace(['{"ts": 0, "in": 10, "out": 1}', '{"ts": 1, "out": 1}'])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 2: field 'in': missing; keys present"):
        read_jsonl_trace(path, ColumnMap("ts", "in", "out"))


@pytest.mark.parametrize(
    ("row", "field"),
    [("x,10,1", "t"), ("-1,10,1", "t"), ("nan,10,1", "t"), ("1,-10,1", "p"), ("1,10,-1", "o"), ("1,10,true", "o")],
)
def test_csv_malformed_row_error_names_file_line_and_field(write_trace, row, field):
    path = write_trace(["t,p,o", "0,1,1", row], name="g.csv")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 3: field '{field}': "):
        read_csv_trace(path, ColumnMap("t", "p", "o"))


def test_column_map_rejects_an_unknown_unit():
    with pytest.raises(ValueError, match="arrival_unit must be one of s, ms, us, datetime, got 'h'"):
        ColumnMap("t", "p", "o", arrival_unit="h")


def test_load_trace_with_columns_picks_the_generic_reader_by_extension(write_trace):
    path = write_trace(["t,p,o", "0,10,2"], name="g.csv")
    df = load_trace(str(path), columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"})
    assert df.attrs["format"] == "csv"


def test_load_trace_generic_format_without_columns_raises(write_trace):
    path = write_trace(["t,p,o", "0,10,2"], name="g.csv")
    with pytest.raises(TraceError, match="format csv needs a column mapping"):
        load_trace(str(path), fmt="csv")


def test_load_trace_rejects_a_mapping_with_unknown_keys(write_trace):
    path = write_trace(["t,p,o", "0,10,2"], name="g.csv")
    with pytest.raises(TraceError, match=r"column mapping: unknown keys \['prompt'\]"):
        load_trace(str(path), columns={"arrival": "t", "prompt": "p", "output_tokens": "o"})


def test_load_trace_rejects_columns_with_a_specific_format(write_trace):
    path = write_trace(["t,p,o", "0,10,2"], name="g.csv")
    with pytest.raises(TraceError, match="applies to the generic formats csv and jsonl"):
        load_trace(str(path), fmt="azure", columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"})


def test_unknown_csv_header_says_how_to_choose_a_format(write_trace):
    path = write_trace(["a,b,c", "0,10,2"], name="g.csv")
    with pytest.raises(TraceError, match="cannot tell the CSV format from its header"):
        load_trace(str(path))
