"""Capacity planning and the replica cluster: bisection, SLO monotonicity, routers, request conservation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pulseinfer.cli import main
from sim.config import load_scenario
from sim.run import policy_summary
from sim.serving.cluster import LeastTokensRouter, RoundRobinRouter, simulate_cluster
from sim.workload import load_workload
from study.bisection import bisect_max_rate
from study.plan import PLAN_COLUMNS, CellPlanner, PlanConfig, plan_cell
from study.slo import TailSlo


def _plan_config(overrides: list[str], slo: TailSlo, **kw) -> PlanConfig:
    return PlanConfig(
        "default", slo, ("h200",), ("sglang",), overrides=tuple(overrides), max_requests=None, rel_tol=0.05, **kw
    )


# ---- bisection -------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [0.1, 3.0, 50.0])
def test_bisection_finds_the_boundary_within_tolerance(start):
    found = bisect_max_rate(lambda r: r <= 3.7, start, rel_tol=0.02, max_steps=12)
    assert 3.7 / 1.02 <= found.rate <= 3.7
    assert all(ok == (r <= 3.7) for r, ok in found.tested)


def test_bisection_reports_zero_when_no_rate_is_feasible_and_caps_when_all_are():
    assert bisect_max_rate(lambda r: False, 1.0, 0.05, max_steps=4).rate == 0.0
    capped = bisect_max_rate(lambda r: True, 1.0, 0.05, max_steps=4)
    assert capped.capped and capped.rate == 16.0


def test_max_rate_of_a_constant_length_workload_is_the_feasibility_boundary(constant_overrides):
    cfg = _plan_config(constant_overrides, TailSlo(ttft_p99_s=1.0))
    cell = CellPlanner(cfg, "h200", "sglang")
    found = bisect_max_rate(lambda r: cfg.slo.met(cell.single(r)), cell.start_rate(), cfg.rel_tol, cfg.max_steps)
    assert found.rate > 0 and not found.capped
    # An independent scan: every rate up to the answer meets the SLO, every rate past the tolerance misses it.
    for rate in np.geomspace(found.rate / 3, found.rate * 3, 9):
        summary = cell.single(float(rate))
        if rate <= found.rate:
            assert cfg.slo.met(summary), rate
        elif rate >= found.rate * (1 + cfg.rel_tol):
            assert not cfg.slo.met(summary), rate


def test_max_rate_is_monotone_in_the_slo(constant_overrides):
    rates = []
    for ttft_s in (0.6, 1.0, 2.0, 4.0):
        cfg = _plan_config(constant_overrides, TailSlo(ttft_p99_s=ttft_s))
        rates.append(plan_cell(cfg, "h200", "sglang")[0]["max_rate_per_s"])
    assert rates == sorted(rates) and rates[-1] > rates[0]


def test_plan_cell_with_a_target_gives_one_row_per_router(constant_overrides):
    cfg = _plan_config(constant_overrides, TailSlo(ttft_p99_s=1.0), target_rate_per_s=20.0, gpu_hour_usd={"h200": 4.0})
    rows = plan_cell(cfg, "h200", "sglang")
    assert [r["router"] for r in rows] == ["round_robin", "least_tokens"]
    for row in rows:
        assert list(row) == PLAN_COLUMNS
        assert row["meets_slo"] and row["replicas_for_target"] >= 1
        assert row["cluster_ttft_p99_s"] <= 1.0
        assert row["usd_per_million_output_tokens"] > 0


@pytest.mark.parametrize("start", [1, 2, 6, 7, 8, 30, 64])
def test_fewest_replicas_gallops_and_bisects_to_the_smallest_count_that_meets(constant_overrides, start):
    cfg = _plan_config(constant_overrides, TailSlo(tpot_p99_s=0.05), target_rate_per_s=1.0)
    cell = CellPlanner(cfg, "h200", "sglang")
    calls = []

    def fake_cluster(n: int, router: str) -> dict:  # meets the SLO from 7 replicas on
        calls.append(n)
        return {"tpot_p99_s": 0.01 if n >= 7 else 1.0, "finished": 1, "incomplete": 0}

    cell.cluster = fake_cluster
    n, summary = cell.fewest_replicas("round_robin", start)
    assert n == 7 and summary["tpot_p99_s"] == 0.01
    assert len(calls) == len(set(calls)) <= 2 * math.ceil(math.log2(64)) + 1


def test_fewest_replicas_gives_none_above_the_cap(constant_overrides):
    cfg = _plan_config(constant_overrides, TailSlo(tpot_p99_s=0.05), target_rate_per_s=1.0, max_replicas=5)
    cell = CellPlanner(cfg, "h200", "sglang")
    cell.cluster = lambda n, router: {"tpot_p99_s": 1.0, "finished": 1, "incomplete": 0}
    assert cell.fewest_replicas("round_robin", 2)[0] is None


def test_plan_cli_writes_plan_csv(tmp_path, constant_overrides, capsys):
    sets = [arg for item in constant_overrides for arg in ("--set", item)]
    argv = ["plan", "--slo", "ttft_p99_s=1", "--hardware", "h200", "--policies", "sglang", "--max-requests", "all"]
    assert main([*argv, "--target-rate", "10", "--out", str(tmp_path), "--no-progress", *sets]) == 0
    table = pd.read_csv(tmp_path / "plan.csv")
    assert list(table.columns) == PLAN_COLUMNS and len(table) == 2
    assert "max rate/s" in capsys.readouterr().out


# ---- cluster ---------------------------------------------------------------------------------------


def _scenario(overrides: list[str], *extra: str):
    return load_scenario("default", [*overrides, "policies=sglang", *extra])


def test_every_request_finishes_or_is_reported_and_round_robin_splits_evenly(tiny_overrides):
    scenario = _scenario(tiny_overrides, "workload.synthetic.prompt_tokens_mean=200000")  # some never fit
    workload = load_workload(scenario)
    result = simulate_cluster(scenario, workload, "sglang", 3, "round_robin")
    assert result.routed == [10, 10, 10]
    assert sorted(result.requests["request_id"]) == sorted(workload["request_id"])
    reported = result.requests["finished"] | (result.requests["unfinished_reason"] != "")
    assert reported.all()
    assert result.summary["finished"] + result.summary["unfinished"] == len(workload)
    assert result.summary["rejected"] > 0
    assert list(result.requests.groupby("replica").size()) == [10, 10, 10]


def test_one_replica_cluster_is_the_single_replica_simulation(tiny_overrides):
    scenario = load_scenario("default", [*tiny_overrides, "policies=pulseinfer"])
    workload = load_workload(scenario)
    single = policy_summary(scenario, workload, "pulseinfer")
    cluster = simulate_cluster(scenario, workload, "pulseinfer", 1).summary
    for key, value in single.items():
        assert cluster[key] == value or (isinstance(value, float) and math.isnan(value) and math.isnan(cluster[key]))


def test_least_tokens_router_picks_the_least_loaded_replica():
    router = LeastTokensRouter(3)
    assert [router.pick(t) for t in (1000, 10, 10)] == [0, 1, 2]
    assert router.pick(5) == 1  # replicas 1 and 2 tie at 10 outstanding tokens: the lower index wins
    router.release(0, 1000)
    assert router.pick(1) == 0
    robin = RoundRobinRouter(3)
    assert [robin.pick(1) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_tokens_routes_around_a_long_request_in_simulation(tiny_overrides):
    scenario = _scenario(tiny_overrides)
    # One long request first, then short ones while it runs: they all go to the other replica.
    workload = pd.DataFrame(
        {
            "request_id": np.arange(6),
            "arrival_s": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5],
            "prompt_tokens": [60000, 500, 500, 500, 500, 500],
            "output_tokens": [400, 5, 5, 5, 5, 5],
        }
    )
    least = simulate_cluster(scenario, workload, "sglang", 2, "least_tokens")
    assert least.requests.set_index("request_id")["replica"].tolist() == [0, 1, 1, 1, 1, 1]
    robin = simulate_cluster(scenario, workload, "sglang", 2, "round_robin")
    assert robin.routed == [3, 3]


def test_more_replicas_never_breach_an_slo_that_fewer_met(constant_overrides):
    scenario = _scenario(constant_overrides, "workload.synthetic.rate_per_s=20", "workload.synthetic.num_requests=60")
    workload = load_workload(scenario)
    slo = TailSlo(ttft_p99_s=2.0)  # met from 4 replicas on (p99 TTFT 13.4, 5.2, 2.5, 1.6, 1.0 s with 1-5, round robin)
    for router in ("round_robin", "least_tokens"):
        met = [slo.met(simulate_cluster(scenario, workload, "sglang", n, router).summary) for n in range(1, 6)]
        assert met[-1], met
        first = met.index(True)
        assert all(met[first:]), (router, met)


def test_a_replica_that_misses_at_every_rate_says_which_bound_and_by_how_much(constant_overrides):
    """A TTFT bound below one prefill cannot be met at any rate: the note names the column, its value and the bound
    at the lowest rate tried (the row itself has no rate to report)."""
    cfg = _plan_config(constant_overrides, TailSlo(tpot_p99_s=10.0, ttft_p99_s=1e-6), target_rate_per_s=1.0)
    (row,) = plan_cell(cfg, "h200", "sglang")[:1]
    assert row["max_rate_per_s"] == 0.0 and not row["meets_slo"]
    head, _, tail = row["note"].partition("; ")
    assert head.startswith("at ") and ", the lowest rate tried: ttft_p99_s " in head and head.endswith(" > 1e-06")
    assert "tpot_p99_s" not in head  # the TPOT bound held
    assert tail == "one replica misses the SLO at every rate tried"
