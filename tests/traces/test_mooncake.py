"""read_mooncake: parsing, validation messages (file, line, field), sorting and metadata."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from traces import REQUEST_COLUMNS, TraceError, read_mooncake
from traces.registry import DATA_DIR

GOOD_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}'


def test_fixture_file_parses_into_request_columns_and_dtypes(write_trace):
    path = write_trace(
        [
            '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}',
            '{"timestamp": 1500, "input_length": 20, "output_length": 0, "hash_ids": [0, 3]}',
            '{"timestamp": 3000.5, "input_length": 1, "output_length": 7, "hash_ids": []}',
        ]
    )
    df = read_mooncake(path)
    assert list(df.columns) == REQUEST_COLUMNS
    assert [str(t) for t in df.dtypes[:4]] == ["int64", "float64", "int64", "int64"]
    assert df["request_id"].tolist() == [0, 1, 2]
    assert df["arrival_s"].tolist() == [0.0, 1.5, 3.0005]
    assert df["prompt_tokens"].tolist() == [6758, 20, 1]
    assert df["output_tokens"].tolist() == [500, 0, 7]
    assert df["hash_ids"].tolist() == [[0, 1, 2], [0, 3], []]


def test_missing_hash_ids_become_empty_lists(write_trace):
    path = write_trace(['{"timestamp": 0, "input_length": 5, "output_length": 1}'])
    assert read_mooncake(path)["hash_ids"].tolist() == [[]]


def test_integral_float_token_counts_are_accepted_as_int(write_trace):
    path = write_trace(['{"timestamp": 0, "input_length": 12.0, "output_length": 3.0}'])
    df = read_mooncake(path)
    assert df["prompt_tokens"].tolist() == [12]
    assert df["output_tokens"].tolist() == [3]


def test_unknown_keys_are_ignored(write_trace):
    path = write_trace(['{"timestamp": 0, "input_length": 5, "output_length": 1, "session_id": "a"}'])
    assert list(read_mooncake(path).columns) == REQUEST_COLUMNS


def test_crlf_line_endings_parse(write_trace):
    path = write_trace([GOOD_LINE, GOOD_LINE], newline="\r\n")
    assert len(read_mooncake(path)) == 2


def test_blank_lines_are_skipped_and_counted(write_trace):
    path = write_trace([GOOD_LINE, "", "   ", GOOD_LINE])
    df = read_mooncake(path)
    assert len(df) == 2
    assert df.attrs["num_blank_lines"] == 2


def test_attrs_record_source_path(write_trace):
    path = write_trace([GOOD_LINE])
    df = read_mooncake(path)
    assert df.attrs["source"] == str(path)
    assert df.attrs["num_resorted"] == 0


def test_unsorted_timestamps_are_sorted_stably_and_counted(write_trace):
    path = write_trace(
        [
            '{"timestamp": 3000, "input_length": 1, "output_length": 0}',
            '{"timestamp": 1000, "input_length": 2, "output_length": 0}',
            '{"timestamp": 5000, "input_length": 3, "output_length": 0}',
            '{"timestamp": 1000, "input_length": 4, "output_length": 0}',
            '{"timestamp": 6000, "input_length": 5, "output_length": 0}',
        ]
    )
    df = read_mooncake(path)
    assert df["arrival_s"].tolist() == [1.0, 1.0, 3.0, 5.0, 6.0]
    assert df["prompt_tokens"].tolist() == [2, 4, 1, 3, 5]  # ties keep file order
    assert df["request_id"].tolist() == [1, 3, 0, 2, 4]  # request_id is the file position
    assert df.index.tolist() == [0, 1, 2, 3, 4]
    assert df.attrs["num_resorted"] == 2


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ('{"input_length": 5, "output_length": 1}', "timestamp"),
        ('{"timestamp": 0, "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": 5}', "output_length"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 1}', "timestamp"),
        ('{"timestamp": "0", "input_length": 5, "output_length": 1}', "timestamp"),
        ('{"timestamp": true, "input_length": 5, "output_length": 1}', "timestamp"),
        ('{"timestamp": NaN, "input_length": 5, "output_length": 1}', "timestamp"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": -5, "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": "12", "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": 3.5, "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": true, "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": null, "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": 5, "output_length": -1}', "output_length"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 2.5}', "output_length"),
        ('{"timestamp": 0, "input_length": 5, "output_length": false}', "output_length"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "abc"}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1.0]}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [true]}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": null}', "hash_ids"),
    ],
)
def test_malformed_row_error_names_file_line_and_field(write_trace, row, field):
    path = write_trace([GOOD_LINE, "", row])  # the blank line still counts: the bad row is line 3
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 3: field '{field}': ") as info:
        read_mooncake(path)
    assert "\n" not in str(info.value)


def test_negative_input_length_message_gives_value_and_expectation(write_trace):
    path = write_trace(['{"timestamp": 0, "input_length": -5, "output_length": 1}'])
    with pytest.raises(TraceError) as info:
        read_mooncake(path)
    assert str(info.value) == f"{path} line 1: field 'input_length': expected an integer >= 1, got -5"


def test_invalid_json_error_names_file_and_line(write_trace):
    path = write_trace([GOOD_LINE, '{"timestamp": 0,'])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 2: invalid JSON"):
        read_mooncake(path)


def test_non_object_line_error_names_file_and_line(write_trace):
    path = write_trace([GOOD_LINE, GOOD_LINE, "[1, 2]"])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 3: expected a JSON object, got list"):
        read_mooncake(path)


def test_invalid_utf8_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD_LINE.encode() + b'\n{"timestamp": 0, "x": "\xff"}\n')
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 2: invalid JSON"):
        read_mooncake(path)


def test_long_offending_value_is_shortened_in_message(write_trace):
    ids = ", ".join(["1"] * 200)
    path = write_trace([f'{{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [{ids}, "x"]}}'])
    with pytest.raises(TraceError) as info:
        read_mooncake(path)
    assert len(str(info.value)) < 200
    assert str(info.value).endswith("...")


def test_empty_file_raises(write_trace, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}: no requests"):
        read_mooncake(path)


def test_file_of_blank_lines_raises(write_trace):
    path = write_trace(["", "  "])
    with pytest.raises(TraceError, match="no requests"):
        read_mooncake(path)


def test_missing_file_error_names_path(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}: no such trace file$"):
        read_mooncake(path)


def test_directory_path_raises_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace file"):
        read_mooncake(tmp_path)


def test_trace_error_is_a_value_error():
    assert issubclass(TraceError, ValueError)


def test_shipped_file_loads_whole_and_sorted():  # no timing assertion: no test may depend on machine load
    df = read_mooncake(Path(DATA_DIR / "mooncake_conversation.jsonl"))
    assert len(df) == 5719
    assert np.all(np.diff(df["arrival_s"].to_numpy()) >= 0)
