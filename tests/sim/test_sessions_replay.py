"""Closed-loop session replay (sim/serving/sessions.py): issue times follow finishes plus think times, session starts
follow the seeded arrival process, the concurrency cap holds, and open-loop keys are refused for sessions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from plots.tables import read_table
from pulseinfer.tables_io import write_result
from sim.config import ScenarioError, load_scenario
from sim.metrics import requests_table
from sim.run import simulate
from sim.serving.sessions import session_starts
from sim.workload import load_workload
from traces import is_session_table


def _req(t: float, n_in: int, n_out: int, think: float) -> dict:
    return {"t": t, "type": "n", "in": n_in, "out": n_out, "think_time": think}


def _sessions(folder: Path, *sessions: list[dict]) -> Path:
    """Write one kv-cache-tester session file per request list into `folder`."""
    folder.mkdir()
    for i, requests in enumerate(sessions):
        (folder / f"trace_{i:04d}.json").write_text(json.dumps({"id": f"s{i}", "requests": requests}))
    return folder


def _scenario(trace: Path, *overrides: str):
    return load_scenario(
        "default",
        [
            f"workload.trace={trace}",
            "workload.time_scale=1",
            "policies=sglang",
            "run.progress=false",
            "run.debug_checks=true",
            *overrides,
        ],
    )


@pytest.mark.parametrize("prefill", ["disaggregated", "colocated"])
def test_second_request_is_issued_at_first_finish_plus_think_time(tmp_path, prefill):
    trace = _sessions(tmp_path / "s", [_req(0.0, 4000, 30, 0.0), _req(40.0, 4500, 20, 2.5)])
    result = simulate(_scenario(trace, f"serving.prefill={prefill}"))
    write_result(result, tmp_path / "out")
    requests = read_table(tmp_path / "out", "requests").set_index("request_id")
    assert requests.loc[0, "arrival_s"] == 0.0
    assert requests.loc[0, "finish_s"] > 0.0
    assert requests.loc[1, "arrival_s"] == requests.loc[0, "finish_s"] + 2.5
    assert requests["finished"].all()
    assert requests["session_id"].tolist() == ["s0", "s0"]
    assert requests["turn"].tolist() == [0, 1]


def test_requests_are_issued_with_float_arrival_times(tmp_path, monkeypatch):
    # SimPy's clock starts at the int 0; the request issued then must still carry a float ``arrival_s``
    issued = []
    monkeypatch.setattr("sim.run.requests_table", lambda reqs: issued.extend(reqs) or requests_table(reqs))
    trace = _sessions(tmp_path / "s", [_req(0.0, 4000, 30, 0.0), _req(1.0, 4000, 30, 0.5)])
    simulate(_scenario(trace))
    assert [r.arrival_s for r in issued][0] == 0.0
    assert all(type(r.arrival_s) is float for r in issued), [r.arrival_s for r in issued]


def test_zero_output_and_rejected_requests_still_release_the_next_turn(tmp_path):
    too_long = _req(1.0, 200_000, 10, 1.0)  # > max_seq_len: rejected on arrival
    trace = _sessions(tmp_path / "s", [_req(0.0, 2000, 0, 0.0), too_long, _req(2.0, 2000, 5, 4.0)])
    requests = simulate(_scenario(trace)).policies["sglang"].requests.set_index("request_id")
    assert requests.loc[1, "arrival_s"] == requests.loc[0, "finish_s"] + 1.0
    assert requests.loc[1, "unfinished_reason"] == "exceeds_max_seq_len"
    assert requests.loc[2, "arrival_s"] == requests.loc[1, "arrival_s"] + 4.0  # rejected at once, then think
    assert requests.loc[2, "finished"]


def test_sessions_start_at_the_seeded_poisson_times(tmp_path):
    trace = _sessions(tmp_path / "s", *[[_req(0.0, 1000, 5, 0.0)] for _ in range(4)])
    scenario = _scenario(trace, "workload.sessions.session_rate_per_s=0.5", "seed=3")
    requests = simulate(scenario).policies["sglang"].requests.sort_values("request_id")
    expected = session_starts(4, 0.5, np.random.default_rng([3, 0x5E55]))
    assert requests["arrival_s"].tolist() == expected.tolist()


def test_session_starts_are_exponential_gaps_from_zero():
    starts = session_starts(20_000, 2.0, np.random.default_rng(0))
    assert starts[0] == 0.0
    assert np.all(np.diff(starts) >= 0)
    assert np.diff(starts).mean() == pytest.approx(0.5, rel=0.03)


def test_max_concurrent_sessions_holds_a_session_until_a_slot_frees(tmp_path):
    trace = _sessions(tmp_path / "s", [_req(0.0, 3000, 40, 0.0), _req(1.0, 3000, 40, 1.0)], [_req(0.0, 3000, 5, 0.0)])
    scenario = _scenario(
        trace, "workload.sessions.session_rate_per_s=1000", "workload.sessions.max_concurrent_sessions=1"
    )
    requests = simulate(scenario).policies["sglang"].requests.set_index("request_id")
    assert requests.loc[2, "arrival_s"] == requests.loc[1, "finish_s"]  # session s1 starts when s0 ends


def test_horizon_reports_requests_never_issued(tmp_path):
    trace = _sessions(tmp_path / "s", [_req(0.0, 2000, 5, 0.0), _req(1.0, 2000, 5, 500.0)])
    requests = simulate(_scenario(trace, "run.horizon_s=100")).policies["sglang"].requests.set_index("request_id")
    assert requests.loc[0, "finished"]
    assert math.isnan(requests.loc[1, "arrival_s"])
    assert requests.loc[1, "unfinished_reason"] == "horizon"


def test_same_seed_gives_identical_closed_loop_tables(tmp_path):
    trace = _sessions(tmp_path / "s", [_req(0.0, 3000, 20, 0.0), _req(1.0, 3500, 20, 1.0)], [_req(0.0, 9000, 9, 0.0)])
    first = simulate(_scenario(trace)).policies["sglang"].requests
    second = simulate(_scenario(trace)).policies["sglang"].requests
    pd.testing.assert_frame_equal(first, second)


def test_shipped_session_trace_loads_as_a_session_table_with_sessions_keys():
    scenario = load_scenario(
        "default",
        [
            "workload.trace=claude_code_sessions",
            "workload.time_scale=1",
            "workload.sessions.max_sessions=2",
            "workload.sessions.max_think_time_s=30",
            "workload.max_prompt_tokens=100000",
        ],
    )
    df = load_workload(scenario)
    assert df["session_id"].unique().tolist() == ["trace_0001", "trace_0002"]
    assert df["prompt_tokens"].max() <= 100000
    assert df["think_time_s"].max() == 30.0
    assert df.attrs["num_think_capped"] > 0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("workload.time_scale=0.5", "workload.time_scale"),
        ("workload.end_s=100", "workload.end_s"),
        ("workload.max_requests=5", "workload.max_requests"),
    ],
)
def test_open_loop_keys_are_refused_for_a_session_trace(override, key):
    scenario = load_scenario("default", ["workload.trace=claude_code_sessions", "workload.time_scale=1", override])
    with pytest.raises(ScenarioError, match=rf"^{key}: does not apply to session trace"):
        load_workload(scenario)


def test_sessions_keys_are_refused_for_an_open_loop_trace():
    scenario = load_scenario("default", ["workload.sessions.session_rate_per_s=1"])
    with pytest.raises(ScenarioError, match="workload.sessions: trace 'mooncake_conversation' is not a session trace"):
        load_workload(scenario)


def test_generic_csv_workload_reads_through_the_columns_mapping(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("ts_ms,in,out\n0,1000,10\n500,2000,0\n")
    scenario = load_scenario(
        "default",
        [
            f"workload.trace={path}",
            "workload.time_scale=1",
            "workload.columns.arrival=ts_ms",
            "workload.columns.arrival_unit=ms",
            "workload.columns.prompt_tokens=in",
            "workload.columns.output_tokens=out",
        ],
    )
    df = load_workload(scenario)
    assert df["arrival_s"].tolist() == [0.0, 0.5]
    assert df["output_tokens"].tolist() == [10, 0]


def test_columns_with_a_non_generic_format_is_a_scenario_error():
    with pytest.raises(ScenarioError, match="workload.columns applies to format csv or jsonl"):
        load_scenario(
            "default",
            ["workload.format=azure", "workload.columns.arrival=a", "workload.columns.prompt_tokens=p",
             "workload.columns.output_tokens=o"],
        )  # fmt: skip


def test_shipped_agentic_scenario_is_a_closed_loop_session_workload():
    df = load_workload(load_scenario("agentic"))
    assert is_session_table(df)
    # The 15 sessions, 6 times over; trace_0007 starts at 128,679 tokens, so the prompt filter empties it.
    assert df["session_id"].nunique() == 6 * 14
    assert len(df) == 6 * 1113  # requests that fit the 128K context, per replay
    assert df.attrs["num_sessions"] == 6 * 14
    assert df["think_time_s"].max() == 60.0


def test_workload_format_choices_match_the_trace_readers():
    from typing import get_args

    from sim.config import WorkloadSpec
    from traces import FORMATS

    assert get_args(WorkloadSpec.model_fields["format"].annotation) == ("auto", *FORMATS)
