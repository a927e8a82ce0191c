"""Accuracy table: interpolation between measured budgets, refusal outside them, SLO keys, and an
accuracy-constrained search whose best configuration meets the KL bound."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pulseinfer.cli import main
from sim.config import load_scenario
from study.accuracy import (
    AccuracyError,
    AccuracySlo,
    load_accuracy_table,
    policy_accuracy,
    policy_selection,
    split_slo,
)
from study.search import SearchConfig, run_search
from study.search_results import collect_results
from study.slo import TailSlo
from study.space import parse_space

from .conftest import TINY

TABLE = load_accuracy_table()


def measured(selection: str, budget: int, column: str) -> float:
    return float(TABLE.frame.set_index(["selection", "budget_tokens"]).loc[(selection, budget), column])


@pytest.mark.parametrize("selection", ["solohead", "headwise"])
def test_measured_budgets_give_the_measured_values(selection):
    for budget in TABLE.budgets(selection):
        values = TABLE.interpolate(selection, budget)
        assert values["kl_nats"] == pytest.approx(measured(selection, budget, "kl_nats"), rel=1e-12)
        assert values["mass_pct"] == pytest.approx(100 * measured(selection, budget, "mass_mean"), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(budget=st.floats(min_value=256, max_value=1024), selection=st.sampled_from(["solohead", "headwise"]))
def test_interpolation_lies_between_the_neighbouring_measurements(budget, selection):
    budgets = TABLE.budgets(selection)
    lo = max(b for b in budgets if b <= budget)
    hi = min(b for b in budgets if b >= budget)
    values = TABLE.interpolate(selection, budget)
    for name, column, factor in (("kl_nats", "kl_nats", 1), ("mass_pct", "mass_mean", 100), ("rel_l2", "rel_l2", 1)):
        ends = sorted([factor * measured(selection, lo, column), factor * measured(selection, hi, column)])
        assert ends[0] * (1 - 1e-12) <= values[name] <= ends[1] * (1 + 1e-12)


def test_kl_is_geometric_between_doublings():
    # log-linear in log2(budget): the midpoint in log2 (362 ≈ 256·√2) is the geometric mean of the two ends
    mid = TABLE.interpolate("solohead", 256 * math.sqrt(2))["kl_nats"]
    assert mid == pytest.approx(math.sqrt(measured("solohead", 256, "kl_nats") * measured("solohead", 512, "kl_nats")))


@pytest.mark.parametrize("budget", [255, 1025, 2048, 16])
def test_no_extrapolation_outside_the_measured_budgets(budget):
    with pytest.raises(AccuracyError, match="outside the budgets measured .* not extrapolated"):
        TABLE.interpolate("solohead", budget)


def test_policies_map_to_selections_and_dense_attention_is_exact():
    scenario = load_scenario("default", ["policy.pulseinfer.budget_tokens=512", "policy.headwise.budget_tokens=512"])
    assert [policy_selection(scenario, p) for p in ("sglang", "full_offload", "headwise", "pulseinfer")] == [
        "dense",
        "dense",
        "headwise",
        "solohead",
    ]
    assert policy_accuracy(TABLE, scenario, "sglang")["kl_nats"] == 0.0
    assert policy_accuracy(TABLE, scenario, "headwise")["kl_nats"] == pytest.approx(
        measured("headwise", 512, "kl_nats")
    )
    with pytest.raises(AccuracyError, match="policy pulseinfer"):
        policy_accuracy(TABLE, load_scenario("default"), "pulseinfer")  # preset budget 2048


def test_slo_keys_split_and_bound():
    tail, bounds = split_slo("tpot_p99_ms=50,kl_nats=0.01,mass_pct=90")
    assert (tail, bounds) == ("tpot_p99_ms=50", {"kl_nats": 0.01, "mass_pct": 90.0})
    assert split_slo("kl_nats=0.01") == (None, {"kl_nats": 0.01})
    slo = AccuracySlo(TABLE, bounds)
    assert slo.met({"kl_nats": 0.005, "mass_pct": 95})
    assert not slo.met({"kl_nats": 0.02, "mass_pct": 95})
    assert not slo.met({"kl_nats": 0.005, "mass_pct": 85})
    assert not slo.met({"kl_nats": math.nan, "mass_pct": 95})
    for bad in ("kl_nats=0", "kl_nats=x", "mass_pct=120", "kl_nats=1,kl_nats=2"):
        with pytest.raises(AccuracyError):
            split_slo(bad)


def test_a_bad_table_is_one_error_naming_the_column(tmp_path):
    path = tmp_path / "acc.csv"
    TABLE.frame.drop(columns="kl_nats").to_csv(path, index=False)
    with pytest.raises(AccuracyError, match="kl_nats"):
        load_accuracy_table(path)
    frame = TABLE.frame.astype({"mass_mean": object})
    frame.loc[1, "mass_mean"] = "lots"
    frame.to_csv(path, index=False)
    with pytest.raises(AccuracyError, match="row 3 mass_mean"):
        load_accuracy_table(path)


def test_accuracy_constrained_search_best_meets_the_kl_bound(tmp_path):
    bound = 0.004
    space = parse_space(
        {
            "params": {
                "policy.pulseinfer.budget_tokens": {"low": 256, "high": 1536, "step": 128},
                "policy.pulseinfer.max_running_requests": {"choices": [8, 64]},
            }
        }
    )
    cfg = SearchConfig(
        scenario="default",
        space=space,
        slo=TailSlo(tpot_p99_s=0.5),
        storage=str(tmp_path / "s.journal"),
        study_name="acc",
        objective="throughput",
        overrides=tuple(TINY),
        accuracy=AccuracySlo(TABLE, {"kl_nats": bound}),
    )
    result = collect_results(run_search(cfg, 12), cfg, tmp_path)
    trials = result.trials
    assert result.best is not None and result.best_feasible
    best_budget = result.best["policy.pulseinfer.budget_tokens"]
    assert result.best["kl_nats"] <= bound
    assert TABLE.interpolate("solohead", best_budget)["kl_nats"] <= bound
    outside = trials[trials["policy.pulseinfer.budget_tokens"] > 1024]
    assert (outside["state"] == "FAIL").all() and outside["error"].str.contains("not extrapolated").all()
    inside = trials[trials["state"] == "COMPLETE"]
    assert (inside["feasible"] == (inside["kl_nats"] <= bound) & (inside["tpot_p99_s"] <= 0.5)).all()
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["policy"]["pulseinfer"]["budget_tokens"] == best_budget


def test_pareto_kl_front_trades_throughput_for_kl(tmp_path):
    front = pd.DataFrame(
        {
            "trial": [0, 1, 2, 3],
            "feasible": [True, True, True, False],
            "decode_tokens_per_s": [100.0, 90.0, 80.0, 200.0],
            "kl_nats": [0.01, 0.02, 0.001, 0.0],
        }
    )
    from study.search_results import pareto_front

    assert list(pareto_front(front, "kl_nats")["trial"]) == [0, 2]  # 1 is dominated by 0; 3 is infeasible
    assert np.all(np.diff(pareto_front(front, "kl_nats")["decode_tokens_per_s"]) <= 0)


def test_cli_refuses_a_bad_accuracy_bound_in_one_line(tmp_path, capsys):
    code = main(["search", "default", "--space", "pulseinfer", "--slo", "kl_nats=-1", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --slo: kl_nats")


def test_the_shipped_accuracy_space_stays_inside_the_measured_budgets():
    from study.space import check_space, load_space

    space = load_space("pulseinfer-accuracy")
    check_space(space, "default", [])
    (budget,) = [p for p in space.params if p.key.endswith("budget_tokens")]
    assert TABLE.budgets("solohead")[0] <= budget.low and budget.high <= TABLE.budgets("solohead")[-1]
