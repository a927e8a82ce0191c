"""read_burstgpt: columns as published, failed (zero-response) requests counted and flagged, never dropped."""

from __future__ import annotations

import re

import pytest

from traces import TraceError, load_trace, read_burstgpt, trace_notes

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def test_fixture_parses_with_model_and_log_type(write_trace):
    path = write_trace(
        [HEADER, "5,ChatGPT,472,18,490,Conversation log", "45,GPT-4,1087,230,1317,API log"], name="b.csv"
    )
    df = read_burstgpt(path)
    assert df["arrival_s"].tolist() == [5.0, 45.0]
    assert df["prompt_tokens"].tolist() == [472, 1087]
    assert df["output_tokens"].tolist() == [18, 230]
    assert df["model"].tolist() == ["ChatGPT", "GPT-4"]
    assert df["log_type"].tolist() == ["Conversation log", "API log"]
    assert "session_id" not in df.columns
    assert df.attrs["num_failed"] == 0


def test_zero_response_rows_are_kept_flagged_and_counted(write_trace):
    path = write_trace([HEADER, "5,ChatGPT,472,0,472,Conversation log", "6,ChatGPT,10,3,13,API log"], name="b.csv")
    df = read_burstgpt(path)
    assert len(df) == 2
    assert df["failed"].tolist() == [True, False]
    assert df.attrs["num_failed"] == 1
    assert any("1 failed requests" in note for note in trace_notes(df))


def test_zero_request_token_rows_are_skipped_and_counted(write_trace):
    path = write_trace([HEADER, "5,ChatGPT,0,20,20,API log", "6,ChatGPT,10,3,13,API log"], name="b.csv")
    df = read_burstgpt(path)
    assert df["prompt_tokens"].tolist() == [10]
    assert df.attrs["num_skipped_zero_prompt"] == 1


def test_burstgpt_3_session_column_is_kept(write_trace):
    header = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"
    path = write_trace([header, "1,abc-1,0.5,ChatGPT,10,3,13,Conversation log"], name="b3.csv")
    assert read_burstgpt(path)["session_id"].tolist() == ["abc-1"]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("x,ChatGPT,10,3,13,API log", "Timestamp"),
        ("1,ChatGPT,-10,3,13,API log", "Request tokens"),
        ("1,ChatGPT,10,three,13,API log", "Response tokens"),
    ],
)
def test_malformed_row_error_names_file_line_and_field(write_trace, row, field):
    path = write_trace([HEADER, "0,ChatGPT,10,3,13,API log", row], name="b.csv")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 3: field '{field}': "):
        read_burstgpt(path)


def test_auto_format_recognises_the_burstgpt_header(write_trace):
    path = write_trace([HEADER, "0,ChatGPT,10,3,13,API log"], name="BurstGPT_1.csv")
    assert load_trace(str(path)).attrs["format"] == "burstgpt"
