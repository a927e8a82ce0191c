"""read_ragpulse: string timestamps, hash_ids objects kept aside, weeks with their own clocks never mixed."""

from __future__ import annotations

import json
import re

import pytest

from traces import TraceError, load_trace, read_ragpulse

IDS = {"sys_prompt": [8302], "passages_ids": [7398, 7370], "history": [], "web_search": [], "user_input": [26923]}


def _line(timestamp: str | float, input_length: int = 3000, output_length: int = 200, **extra) -> str:
    row = {"timestamp": timestamp, "input_length": input_length, "output_length": output_length, "hash_ids": IDS}
    row.update({"session_id": "1757476916095-a"}, **extra)
    return json.dumps(row)


def test_fixture_parses_with_week_session_and_rag_ids(write_trace):
    df = read_ragpulse(write_trace([_line("82"), _line("93", 3167, 86)]))
    assert df["arrival_s"].tolist() == [82.0, 93.0]
    assert df["prompt_tokens"].tolist() == [3000, 3167]
    assert df["output_tokens"].tolist() == [200, 86]
    assert df["week"].tolist() == [1, 1]
    assert df["session_id"].tolist() == ["1757476916095-a"] * 2
    assert df["rag_hash_ids"].iloc[0] == IDS
    assert df["hash_ids"].tolist() == [[], []]  # RAGPulse ids point into lookup tables, not prefix blocks
    assert df.attrs["num_weeks"] == 1


def test_small_step_back_is_an_unsorted_row_sorted_and_counted(write_trace):
    df = read_ragpulse(write_trace([_line("100"), _line("50"), _line("200")]))
    assert df["arrival_s"].tolist() == [50.0, 100.0, 200.0]
    assert df.attrs["num_resorted"] == 1
    assert df.attrs["num_weeks"] == 1


def test_two_weeks_without_a_week_choice_raise_naming_the_reset_line(write_trace):
    path = write_trace([_line("10"), _line("604000"), _line("0"), _line("5")])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 3: field 'timestamp': the clock starts again"):
        read_ragpulse(path)


def test_one_week_of_two_is_read_on_its_own_clock(write_trace):
    path = write_trace([_line("10"), _line("604000"), _line("0", 1111), _line("5", 2222)])
    df = read_ragpulse(path, week=2)
    assert df["arrival_s"].tolist() == [0.0, 5.0]
    assert df["prompt_tokens"].tolist() == [1111, 2222]
    assert df["week"].tolist() == [2, 2]
    assert df.attrs["week_first_lines"] == [1, 3]
    assert load_trace(str(path), week=1)["arrival_s"].tolist() == [10.0, 604000.0]


def test_week_outside_the_file_raises(write_trace):
    with pytest.raises(TraceError, match=r"week must be an integer in \[1, 1\]"):
        read_ragpulse(write_trace([_line("10")]), week=2)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (_line("soon"), "timestamp"),
        (_line("-1"), "timestamp"),
        (_line("5", -3), "input_length"),
        (_line("5", 100, "many"), "output_length"),
        (_line("5", hash_ids=[1, 2]), "hash_ids"),
        (_line("5", session_id=12), "session_id"),
        ('{"timestamp": "5", "output_length": 1}', "input_length"),
    ],
)
def test_malformed_row_error_names_file_line_and_field(write_trace, line, field):
    path = write_trace([_line("1"), line])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 2: field '{field}': "):
        read_ragpulse(path)


def test_auto_format_tells_ragpulse_from_mooncake(write_trace):
    assert load_trace(str(write_trace([_line("1")]))).attrs["format"] == "ragpulse"
