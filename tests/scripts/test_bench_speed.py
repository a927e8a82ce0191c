"""scripts/bench_speed.py: its workload generator (seeded, length cap, count) and one tiny end-to-end run.

No assertion here depends on how fast anything ran: wall times are only checked to be positive.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_speed"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_workload_is_seeded_capped_and_sized(bench):
    a, b = bench.bench_workload(300, seed=3), bench.bench_workload(300, seed=3)
    pd.testing.assert_frame_equal(a, b)  # same seed, same table
    assert not bench.bench_workload(300, seed=4).equals(a)
    assert len(a) == 300 and list(a["request_id"]) == list(range(300))
    assert ((a["prompt_tokens"] + a["output_tokens"]) <= bench.MAX_TOTAL_TOKENS).all()
    assert (a["prompt_tokens"] >= 1).all() and (a["output_tokens"] >= 1).all()
    assert (np.diff(a["arrival_s"]) > 0).all() and a["arrival_s"].iloc[0] > 0


def test_workload_rate_is_about_two_per_second(bench):
    df = bench.bench_workload(4000, seed=0)
    assert 1.9 < len(df) / df["arrival_s"].iloc[-1] < 2.1  # Poisson, 4,000 gaps: ±5 % is > 3 sigma


def test_lengths_come_from_the_azure_slice(bench):
    from traces import load_trace

    slice_ = load_trace(bench.TRACE)
    pairs = set(zip(slice_["prompt_tokens"], slice_["output_tokens"]))
    df = bench.bench_workload(200, seed=1)
    assert set(zip(df["prompt_tokens"], df["output_tokens"])) <= pairs


def test_tiny_end_to_end_run_gives_the_table(bench, tmp_path, capsys):
    assert bench.main(["--requests", "20", "--repeats", "1", "--cases", "8b", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "bench.csv")
    assert list(table.columns) == bench.COLUMNS
    assert list(table["policy"]) == ["sglang", "pulseinfer"]
    assert (table["requests"] == 20).all() and (table["tree"] == "current").all()
    assert (table["steps"] > 20).all() and (table["peak_rss_mib"] > 0).all()
    # timings are reported (the child timed its event loop), never compared with a clock figure: CI is shared
    assert np.isfinite(table[["wall_s", "loop_s"]].to_numpy()).all()
    assert np.allclose(table["us_per_step"], table["wall_s"] / table["steps"] * 1e6)
    assert np.allclose(table["loop_us_per_step"], table["loop_s"] / table["steps"] * 1e6)
    assert "RECORDED" not in capsys.readouterr().out  # peers only at 5,000 requests


def test_bad_case_is_refused(bench):
    with pytest.raises(SystemExit):
        bench.main(["--cases", "9b"])


def test_bad_baseline_is_one_line(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--cases", "70b", "--requests", "5", "--repeats", "1", "--baseline", "no-such-revision-xyz"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --baseline no-such-revision-xyz: not a git revision") and err.count("\n") == 1
