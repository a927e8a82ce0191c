"""read_azure: Azure LLM inference CSV (wall-clock TIMESTAMP with 7 fractional digits, CRLF), errors and sorting."""

from __future__ import annotations

import re

import pytest

from traces import REQUEST_COLUMNS, TraceError, load_trace, read_azure

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def test_fixture_parses_timestamps_exactly_to_100_ns(write_trace):
    path = write_trace(
        [HEADER, "2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,3180,8"],
        name="azure.csv",
        newline="\r\n",
    )
    df = read_azure(path)
    assert list(df.columns) == REQUEST_COLUMNS
    assert df["arrival_s"].tolist() == [0.0, 0.052]
    assert df["prompt_tokens"].tolist() == [4808, 3180]
    assert df["output_tokens"].tolist() == [10, 8]
    assert df.attrs["clock_origin"] == "2023-11-16 18:17:03.97996"
    assert df.attrs["format"] == "azure"


def test_seventh_fractional_digit_is_kept(write_trace):
    path = write_trace([HEADER, "2023-11-16 18:00:00.0000000,1,1", "2023-11-16 18:00:00.0000001,1,1"], name="a.csv")
    assert read_azure(path)["arrival_s"].tolist() == [0.0, 1e-7]


def test_2024_timestamps_with_utc_offset_parse(write_trace):
    path = write_trace([HEADER, "2024-05-10 00:00:00.123+00:00,10,1", "2024-05-10 00:00:01.123+00:00,10,1"])
    df = read_azure(path)
    assert df["arrival_s"].tolist() == [0.0, 1.0]
    assert df.attrs["clock_origin"] == "2024-05-10 00:00:00.123+00:00"


def test_unsorted_timestamps_are_sorted_and_counted(write_trace):
    path = write_trace([HEADER, "2023-11-16 18:00:02,1,1", "2023-11-16 18:00:00,2,1", "2023-11-16 18:00:03,3,1"])
    df = read_azure(path)
    assert df["prompt_tokens"].tolist() == [2, 1, 3]
    assert df["request_id"].tolist() == [1, 0, 2]
    assert df.attrs["num_resorted"] == 1


def test_zero_generated_tokens_are_allowed(write_trace):
    path = write_trace([HEADER, "2023-11-16 18:00:00,5,0"])
    assert read_azure(path)["output_tokens"].tolist() == [0]


def test_blank_lines_are_skipped_and_counted(write_trace):
    path = write_trace([HEADER, "2023-11-16 18:00:00,5,1", "", "2023-11-16 18:00:01,5,1"], newline="\r\n")
    df = read_azure(path)
    assert len(df) == 2
    assert df.attrs["num_blank_lines"] == 1


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("2023-11-16 18:00:01,-3,1", "ContextTokens"),
        ("2023-11-16 18:00:01,0,1", "ContextTokens"),
        ("2023-11-16 18:00:01,abc,1", "ContextTokens"),
        ("2023-11-16 18:00:01,5,1.5", "GeneratedTokens"),
        ("2023-11-16 18:00:01,5,", "GeneratedTokens"),
        ("16/11/2023 18:00:01,5,1", "TIMESTAMP"),
        ("2023-13-16 18:00:01,5,1", "TIMESTAMP"),
        ("2023-11-16 18:00:01+00:00,5,1", "TIMESTAMP"),  # offset where the rows above have none
    ],
)
def test_malformed_row_error_names_file_line_and_field(write_trace, row, field):
    path = write_trace([HEADER, "2023-11-16 18:00:00,5,1", row], name="azure.csv", newline="\r\n")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 3: field '{field}': "):
        read_azure(path)


def test_wrong_field_count_names_file_and_line(write_trace):
    path = write_trace([HEADER, "2023-11-16 18:00:00,5"], name="azure.csv")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 2: expected 3 fields .*got 2"):
        read_azure(path)


def test_missing_column_names_the_column_and_the_header(write_trace):
    path = write_trace(["TIMESTAMP,ContextTokens", "2023-11-16 18:00:00,5"], name="azure.csv")
    with pytest.raises(TraceError, match=r"line 1: column 'GeneratedTokens' missing from the header"):
        read_azure(path)


def test_header_only_file_has_no_requests(write_trace):
    with pytest.raises(TraceError, match="no requests"):
        read_azure(write_trace([HEADER], name="azure.csv"))


def test_auto_format_recognises_the_azure_header(write_trace):
    path = write_trace([HEADER, "2023-11-16 18:00:00,5,1"], name="mine.csv")
    assert load_trace(str(path)).attrs["format"] == "azure"
