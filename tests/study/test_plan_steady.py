"""plan answers only from a sample that can answer: the steady-state criterion, sample-limited notes, fleet answers
that agree with the single-replica maximum, and --max-requests checked."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from pulseinfer.cli import main
from study.plan import PlanConfig, agree_with_single, plan_cell
from study.slo import TailSlo
from study.steady import (
    MIN_SAMPLE_REQUESTS,
    delivered_frac,
    delivered_rate,
    middle_rate,
    steady_problem,
)


def _requests(arrival_s, finish_s) -> pd.DataFrame:
    arrival_s, finish_s = np.asarray(arrival_s, float), np.asarray(finish_s, float)
    return pd.DataFrame({"arrival_s": arrival_s, "finish_s": finish_s, "finished": np.isfinite(finish_s)})


def test_middle_rate_leaves_out_warmup_and_drain():
    times = np.r_[0.0, np.arange(1, 10) * 1.0, 100.0]  # 11 events: outliers at both ends
    assert middle_rate(times) == pytest.approx(1.0)
    assert math.isnan(middle_rate(np.array([1.0])))


def test_steady_when_completions_track_arrivals_shifted_by_latency():
    arrivals = np.arange(100) * 0.5  # 2 req/s
    assert steady_problem(_requests(arrivals, arrivals + 3.0)) is None
    assert delivered_rate(_requests(arrivals, arrivals + 3.0)) == pytest.approx(2.0)
    assert delivered_frac(_requests(arrivals, arrivals + 3.0)) == pytest.approx(1.0)


def test_not_steady_when_the_backlog_grows():
    arrivals = np.arange(100) * 0.5  # 2 req/s offered, served at 1.5 req/s: the queue grows
    problem = steady_problem(_requests(arrivals, 1.0 + np.arange(100) / 1.5))
    assert problem is not None and "delivered 1.5 req/s against 2 req/s offered" in problem


def test_not_steady_when_a_burst_is_too_short_for_its_latency():
    arrivals = np.arange(50) / 1000.0  # 50 requests at 1,000 req/s
    assert "too short" in steady_problem(_requests(arrivals, 0.3 * np.arange(1, 51)))  # served one every 0.3 s
    assert "too short" in steady_problem(_requests(arrivals, np.full(50, 0.4)))  # one batch: all finish together


def test_too_few_finished_requests_cannot_answer():
    arrivals = np.arange(MIN_SAMPLE_REQUESTS) * 1.0
    finish = arrivals + 1.0
    finish[0] = np.nan  # one short of the minimum finished
    assert f">= {MIN_SAMPLE_REQUESTS}" in steady_problem(_requests(arrivals, finish))


def test_short_sample_never_reports_more_than_it_delivers(constant_overrides):
    """30 short requests under a TPOT bound only: the old plan reported 388 req/s (still feasible at its highest
    rate, 1,366 decode tok/s, i.e. 3.5 of the 20 tokens each request needs) and 1 replica meeting 1,000 req/s."""
    short = [
        *constant_overrides,
        "workload.synthetic.prompt_tokens_mean=200",
        "workload.synthetic.output_tokens_mean=20",
    ]
    cfg = PlanConfig("default", TailSlo(tpot_p99_s=0.1), ("h200",), ("sglang",), overrides=tuple(short),
                     max_requests=None, target_rate_per_s=1000.0, routers=("round_robin",), max_replicas=8)  # fmt: skip
    row = plan_cell(cfg, "h200", "sglang")[0]
    assert row["max_rate_per_s"] > 0 and row["delivered_frac"] >= 0.9  # never more than it delivered
    assert row["decode_tokens_per_s"] >= 0.5 * row["max_rate_per_s"] * 20  # tokens consistent with the rate
    assert not row["meets_slo"] and row["replicas_for_target"] is None
    assert row["note"].startswith("sample-limited: ") and "raise --max-requests" in row["note"]


def _cell(target: float, clusters: dict[int, dict]):
    cfg = SimpleNamespace(target_rate_per_s=target, rel_tol=0.05, max_replicas=64)
    return SimpleNamespace(cfg=cfg, cluster=lambda n, router: clusters.setdefault(n, {"tpot_p99_s": 0.01}))


def test_fleet_is_never_credited_with_more_than_n_times_the_single_maximum():
    clusters: dict[int, dict] = {}
    n, summary, note = agree_with_single(_cell(8.0, clusters), "round_robin", 6, {}, max_rate=0.97)
    assert n == math.ceil(8.0 / (0.97 * 1.05)) == 8 and clusters == {8: summary}
    assert "met the SLO with 6 replicas" in note and "reported 8" in note


def test_fleet_bound_above_max_replicas_is_no_answer():
    n, summary, note = agree_with_single(_cell(8.0, {}), "round_robin", 2, {}, max_rate=0.1)  # needs >= 77
    assert n is None and summary == {} and "77 exceed max_replicas 64" in note


def test_fleet_needing_more_than_the_division_says_why():
    n, _, note = agree_with_single(_cell(8.0, {}), "least_tokens", 12, {"x": 1}, max_rate=1.0)
    assert n == 12 and "more than target / max rate = 8" in note


def test_fleet_consistent_with_the_single_maximum_has_no_note():
    assert agree_with_single(_cell(8.0, {}), "round_robin", 8, {"x": 1}, max_rate=1.0) == (8, {"x": 1}, "")


@pytest.mark.parametrize("value", ["0", "-5", "ten"])
def test_max_requests_zero_or_less_is_an_error(tmp_path, capsys, value):
    assert main(["plan", "--max-requests", value, "--out", str(tmp_path / "p"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --max-requests {value}: ") and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def test_max_requests_below_a_steady_sample_is_an_error(tmp_path, capsys):
    assert main(["plan", "--max-requests", "5", "--out", str(tmp_path / "p"), "--no-progress"]) == 2
    assert f"max_requests must be >= {MIN_SAMPLE_REQUESTS}, got 5" in capsys.readouterr().err
