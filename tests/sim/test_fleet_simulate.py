"""Deployments in ``simulate`` (issue 34): ``serving.replicas`` / ``serving.router`` run each policy as a fleet
(sim/serving/cluster.py) with per-replica rows; one replica is the single-replica path, unchanged; the bill
(sim/metrics/bill.py) and its ``cost`` section; the ``prefix_aware`` router; sweeps take the same path."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from pulseinfer.tables_io import write_result
from sim.config import ScenarioError, load_scenario
from sim.config.scenario import ServingSpec
from sim.metrics import SUMMARY_COLUMNS
from sim.metrics.bill import deployment_gpus
from sim.metrics.fleet_summary import REPLICA_COLUMNS
from sim.run import FLEET_COLUMNS, policy_summary, simulate, simulate_fleet, simulate_policy
from sim.serving.cluster import ALL_ROUTERS, PrefixAwareRouter, simulate_cluster
from sim.serving.request import Request
from sim.workload import load_workload
from traces.schema import SESSION_COLUMNS

# 40 Mooncake requests (with hash ids), colocated prefill, SGLang (radix cache on) and PulseInfer.
SMALL = ["workload.max_requests=40", "serving.prefill=colocated", "run.progress=false", "policies=sglang,pulseinfer"]


def _frames_equal(a: pd.DataFrame | None, b: pd.DataFrame | None) -> None:
    if a is None or b is None:
        assert a is None and b is None
        return
    pd.testing.assert_frame_equal(a, b)


def test_one_replica_is_the_single_replica_path_table_for_table():
    plain = simulate(load_scenario("default", SMALL))
    one = simulate(load_scenario("default", [*SMALL, "serving.replicas=1", "serving.router=least_tokens"]))
    pd.testing.assert_frame_equal(plain.summary, one.summary)
    assert one.replicas is None and list(one.summary.columns[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    assert not set(FLEET_COLUMNS) & set(one.summary.columns)
    for i, (name, r) in enumerate(one.policies.items()):
        ref = simulate_policy(load_scenario("default", SMALL), plain.workload, name, seed_index=i)
        assert r.summary == ref.summary
        for table in ("requests", "steps", "layers", "layer_recall", "timeline"):
            _frames_equal(getattr(r, table), getattr(ref, table))
            _frames_equal(getattr(r, table), getattr(plain.policies[name], table))


@pytest.mark.parametrize("router", ALL_ROUTERS)
def test_a_fleet_is_the_cluster_path_with_per_replica_rows(tmp_path, router):
    scenario = load_scenario("default", [*SMALL, "serving.replicas=3", f"serving.router={router}"])
    result = simulate(scenario)
    workload = result.workload
    for i, (name, r) in enumerate(result.policies.items()):
        ref = simulate_cluster(scenario, workload, name, 3, router, seed_index=i)
        assert r.summary == ref.summary
        pd.testing.assert_frame_equal(r.requests, ref.requests)
        assert r.steps is None  # a fleet keeps no per-step tables
        rows = r.replicas
        assert list(rows.columns) == REPLICA_COLUMNS and list(rows["replica"]) == [0, 1, 2]
        assert list(rows["requests"]) == ref.routed == list(r.requests["replica"].value_counts().sort_index())
        assert rows["requests"].sum() == len(workload)
        assert math.isclose(rows["decode_tokens_per_s"].sum(), r.summary["decode_tokens_per_s"], rel_tol=1e-9)
        assert rows["peak_hbm_gib"].max() == pytest.approx(r.summary["peak_hbm_gib"])
        assert rows["mean_batch"].gt(0).all() and rows["link_busy_frac"].between(0, 1).all()
    summary = result.summary
    assert list(summary["num_replicas"]) == [3, 3] and set(summary["router"]) == {router}
    assert list(summary["gpus"]) == [3, 3]  # colocated, TP 1
    written = write_result(result, tmp_path)
    assert written[:2] == ["summary.csv", "replicas.csv"] and not any(w.startswith("steps") for w in written)
    table = pd.read_csv(tmp_path / "replicas.csv")
    assert list(table.columns) == ["policy", *REPLICA_COLUMNS] and len(table) == 6


def test_sweeps_and_searches_take_the_fleet_path():
    scenario = load_scenario("default", [*SMALL, "serving.replicas=2", "serving.router=least_tokens"])
    workload = load_workload(scenario)
    summary = policy_summary(scenario, workload, "sglang")
    ref = simulate_cluster(scenario, workload, "sglang", 2, "least_tokens")
    assert summary == ref.summary and summary["num_replicas"] == 2


def test_the_bill_counts_every_gpu_and_prices_only_when_asked():
    base = ["workload.max_requests=30", "run.progress=false", "policies=sglang", "serving.prefill=disaggregated"]
    sets = [*base, "serving.num_prefill_gpus=3", "serving.replicas=2"]
    plain = simulate(load_scenario("default", sets)).summary.iloc[0]
    assert plain["gpus"] == 2 * (1 + 3) and "usd_per_hour" not in plain
    assert plain["gpu_hours"] == pytest.approx(8 * plain["duration_s"] / 3600)
    priced = simulate(load_scenario("default", [*sets, "cost.gpu_hour_usd.h200=3.5", "cost.gpu_hour_usd.b200=9"]))
    row = priced.summary.iloc[0]
    assert row["gpu_hour_usd"] == 3.5 and row["usd_per_hour"] == pytest.approx(8 * 3.5)
    tokens = row["decode_tokens_per_s"] * row["duration_s"]  # every decode token of the run
    assert row["usd_per_million_output_tokens"] == pytest.approx(row["gpu_hours"] * 3.5 / tokens * 1e6)
    assert deployment_gpus(ServingSpec(prefill="colocated", tp_size=2, replicas=16), 16) == 32


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("cost.gpu_hour_usd.foo=1", ["cost.gpu_hour_usd", "'foo'", "h200"]),
        ("cost.gpu_hour_usd.h200=0", ["cost.gpu_hour_usd.h200", "greater than 0"]),
        ("cost.gpu_hour_usd.h200=inf", ["cost.gpu_hour_usd.h200"]),
        ("serving.replicas=0", ["serving.replicas", "greater than or equal to 1"]),
        ("serving.replicas=1000000", ["serving.replicas", "less than or equal to 100000"]),
        ("serving.router=random", ["serving.router", "prefix_aware"]),
    ],
)
def test_bad_fleet_and_cost_keys_are_one_line_errors(override, needles):
    with pytest.raises(ScenarioError) as err:
        load_scenario("default", [override])
    line = str(err.value)
    assert "\n" not in line and all(n in line for n in needles), line


def test_a_session_workload_cannot_be_a_fleet():
    scenario = load_scenario("default", [*SMALL, "serving.replicas=2"])
    workload = load_workload(scenario)
    sessions = workload.assign(**{c: 0 for c in SESSION_COLUMNS if c not in workload.columns})
    with pytest.raises(ScenarioError, match="serving.replicas: 2 needs an open-loop workload"):
        simulate_fleet(scenario, sessions, "sglang")


def _cache(hits: dict[tuple[int, ...], int]):
    return SimpleNamespace(match=lambda ids, prompt, block: ([], hits.get(tuple(ids), 0)))


def test_prefix_aware_router_takes_the_longest_cached_prefix_then_least_tokens():
    caches = [_cache({(1, 2): 512}), _cache({(1, 2): 1023}), None, _cache({(1, 2): 1023})]
    router = PrefixAwareRouter([SimpleNamespace(kv=SimpleNamespace(prefix=c)) for c in caches])
    req = Request(0, 0.0, 1024, 10)
    req.hash_ids, req.hash_block_tokens = (1, 2), 512
    assert router.pick(1034, req) == 1  # replicas 1 and 3 hold 1023 tokens; 1 has fewer outstanding (tie: index)
    assert router.pick(1034, req) == 3  # now 3 has fewer outstanding
    other = Request(1, 0.0, 100, 10)  # no hash ids: least tokens
    assert router.pick(110, other) == 0
    assert list(router.outstanding) == [110, 1034, 0, 1034]


def test_prefix_aware_fleet_hits_the_cache_more_and_equals_stepping():
    # Two prompt families on 3 replicas: round robin and least tokens spread each family over every replica (each
    # replica's cache misses each family once); prefix-aware routing keeps a family where its prefix is cached.
    sets = [*SMALL, "policies=sglang", "workload.max_requests=60"]
    workload = load_workload(load_scenario("default", sets)).copy()
    blocks = [math.ceil(p / 512) for p in workload["prompt_tokens"]]
    workload["hash_ids"] = [[(i % 2) * 100_000 + j for j in range(n)] for i, n in enumerate(blocks)]
    hit = {}
    for router in ALL_ROUTERS:
        runs = [
            simulate_cluster(load_scenario("default", [*sets, f"run.skip_ahead={skip}"]), workload, "sglang", 3, router)
            for skip in ("true", "false")
        ]
        pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests)  # skip-ahead = stepping, router included
        pd.testing.assert_frame_equal(runs[0].replicas, runs[1].replicas)
        hit[router] = runs[0].summary["prefix_hit_frac"]
    assert hit["prefix_aware"] > max(hit["round_robin"], hit["least_tokens"]) + 0.05, hit
