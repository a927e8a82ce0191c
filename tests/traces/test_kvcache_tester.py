"""read_kvcache_tester: agentic sessions flattened (sub-agents in time order), session columns, located errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from traces import SESSION_COLUMNS, TraceError, is_session_table, load_trace, read_kvcache_tester, trace_stats


def _req(t: float, n_in: int, n_out: int, think: float, **extra) -> dict:
    return {"t": t, "type": "n", "in": n_in, "out": n_out, "think_time": think, "hash_ids": [1, 2], **extra}


def _write(folder: Path, name: str, requests: list, indent: int | None = None, **top) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"id": path.stem, "block_size": 64, **top, "requests": requests}, indent=indent))
    return path


SUBAGENT = {
    "t": 15.5,
    "type": "subagent",
    "agent_id": "agent_001",
    "requests": [_req(0.0, 900, 40, 0.0), _req(10.0, 1100, 50, 2.0)],
}


def test_sessions_are_flattened_in_time_order_with_turns(tmp_path):
    _write(tmp_path / "s", "trace_0001.json", [_req(0.0, 1000, 10, 0.0), _req(20.0, 1500, 20, 5.0), SUBAGENT])
    _write(tmp_path / "s", "trace_0002.json", [_req(0.0, 3000, 30, 0.0)])
    df = read_kvcache_tester(tmp_path / "s")
    assert is_session_table(df)
    assert all(c in df.columns for c in SESSION_COLUMNS)
    assert df["session_id"].tolist() == ["trace_0001"] * 4 + ["trace_0002"]
    assert df["turn"].tolist() == [0, 1, 2, 3, 0]
    assert df["arrival_s"].tolist() == [0.0, 15.5, 20.0, 25.5, 0.0]  # sub-agent t + its own t
    assert df["prompt_tokens"].tolist() == [1000, 900, 1500, 1100, 3000]
    assert df["think_time_s"].tolist() == [0.0, 0.0, 5.0, 2.0, 0.0]
    assert df["agent_id"].tolist() == ["", "agent_001", "", "agent_001", ""]
    assert df["request_id"].tolist() == [0, 1, 2, 3, 4]
    assert df["hash_ids"].iloc[0] == [1, 2]
    assert df.attrs["clock"] == "per_session"
    assert df.attrs["num_sessions"] == 2
    assert df.attrs["num_subagent_requests"] == 2
    assert df.attrs["num_resorted"] == 1  # the sub-agent's second request moved past the main agent's at 20 s


def test_session_stats_have_no_span_or_rate(tmp_path):
    _write(tmp_path / "s", "a.json", [_req(0.0, 1000, 10, 0.0), _req(60.0, 40000, 20, 5.0)])
    stats = trace_stats(read_kvcache_tester(tmp_path / "s"))
    assert stats["span_s"] != stats["span_s"]  # NaN
    assert stats["rate_per_s"] != stats["rate_per_s"]
    assert stats["num_sessions"] == 1
    assert stats["session_span_s_p50"] == 60.0
    assert stats["share_prompt_over_32k"] == 0.5


def test_a_single_session_file_can_be_read(tmp_path):
    path = _write(tmp_path, "one.json", [_req(0.0, 1000, 0, 0.0)])
    df = load_trace(str(path))
    assert df.attrs["format"] == "kvcache_tester"
    assert df["output_tokens"].tolist() == [0]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"t": 1.0, "type": "n", "out": 1, "think_time": 0}, "in"),
        (_req(1.0, -5, 1, 0.0), "in"),
        (_req(1.0, 5, 1.5, 0.0), "out"),
        (_req(1.0, 5, 1, -2.0), "think_time"),
        (_req(-1.0, 5, 1, 0.0), "t"),
        (_req(1.0, 5, 1, 0.0, hash_ids="abc"), "hash_ids"),
    ],
)
def test_malformed_request_error_names_file_line_location_and_field(tmp_path, bad, field):
    path = _write(tmp_path, "s.json", [_req(0.0, 5, 1, 0.0), bad])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 1, requests\[1\]: field '{field}': "):
        read_kvcache_tester(path)


def test_nested_error_in_pretty_printed_file_gives_the_request_line(tmp_path):
    sub = {**SUBAGENT, "requests": [_req(0.0, 900, 40, 0.0), _req(10.0, 0, 50, 2.0)]}
    path = _write(tmp_path, "s.json", [_req(0.0, 5, 1, 0.0), sub], indent=1)
    lines = path.read_text().splitlines()
    with pytest.raises(TraceError) as info:
        read_kvcache_tester(path)
    message = str(info.value)
    match = re.match(rf"^{re.escape(str(path))} line (\d+), requests\[1\]\.requests\[1\]: field 'in': ", message)
    assert match, message
    assert lines[int(match.group(1)) - 1].strip() == "{"  # the line where that request object opens
    assert lines[int(match.group(1))].strip() == '"t": 10.0,'


def test_invalid_json_names_file_and_line(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"id": "x",\n "requests": [}\n')
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))} line 2: invalid JSON"):
        read_kvcache_tester(path)


def test_session_without_requests_list_raises(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"id": "x"}')
    with pytest.raises(TraceError, match="expected a session object with a 'requests' list"):
        read_kvcache_tester(path)


def test_subagent_without_requests_list_names_the_field(tmp_path):
    path = _write(tmp_path, "s.json", [{"t": 1.0, "type": "subagent", "agent_id": "a"}])
    with pytest.raises(TraceError, match=r"line 1, requests\[0\]: field 'requests': missing"):
        read_kvcache_tester(path)


def test_folder_without_session_files_raises(tmp_path):
    with pytest.raises(TraceError, match=r"no \*\.json session files"):
        read_kvcache_tester(tmp_path)


def test_repeated_session_id_raises(tmp_path):
    _write(tmp_path / "s", "a.json", [_req(0.0, 5, 1, 0.0)], id="same")
    _write(tmp_path / "s", "b.json", [_req(0.0, 5, 1, 0.0)], id="same")
    with pytest.raises(TraceError, match="session id 'same' repeats"):
        read_kvcache_tester(tmp_path / "s")
