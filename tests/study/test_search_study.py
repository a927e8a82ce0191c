"""Optuna search: deterministic per seed, resumable, shared by worker processes; outputs and Pareto front."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from pulseinfer.cli import main
from sim.config import load_scenario
from sim.run import simulate
from study.search import SearchError, StudyMismatch, run_search
from study.search_results import collect_results, pareto_front
from study.slo import TailSlo
from study.space import parse_space


def _trials(cfg, total: int, jobs: int = 1) -> pd.DataFrame:
    return collect_results(run_search(cfg, total, jobs), cfg).trials


def test_search_is_deterministic_per_seed_and_writes_three_files(tiny_config, tmp_path):
    first = collect_results(run_search(tiny_config("a"), 4), tiny_config("a"), tmp_path / "out")
    second = _trials(tiny_config("b"), 4)
    pd.testing.assert_frame_equal(first.trials, second)
    assert list(first.trials["trial"]) == [0, 1, 2, 3]
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"trials.csv", "pareto.csv", "best.yaml"}
    written = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert {"trial", "state", "feasible", "policy.pulseinfer.budget_tokens", "tpot_p99_s"} <= set(written.columns)


def test_a_different_seed_draws_different_parameters(tiny_config):
    keys = ["policy.pulseinfer.budget_tokens", "policy.pulseinfer.max_running_requests"]
    a = _trials(tiny_config("a", seed=0), 4)[keys]
    b = _trials(tiny_config("b", seed=1), 4)[keys]
    assert not a.equals(b)


def test_trial_metrics_depend_only_on_parameters(tiny_config):
    trials = _trials(tiny_config(), 6)
    keys = ["policy.pulseinfer.budget_tokens", "policy.pulseinfer.max_running_requests"]
    for _, group in trials.groupby(keys):
        assert group["decode_tokens_per_s"].nunique() == 1


def test_best_yaml_loads_and_simulates_with_every_policy(tiny_config, tmp_path):
    cfg = tiny_config()
    result = collect_results(run_search(cfg, 4), cfg, tmp_path)
    scenario = load_scenario(tmp_path / "best.yaml")
    best = result.best
    assert scenario.policies == ["pulseinfer", "sglang", "full_offload", "headwise"]  # tuned one first
    assert scenario.policy["pulseinfer"].budget_tokens == best["policy.pulseinfer.budget_tokens"]
    assert scenario.slo.tpot_ms == pytest.approx(2000.0)  # the search's SLO (tests/study/conftest.py)
    summary = simulate(scenario).summary.set_index("policy")
    for col in ("decode_tokens_per_s", "tpot_p99_s", "goodput_requests_per_s"):
        assert summary.loc["pulseinfer", col] == best[col]  # the trial, reproduced exactly


def test_resume_continues_the_same_study(tiny_config):
    cfg = tiny_config("resumed")
    before = _trials(cfg, 3)
    after = _trials(cfg, 5)
    assert list(after["trial"]) == [0, 1, 2, 3, 4]
    pd.testing.assert_frame_equal(after.iloc[:3], before)
    assert len(_trials(cfg, 5)) == 5  # already full: nothing more runs


def test_resume_with_another_space_is_an_error(tiny_config):
    cfg = tiny_config("s")
    run_search(cfg, 1)
    other = dataclasses.replace(
        cfg, space=parse_space({"params": {"policy.pulseinfer.budget_tokens": {"choices": [512]}}})
    )
    with pytest.raises(StudyMismatch, match="space"):
        run_search(other, 2)


def test_two_worker_processes_share_one_journal_study(tiny_config):
    trials = _trials(tiny_config("parallel"), 6, jobs=2)
    assert sorted(trials["trial"]) == list(range(6))  # every trial recorded once, none lost
    assert (trials["state"] == "COMPLETE").all()
    assert trials["decode_tokens_per_s"].notna().all()


def test_invalid_parameter_combination_fails_the_trial_and_the_search_goes_on(tiny_config):
    # budget 4096 > recall_buffer_blocks (16) × block_size (16): every trial is invalid.
    space = parse_space(
        {
            "params": {
                "policy.pulseinfer.budget_tokens": {"choices": [4096]},
                "policy.pulseinfer.recall_buffer_blocks": {"choices": [16]},
            }
        }
    )
    cfg = dataclasses.replace(tiny_config("invalid"), space=space)
    result = collect_results(run_search(cfg, 2), cfg)
    assert list(result.trials["state"]) == ["FAIL", "FAIL"]
    assert result.trials["error"].str.contains("recall_buffer_blocks").all()
    assert result.best is None


def _toy_evaluate(params: dict) -> dict:
    """Known optimum: goodput = x + 2·[y == "b"], TPOT p99 = x / 100 s; with TPOT p99 <= 75 ms, x = 7, y = b."""
    x, y = params["toy.x"], params["toy.y"]
    return {
        "goodput_requests_per_s": x + (2.0 if y == "b" else 0.0),
        "decode_tokens_per_s": 100.0 * x,
        "tpot_p99_s": x / 100,
        "ttft_p99_s": 1.0,
        "finished": 10,
        "incomplete": 0,
    }


def test_search_finds_a_known_constrained_optimum_within_the_budget(tiny_config):
    space = parse_space(
        {"policy": "pulseinfer", "params": {"toy.x": {"low": 0, "high": 10}, "toy.y": {"choices": ["a", "b", "c"]}}}
    )
    cfg = dataclasses.replace(tiny_config("toy"), space=space, slo=TailSlo(tpot_p99_s=0.075))
    result = collect_results(run_search(cfg, 30, evaluate=_toy_evaluate), cfg)
    assert result.best_feasible
    assert (result.best["toy.x"], result.best["toy.y"]) == (7, "b")


def test_pareto_rows_are_feasible_and_non_dominated(tiny_config):
    cfg = tiny_config("pareto", objective="pareto")
    result = collect_results(run_search(cfg, 8), cfg)
    front, trials = result.pareto, result.trials
    assert len(front) >= 1 and front["feasible"].all()
    feasible = trials[trials["feasible"]]
    for _, row in front.iterrows():
        better = (feasible["decode_tokens_per_s"] >= row["decode_tokens_per_s"]) & (
            feasible["tpot_p99_s"] <= row["tpot_p99_s"]
        )
        strictly = (feasible["decode_tokens_per_s"] > row["decode_tokens_per_s"]) | (
            feasible["tpot_p99_s"] < row["tpot_p99_s"]
        )
        assert not (better & strictly).any()


def test_pareto_front_of_a_known_table():
    table = pd.DataFrame(
        {
            "trial": [0, 1, 2, 3, 4],
            "feasible": [True, True, True, True, False],
            "decode_tokens_per_s": [100.0, 200.0, 150.0, 200.0, 900.0],
            "tpot_p99_s": [0.01, 0.05, 0.06, 0.04, 0.001],
        }
    )
    assert list(pareto_front(table)["trial"]) == [3, 0]  # 1 and 2 are dominated by 3; 4 is infeasible
    assert np.all(np.diff(pareto_front(table)["decode_tokens_per_s"]) <= 0)


def test_search_cli_writes_outputs_and_resumes(tmp_path, tiny_overrides, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  policy.pulseinfer.max_running_requests: {choices: [2, 8]}\n")
    sets = [arg for item in tiny_overrides for arg in ("--set", item)]
    argv = ["search", "--space", str(space), "--slo", "tpot_p99_ms=2000", "--out", str(tmp_path / "o"), "--no-progress"]
    assert main([*argv, "--trials", "2", *sets]) == 0
    assert main([*argv, "--trials", "3", *sets]) == 0
    assert len(pd.read_csv(tmp_path / "o" / "trials.csv")) == 3
    assert (tmp_path / "o" / "study.journal").is_file()
    assert "best: trial" in capsys.readouterr().out


def test_an_rdb_url_holds_the_study_too(tiny_config, tmp_path):
    cfg = tiny_config("rdb", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert len(_trials(cfg, 2)) == 2
    assert len(_trials(cfg, 3)) == 3


def test_search_cli_unusable_storage_exits_2(tmp_path, capsys):
    argv = ["search", "--space", "pulseinfer", "--storage", "nosuchdb://host/db", "--out", str(tmp_path / "o")]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --storage nosuchdb://host/db") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "content", [b"PRECIOUS\n", b"[1, 2]\n", b'{"no_op_code": 1}\n', b"\xff\xfe\n", b"\n{}\n"], ids=repr
)
def test_search_cli_refuses_a_storage_file_that_is_no_journal_and_leaves_it_untouched(tmp_path, capsys, content):
    """Issue 30: a user's file given as --storage got a traceback from Optuna's reader and an Optuna line appended."""
    mine = tmp_path / "prec.txt"
    mine.write_bytes(content)
    argv = ["search", "--space", "pulseinfer", "--trials", "1", "--storage", str(mine), "--out", str(tmp_path / "o")]
    assert main([*argv, "--no-progress", "--set", "workload.max_requests=20"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --storage: {mine} is not an Optuna journal") and len(err.splitlines()) == 1
    assert mine.read_bytes() == content
    assert not (tmp_path / "o").exists()


def test_a_journal_storage_may_be_absent_empty_or_a_study_journal(tiny_config, tmp_path):
    from study.search import check_journal_file

    journal = tmp_path / "j.journal"
    check_journal_file(str(journal))  # absent
    journal.touch()
    check_journal_file(str(journal))  # empty
    cfg = tiny_config("journal", storage=str(journal))
    assert len(_trials(cfg, 1)) == 1
    check_journal_file(str(journal))  # written by Optuna
    with pytest.raises(SearchError, match="is not a file") as info:
        check_journal_file(str(tmp_path))
    assert info.value.field == "storage"
