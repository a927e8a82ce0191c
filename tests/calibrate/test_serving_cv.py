"""Cross-validation of the compute model (calibrate/serving_cv.py) and the fit it repeats per fold
(calibrate/serving_fit.py): groups, folds, no fold's fit sees a case it is scored on, only the cases a value can
reach are re-simulated, and the fit recovers a known truth."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from calibrate import serving_cv as cv
from calibrate import serving_fit as sf
from calibrate.serving_cases import Stat, load_suite, run_serving_case

CHEAP = [  # static batches and short low-concurrency runs: well under a second each
    "trtllm05_l40s_llama2_7b_fp8_tp1_bs16_2048_2048",
    "gpuref_a100_qwen3_30b_a3b_8192_128_c1",
    "gpuref_2xh100_qwen25_72b_8192_128_c1",
]


@pytest.mark.parametrize(
    ("url", "group"),
    [
        ("https://github.com/NVIDIA/TensorRT-LLM/blob/abc/docs/perf.md", "nvidia"),
        ("https://github.com/vllm-project/vllm/pull/2542", "vllm-project"),
        ("https://github.com/vllm-project/vllm-project.github.io/blob/x/_posts/a.md", "vllm-project"),
        ("arXiv:2406.10774 (Quest), Figure 10(a)", "arXiv:2406.10774"),
        ("https://www.example.com/blog/post", "example.com"),
    ],
)
def test_a_source_is_its_publisher(url, group):
    assert cv.source_group(url) == group


@pytest.mark.parametrize(
    ("model", "family"),
    [("qwen2.5-72b", "qwen"), ("qwen3-235b-a22b", "qwen"), ("llama-3.1-8b", "llama"), ("lwm-7b", "llama"),
     ("mixtral-8x7b", "mixtral"), ("deepseek-v3", "deepseek")],
)  # fmt: skip
def test_a_model_card_names_its_family(model, family):
    assert cv.model_family(model) == family


@pytest.mark.parametrize("by", cv.CV_BY)
def test_folds_hold_every_group_once_and_are_balanced(by):
    cases = [c for c in load_suite() if not c.not_modelled]
    groups = {cv.group_of(c, by) for c in cases}
    one_each = cv.make_folds(cases, by)
    assert sorted(g for f in one_each for g in f) == sorted(groups) and all(len(f) == 1 for f in one_each)
    dealt = cv.make_folds(cases, by, 2)
    assert len(dealt) == 2 and sorted(g for f in dealt for g in f) == sorted(groups)
    sizes = [sum(cv.group_of(c, by) in f for c in cases) for f in dealt]
    largest = max(sum(cv.group_of(c, by) == g for c in cases) for g in groups)
    assert abs(sizes[0] - sizes[1]) <= largest  # greedy dealing: off by at most one group
    assert cv.make_folds(cases, by, 2) == dealt  # deterministic


def test_the_suite_spans_what_cross_validation_needs():
    """≥ 100 modelled cases, ≥ 6 cards, ≥ 8 model families, MoE with small and large experts and MLA, ≥ 15 cases
    at ≥ 32K prompts."""
    from sim.config.loader import load_card

    cases = [c for c in load_suite() if not c.not_modelled]
    assert len(cases) >= 100
    assert len({c.setup.hardware for c in cases}) >= 6
    assert len({cv.model_family(c.setup.model) for c in cases}) >= 8
    models = {c.setup.model for c in cases}
    assert {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b"} <= models
    assert any(load_card("model", m).get("kv_lora_rank") for m in models)
    assert sum(c.setup.input_tokens >= 32_768 for c in cases) >= 15


def test_no_fold_is_fitted_on_a_case_it_is_scored_on(monkeypatch):
    seen: list[set[str]] = []

    def fake_fit(iterations, jobs, cases=None, **_):
        seen.append({c.name for c in cases})
        return sf.FitResult(sf.prior_start(), 0.0, 0)

    monkeypatch.setattr(cv, "fit_serving", fake_fit)
    monkeypatch.setattr(cv, "suite_rows_for", lambda cases, params, jobs: [
        {**dict.fromkeys(["set", "engine", "metric", "group", "stat", "note"], ""), "case": c.name, "measured": 1.0,
         "simulated": 1.0, "error_pct": 0.0, "by_construction": False, "verdict": "compared"} for c in cases
    ])  # fmt: skip
    rows, params = cv.cross_validate("card", only=CHEAP)
    assert len(seen) == 3
    for fold, fitted_on in enumerate(seen):
        held = set(rows.loc[rows["fold"] == fold, "case"])
        assert held and not held & fitted_on
        assert held | fitted_on == set(CHEAP)
    assert set(params["fold"]) == {0, 1, 2}


def test_a_value_reaches_only_the_cases_it_can_change():
    keys = {c.name: sf.case_key(c) for c in load_suite(CHEAP)}
    moe, dense_fp8 = (
        keys["gpuref_a100_qwen3_30b_a3b_8192_128_c1"],
        keys["trtllm05_l40s_llama2_7b_fp8_tp1_bs16_2048_2048"],
    )
    assert sf.affects("moe_half_bytes", moe) and not sf.affects("moe_half_bytes", dense_fp8)
    assert sf.affects("prefill_mfu@ampere", moe) and not sf.affects("prefill_mfu@ampere", dense_fp8)
    assert not sf.affects("prefill_mfu@ada", dense_fp8)  # FP8 weights: their GEMMs take fp8_mfu, not prefill_mfu
    assert sf.affects("fp8_mfu", dense_fp8) and not sf.affects("fp8_mfu", moe)
    assert sf.affects("engine.trtllm-0.5.step_serial_us", dense_fp8)
    assert not sf.affects("engine.trtllm-0.5.step_serial_us", moe)
    assert sf.affects("hbm_efficiency", moe) and sf.affects("hbm_efficiency", dense_fp8)
    assert sf.overrides_for({"prefill_mfu@ampere": 0.4, "prefill_mfu@hopper": 0.3}, None, "hopper") == [
        "hardware.prefill_mfu=0.3"
    ]


def test_a_changed_value_resimulates_only_its_cases():
    cases = load_suite(CHEAP)
    runner = sf.CaseRunner(cases)
    start = sf.prior_start()
    runner.rows(start)
    assert runner.simulations == 3
    runner.rows({**start, "moe_half_bytes": 5e6})  # one MoE case
    assert runner.simulations == 4
    runner.rows({**start, "hbm_efficiency": 0.7})  # every case
    assert runner.simulations == 7
    runner.rows(start)  # cached
    assert runner.simulations == 7


def test_the_fit_recovers_a_known_truth():
    """Cases whose 'measured' values are the simulator's own at hbm_efficiency 0.7: fitting that value alone from
    the prior (0.8) finds 0.7."""
    truth = {**sf.prior_start(), "hbm_efficiency": 0.7}
    made = []
    for case in load_suite(CHEAP[:2]):
        key = sf.case_key(case)
        rows = run_serving_case(case, sf.overrides_for(truth, key.engine, key.arch))
        measured = case.measured.model_copy(update={
            r["metric"]: (Stat(value=r["simulated"], stat=r["stat"]) if r["stat"] else r["simulated"]) for r in rows
        })  # fmt: skip
        made.append(case.model_copy(update={"measured": measured}))
    fit = sf.fit_serving(iterations=6, cases=made, only=["hbm_efficiency"])
    assert fit.params["hbm_efficiency"] == pytest.approx(0.7, rel=0.01)
    assert fit.loss < 0.005 and fit.at_bound == [] and fit.uninformed == []


def test_a_value_at_its_bound_is_reported():
    """Measured values 3× slower than any card can be: the HBM efficiency runs to its lower bound and says so."""
    made = []
    for case in load_suite(CHEAP[:1]):
        rows = run_serving_case(case, sf.overrides_for(sf.prior_start(), "trtllm-0.5", "ada"))
        measured = case.measured.model_copy(update={r["metric"]: r["simulated"] / 3 for r in rows})
        made.append(case.model_copy(update={"measured": measured}))
    fit = sf.fit_serving(iterations=4, cases=made, only=["hbm_efficiency", "moe_layer_us"])
    assert fit.at_bound == ["hbm_efficiency"]
    assert fit.uninformed == ["moe_layer_us"]  # no MoE case: nothing informs it


def test_the_report_adds_moe_and_long_context_groups():
    moe, fp8, tp2 = CHEAP[1], CHEAP[0], CHEAP[2]
    rows = pd.DataFrame([
        {"case": moe, "metric": "tpot_ms", "group": "per_token", "verdict": "compared", "error_pct": -20.0},
        {"case": fp8, "metric": "output_throughput_tok_s", "group": "throughput", "verdict": "compared",
         "error_pct": 10.0},
        {"case": tp2, "metric": "tpot_ms", "group": "per_token", "verdict": "compared", "error_pct": math.nan},
    ])  # fmt: skip
    report = cv.cv_report(rows).set_index("group")
    assert report.loc["per_token", "mape_pct"] == 20.0 and report.loc["per_token", "mean_signed_pct"] == -20.0
    assert report.loc["per_token_moe", "cases"] == 1 and "per_token_32k" not in report.index
    assert report.loc["throughput", "mape_pct"] == 10.0


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--cv", "source"], "needs --suite serving"),
        (["--suite", "serving", "--cv", "card", "--folds", "1"], "--folds 1: must be >= 2"),
        (["--suite", "serving", "--cv", "card", "--iterations", "0"], "--iterations 0: must be >= 1"),
        (["--suite", "serving", "--cv", "card", "--only", CHEAP[0]], "cross-validation needs two or more"),
        (["--suite", "serving", "--cv", "card", "--only", "nope"], "unknown serving case 'nope'"),
    ],
)
def test_cv_refuses_what_it_cannot_do_in_one_line(argv, words, tmp_path, capsys):
    from pulseinfer.cli import main

    assert main(["cases", *argv, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_cv_writes_its_tables(tmp_path, monkeypatch):
    """Two cheap cases on two cards, each fold's fit one evaluation: the folder holds every held-out row."""
    from pulseinfer.cli import main

    out = tmp_path / "o"
    argv = ["cases", "--suite", "serving", "--cv", "card", "--only", ",".join(CHEAP[:2]), "--iterations", "1"]
    assert main([*argv, "--jobs", "1", "--out", str(out), "--no-progress"]) == 0
    rows = pd.read_csv(out / "cv.csv")
    assert set(rows["case"]) == set(CHEAP[:2]) and set(rows["fold"]) == {0, 1}
    assert set(rows["cv_group"]) == {"l40s", "a100-80gb"} and set(rows["group"]) <= {"per_token", "ttft", "throughput"}
    assert {"group", "mape_pct", "worst_case"} <= set(pd.read_csv(out / "cv_report.csv").columns)
    assert set(pd.read_csv(out / "cv_params.csv")["fold"]) == {0, 1}


def test_calibrate_serving_refuses_a_bad_iteration_count(tmp_path, capsys):
    from pulseinfer.cli import main

    assert main(["calibrate", "serving", "--iterations", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--iterations 0: must be >= 1" in capsys.readouterr().err
