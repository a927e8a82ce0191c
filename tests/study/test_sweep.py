"""Sweep: points in grid order, the content-addressed cache (a rerun with one more value simulates only the new
points), the table's independence from how it was computed, and the A/B comparison."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from sim.config import ScenarioError
from study.accuracy import AccuracySlo, load_accuracy_table
from study.executors import ExecutorError, run_tasks
from study.slo import TailSlo
from study.sweep import (
    PointCache,
    SweepConfig,
    SweepError,
    cache_key,
    compare_table,
    parse_grid,
    resolve_points,
    run_sweep,
)

from .conftest import TINY

PROMPT = "workload.synthetic.prompt_tokens_mean"
RATE = "workload.synthetic.rate_per_s"


def config(prompts=("8000", "16000"), rates=("2", "8"), num_seeds=1, **kw) -> SweepConfig:
    return SweepConfig(
        scenario="default",
        grids=((PROMPT, prompts), (RATE, rates)),
        policies=("sglang", "pulseinfer"),
        num_seeds=num_seeds,
        overrides=tuple([*TINY, "workload.synthetic.num_requests=12"]),
        slo=TailSlo(tpot_p99_s=0.06),
        **kw,
    )


def test_parse_grid_and_its_errors():
    assert parse_grid("a.b = 1, 2 ,3") == ("a.b", ("1", "2", "3"))
    for bad in ("a.b", "a.b=", "=1,2", "a=1,1", "policies=sglang", "seed=1,2"):
        with pytest.raises(SweepError) as info:
            parse_grid(bad)
        assert info.value.field == "grids"


def test_points_follow_grid_then_policy_then_seed_order():
    points = resolve_points(config(num_seeds=2))
    assert len(points) == 2 * 2 * 2 * 2
    assert [(p.values, p.policy, p.seed) for p in points[:4]] == [
        (("8000", "2"), "sglang", 0),
        (("8000", "2"), "sglang", 1),
        (("8000", "2"), "pulseinfer", 0),
        (("8000", "2"), "pulseinfer", 1),
    ]
    assert len({p.key for p in points}) == len(points)  # every point its own cache entry
    p = points[-1]
    assert (p.scenario.workload.synthetic.prompt_tokens_mean, p.scenario.seed, p.scenario.policies) == (
        16000,
        1,
        ["pulseinfer"],
    )


def test_a_bad_grid_value_fails_before_anything_runs(tmp_path):
    with pytest.raises(ScenarioError, match="rate_per_s"):
        run_sweep(config(rates=("2", "-1")), tmp_path)
    assert not (tmp_path / "cache").exists()


def test_cache_key_moves_with_the_scenario_policy_and_seed():
    a, b = resolve_points(config(prompts=("8000",), rates=("2",), num_seeds=2))[:2]
    assert a.key != b.key  # seeds differ
    assert cache_key(a.scenario, a.policy, a.seed) == a.key  # a pure function of its inputs
    assert cache_key(a.scenario, "pulseinfer", a.seed) != a.key


def test_rerun_with_one_more_value_simulates_only_the_new_points(tmp_path):
    first = run_sweep(config(), tmp_path)
    assert (first.num_simulated, first.num_cached) == (8, 0)
    again = run_sweep(config(), tmp_path)
    assert (again.num_simulated, again.num_cached) == (0, 8)
    pd.testing.assert_frame_equal(again.table, first.table)
    grown = run_sweep(config(rates=("2", "8", "32")), tmp_path)
    assert (grown.num_simulated, grown.num_cached) == (4, 8)  # one rate × two prompts × two policies
    old = grown.table[grown.table[RATE] != 32].reset_index(drop=True)
    pd.testing.assert_frame_equal(old, first.table.sort_values([PROMPT, RATE], kind="stable").reset_index(drop=True))
    assert not first.table["error"].any()
    assert (first.table["finished"] > 0).all()


def test_a_damaged_cache_entry_is_simulated_again(tmp_path):
    first = run_sweep(config(prompts=("8000",), rates=("2",)), tmp_path)
    key = resolve_points(config(prompts=("8000",), rates=("2",)))[0].key
    PointCache(tmp_path / "cache").path(key).write_text("{not json")
    with pytest.warns(RuntimeWarning, match="is not valid JSON; simulating its point again"):
        again = run_sweep(config(prompts=("8000",), rates=("2",)), tmp_path)
    assert (again.num_simulated, again.num_cached) == (1, 1)
    pd.testing.assert_frame_equal(again.table, first.table)


@pytest.mark.parametrize(
    ("edit", "check"),
    [
        ({"link_busy_frac": 5.0}, "0 <= link_busy_frac <= 1"),
        ({"peak_hbm_gib": 1e9}, "peak_hbm_gib <= hardware.hbm_gib"),
        ({"link_gbps_achieved": 1e6}, "link_gbps_achieved <= the link's peak"),
        ({"stall_frac": None}, "0 <= stall_frac <= 1"),  # null is NaN: a fraction is always defined
    ],
)
def test_a_cached_record_breaking_a_physics_bound_is_simulated_again(tmp_path, edit, check):
    """Issue 30: a hand-edited record with valid JSON but ``link_busy_frac`` 5.0 reached sweep.csv as is."""
    cfg = config(prompts=("8000",), rates=("2",))
    first = run_sweep(cfg, tmp_path)
    cache = PointCache(tmp_path / "cache")
    path = cache.path(resolve_points(cfg)[0].key)
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "metrics": {**record["metrics"], **edit}}))
    with pytest.warns(RuntimeWarning, match=f"breaks a physics bound: {re.escape(check)}.*simulating its point again"):
        again = run_sweep(cfg, tmp_path)
    assert (again.num_simulated, again.num_cached) == (1, 1)
    pd.testing.assert_frame_equal(again.table, first.table)
    assert json.loads(path.read_text()) == record  # rewritten


def test_local_processes_give_the_serial_table(tmp_path):
    serial = run_sweep(config(), tmp_path / "a", jobs=1).table
    pooled = run_sweep(config(), tmp_path / "b", jobs=2).table
    pd.testing.assert_frame_equal(serial, pooled)


def test_slo_met_and_accuracy_columns(tmp_path):
    table = load_accuracy_table()
    cfg = config(prompts=("8000",), rates=("2",), accuracy=AccuracySlo(table, {"kl_nats": 0.01}))
    cfg = SweepConfig(**{**cfg.__dict__, "overrides": (*cfg.overrides, "policy.pulseinfer.budget_tokens=512")})
    rows = run_sweep(cfg, tmp_path).table.set_index("policy")
    assert rows.loc["sglang", "kl_nats"] == 0.0 and rows.loc["sglang", "accuracy_selection"] == "dense"
    assert rows.loc["pulseinfer", "accuracy_selection"] == "solohead"
    measured = table.frame.set_index(["selection", "budget_tokens"]).loc[("solohead", 512), "kl_nats"]
    assert rows.loc["pulseinfer", "kl_nats"] == pytest.approx(measured)
    slo = TailSlo(tpot_p99_s=0.06)
    for policy, row in rows.iterrows():
        assert row["slo_met"] == (slo.met(row.to_dict()) and row["kl_nats"] <= 0.01), policy


def test_an_accuracy_bound_outside_the_table_is_refused_before_simulating(tmp_path):
    cfg = config(accuracy=AccuracySlo(load_accuracy_table(), {"kl_nats": 0.01}))  # preset budget 2048 > 1024
    with pytest.raises(ValueError, match="outside the budgets measured"):
        run_sweep(cfg, tmp_path)
    assert not (tmp_path / "cache").exists()


def test_compare_table_ratio_and_slo_fractions():
    rows = []
    for x in (1, 2):
        for policy, value in (("a", 2.0 * x), ("b", 1.0 if x == 1 else 0.0)):
            for seed in (0, 1):
                rows.append({"k1": x, "k2": "u", "policy": policy, "seed": seed, "m": value, "slo_met": seed == 0})
    cells = compare_table(pd.DataFrame(rows), ["k1", "k2"], "a", "b", "m")
    assert list(cells["k1"]) == [1, 2]
    assert cells["ratio"].iloc[0] == pytest.approx(2.0)
    assert math.isinf(cells["ratio"].iloc[1])  # B is 0 where A is not
    assert np.allclose(cells["a_slo_met_frac"], 0.5)
    with pytest.raises(SweepError):
        compare_table(pd.DataFrame(rows), ["k1", "k2"], "a", "c", "m")


def _square(x: int) -> int:
    return x * x


def test_run_tasks_keeps_task_order_and_checks_its_arguments():
    assert run_tasks(_square, [(3,), (1,), (2,)], "local", jobs=1) == [9, 1, 4]
    with pytest.raises(ExecutorError):
        run_tasks(_square, [(1,)], "nowhere")
    with pytest.raises(ExecutorError):
        run_tasks(_square, [(1,)], "local", jobs=0)
    with pytest.raises(ExecutorError):
        run_tasks(_square, [(1,)], "local", ray_address="auto")
