"""shape_sessions: first sessions (or repeats), prompt filter and think-time cap, every change counted."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from traces import shape_sessions


@pytest.fixture
def sessions() -> pd.DataFrame:
    """Two sessions: a (3 requests), b (2 requests)."""
    return pd.DataFrame(
        {
            "request_id": np.arange(5, dtype=np.int64),
            "arrival_s": [0.0, 10.0, 20.0, 0.0, 5.0],
            "prompt_tokens": np.array([1000, 50000, 2000, 3000, 4000], dtype=np.int64),
            "output_tokens": np.array([10, 20, 30, 40, 50], dtype=np.int64),
            "hash_ids": pd.Series([[] for _ in range(5)], dtype=object),
            "session_id": ["a", "a", "a", "b", "b"],
            "turn": np.array([0, 1, 2, 0, 1], dtype=np.int64),
            "think_time_s": [0.0, 500.0, 3.0, 0.0, 7000.0],
        }
    )


def test_max_sessions_keeps_the_first_sessions(sessions):
    out = shape_sessions(sessions, max_sessions=1)
    assert out["session_id"].tolist() == ["a"] * 3
    assert out.attrs["num_dropped_sessions"] == 2


def test_max_sessions_above_the_trace_replays_sessions_in_order(sessions):
    out = shape_sessions(sessions, max_sessions=3)
    assert out["session_id"].tolist() == ["a", "a", "a", "b", "b", "a#2", "a#2", "a#2"]
    assert out["request_id"].tolist() == list(range(8))
    assert out.attrs["num_repeated_sessions"] == 1


def test_prompt_filter_drops_requests_inside_sessions(sessions):
    out = shape_sessions(sessions, max_prompt_tokens=10000)
    assert out["prompt_tokens"].tolist() == [1000, 2000, 3000, 4000]
    assert out["turn"].tolist() == [0, 2, 0, 1]  # source turns are kept
    assert out["request_id"].tolist() == [0, 1, 2, 3]
    assert out.attrs["num_dropped_prompt_filter"] == 1


def test_think_times_are_capped_and_counted(sessions):
    out = shape_sessions(sessions, max_think_time_s=60.0)
    assert out["think_time_s"].tolist() == [0.0, 60.0, 3.0, 0.0, 60.0]
    assert out.attrs["num_think_capped"] == 2
    assert sessions["think_time_s"].tolist()[1] == 500.0  # the input is not modified


def test_filter_removing_every_request_raises(sessions):
    with pytest.raises(ValueError, match="removed every row"):
        shape_sessions(sessions, min_prompt_tokens=100000)


def test_open_loop_table_is_rejected(make_requests):
    with pytest.raises(ValueError, match="not a session table"):
        shape_sessions(make_requests([0.0, 1.0]))
