"""The serving-measurement suite (calibrate/serving_cases.py): every shipped case loads and rebuilds as a scenario,
the fit/check split is what docs/sources.md §11 says, and the metrics follow the benchmark tools' definitions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibrate import serving_cases as sc
from sim.config import EngineSpec, load_scenario
from sim.config.loader import load_card


@pytest.fixture(scope="module")
def suite() -> list[sc.ServingCase]:
    return sc.load_suite()


def test_the_suite_is_large_and_covers_cards_models_tp_and_contexts(suite):
    modelled = [c for c in suite if not c.not_modelled]
    assert len(suite) >= 30 and len(modelled) >= 25
    assert len({c.setup.hardware for c in modelled}) >= 4
    assert len({c.setup.model for c in modelled}) >= 5
    assert {c.setup.tp_size for c in modelled} >= {1, 2, 4, 8}
    contexts = [c.setup.input_tokens for c in modelled]
    assert min(contexts) <= 1024 and max(contexts) >= 32000
    assert any(c.setup.model.startswith("qwen3-235b") or "30b-a3b" in c.setup.model for c in modelled)  # MoE
    assert sum(c.offloaded for c in suite) >= 5


def test_fit_is_at_most_60_percent_and_every_case_is_in_one_set(suite):
    modelled = [c for c in suite if not c.not_modelled]
    fit = [c for c in modelled if c.set == "fit"]
    assert 0 < len(fit) <= 0.6 * len(modelled)
    assert all(c.set != "fit" for c in suite if c.not_modelled)  # never fitted, reported as not modelled
    cards_in_both = {c.setup.hardware for c in fit} & {c.setup.hardware for c in modelled if c.set == "check"}
    assert len(cards_in_both) >= 3


def test_every_case_names_its_source_and_a_not_modelled_case_says_why(suite):
    for c in suite:
        assert c.source.url and c.source.quote
        if c.not_modelled:
            assert len(c.not_modelled) > 20


def test_every_modelled_case_rebuilds_as_a_valid_scenario(suite):
    for c in suite:
        if c.not_modelled:
            continue
        scn = load_scenario("default", sc.case_overrides(c))
        assert scn.model.name == c.setup.model and scn.serving.tp_size == c.setup.tp_size
        assert scn.workload.synthetic.num_requests == c.setup.num_requests
        assert scn.engine.name == sc.engine_card(c.engine)  # the declared release's line
        if c.setup.prefill == "colocated":
            line = EngineSpec.model_validate(load_card("engine", c.engine))
            auto = line.chunked_above_max_seq_len is not None and scn.model.max_seq_len > line.chunked_above_max_seq_len
            wanted = (line.mixed_prefill or auto) if c.setup.mixed_prefill is None else c.setup.mixed_prefill
            assert scn.serving.mixed_prefill == wanted


FLAGS = {  # a case's scheduler key → the launch flags that set it (vLLM, SGLang, TensorRT-LLM spellings)
    "chunked_prefill_tokens": ("--chunked-prefill-size", "--max-num-batched-tokens", "--max_num_tokens"),
    "max_running_requests": ("--max-running-requests", "--max-num-seqs", "max_batch_size", "--max-batch-size"),
    "mixed_prefill": ("--enable-mixed-chunk", "--enable-chunked-prefill", "--no-enable-chunked-prefill"),
}


def test_a_case_sets_a_scheduler_knob_only_where_its_published_command_did(suite):
    """The engine card gives the defaults; a case overrides one only with the flag its source quotes."""
    for c in suite:
        for key, flags in FLAGS.items():
            if getattr(c.setup, key) is not None and c.setup.load.kind != "batch":
                assert any(flag in c.source.quote for flag in flags), f"{c.name}: {key} without a quoted flag"


def test_a_length_spread_becomes_lognormal_lengths_of_the_same_cv(suite):
    """A source's ±15 % random range is rebuilt with cv 0.15 / √3 (a uniform spread's); fixed lengths stay fixed."""
    spread = [c for c in suite if c.setup.length_spread and c.name.startswith("vllmblog_")]
    assert spread
    scn = load_scenario("default", sc.case_overrides(spread[0]))
    assert scn.workload.synthetic.prompt_tokens_cv == pytest.approx(0.15 / np.sqrt(3))
    assert scn.workload.synthetic.output_tokens_cv == pytest.approx(0.15 / np.sqrt(3))
    fixed = next(c for c in suite if not c.setup.length_spread and not c.not_modelled)
    scn = load_scenario("default", sc.case_overrides(fixed))
    assert scn.workload.synthetic.prompt_tokens_cv == 0 and scn.workload.synthetic.output_tokens_cv == 0


def test_a_spread_case_leaves_room_for_its_longest_request(suite):
    """Lognormal lengths have no upper bound: the rebuilt context must hold every drawn request (a refused request
    would be left out of the metrics)."""
    from sim.workload import load_workload

    for case in (c for c in suite if c.setup.length_spread):
        scn = load_scenario("default", sc.case_overrides(case))
        table = load_workload(scn)
        assert int((table["prompt_tokens"] + table["output_tokens"]).max()) < scn.model.max_seq_len, case.name


def test_a_case_whose_requests_are_refused_fails_loudly():
    """Metrics are computed over finished requests, so a rebuild that refuses some would silently drop them."""
    (case,) = sc.load_suite(["vllmbench_h200_llama31_8b_fp8_vllm082_1000_2000"])
    setup = case.setup.model_copy(update={"num_requests": 4, "overrides": ["model.max_seq_len=2500"]})
    short = case.model_copy(update={"setup": setup})
    with pytest.raises(sc.ServingCaseError, match=r"refused requests \(\d+ exceeds_max_seq_len; max_seq_len 2500,"):
        sc.run_serving_case(short)


def test_a_case_refused_for_its_kv_pool_names_the_pool_size():
    """The refusal names the simulated GPU's KV pool: 13 GiB of HBM, vLLM 0.8 takes 90 % of it, less the weights and
    its reserve (sim/config/engine.py KvMemory)."""
    (case,) = sc.load_suite(["vllmbench_h200_llama31_8b_fp8_vllm082_32000_100"])
    setup = case.setup.model_copy(update={"num_requests": 2, "overrides": ["hardware.hbm_gib=13"]})
    small = case.model_copy(update={"setup": setup})
    scn = load_scenario("default", sc.case_overrides(small))
    pool_gib = (scn.hardware.hbm_bytes - scn.hardware.reserve_bytes - scn.model.weight_bytes) / 2**30
    assert 0 < pool_gib < 32100 * scn.model.kv_bytes_per_token / 2**30  # the 32K prompt cannot fit
    with pytest.raises(sc.ServingCaseError, match=rf"refused requests .*KV pool of {pool_gib:.2f} GiB"):
        sc.run_serving_case(small)


@pytest.mark.parametrize(
    ("key", "value", "says"), [("num_requests", True, "boolean true"), ("length_spread", float("nan"), "finite number")]
)
def test_a_case_file_refuses_booleans_and_nan_as_numbers(tmp_path, key, value, says):
    data = __import__("yaml").safe_load((sc.serving_cases_dir() / f"{sc.serving_case_names()[0]}.yaml").read_text())
    data["setup"][key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(__import__("yaml").safe_dump(data))
    with pytest.raises(sc.ServingCaseError, match=says) as err:
        sc.load_serving_case(path)
    assert str(path) in str(err.value) and key in str(err.value) and "\n" not in str(err.value)


def test_a_case_file_without_metrics_is_refused_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    text = (sc.serving_cases_dir() / f"{sc.serving_case_names()[0]}.yaml").read_text()
    data = __import__("yaml").safe_load(text)
    data["measured"] = {}
    path.write_text(__import__("yaml").safe_dump(data))
    with pytest.raises(sc.ServingCaseError, match="measured: no metric given"):
        sc.load_serving_case(path)


def test_weighted_median_and_mean_pool_tokens_by_batch():
    values, weights = np.array([1.0, 10.0]), np.array([9.0, 1.0])
    assert sc._stat(values, weights, "median") == 1.0
    assert sc._stat(values, weights, "mean") == pytest.approx(1.9)
    assert sc._stat(values, None, "median") == pytest.approx(5.5)


def test_token_gaps_include_the_prefill_between_two_decode_steps():
    steps = pd.DataFrame({
        "phase": ["decode", "prefill", "decode", "decode"], "start_s": [0.0, 0.01, 0.21, 0.22],
        "duration_s": [0.01, 0.2, 0.01, 0.01], "batch_size": [2, 1, 3, 3],
    })  # fmt: skip
    gaps, weights = sc._token_gaps(steps)
    assert gaps == pytest.approx([0.21, 0.01]) and list(weights) == [3.0, 3.0]


def test_a_static_batch_case_is_simulated_and_compared():
    case = next(c for c in sc.load_suite() if c.name == "trtllm061_a100_llama2_7b_fp16_tp1_bs60_128_2048")
    (row,) = sc.run_serving_case(case)
    assert row["verdict"] == "compared" and np.isfinite(row["simulated"]) and row["simulated"] > 0
    assert row["error_pct"] == pytest.approx((row["simulated"] - row["measured"]) / row["measured"] * 100)


def test_the_report_leaves_out_not_modelled_and_by_construction_rows():
    cols = ["case", "metric", "error_pct", "verdict"]
    rows = pd.DataFrame(
        [("a", "tpot_ms", 10.0, "compared"), ("b", "itl_ms", -30.0, "compared"),
         ("c", "tpot_ms", 90.0, "by_construction"), ("d", "tpot_ms", np.nan, "not_modelled")],
        columns=cols,
    ).assign(set="check", group="per_token")  # fmt: skip
    report = sc.suite_report(rows).set_index("group")
    assert report.loc["per_token", "compared"] == 2 and report.loc["per_token", "left_out"] == 2
    assert report.loc["per_token", "mape_pct"] == pytest.approx(20.0)
    assert report.loc["per_token", "mean_signed_pct"] == pytest.approx(-10.0)
    assert report.loc["per_token", "worst_case"].startswith("b")
