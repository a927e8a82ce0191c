"""The serving fit's parameters (calibrate/serving_fit.py): the card's values go on every case's hardware card, an
engine's values only on the cases run on that engine's card, and each case runs on the engine card its ``engine``
string names (calibrate/serving_cases.py ``engine_card``)."""

from __future__ import annotations

import pytest

from calibrate import serving_cases as sc
from calibrate import serving_fit as sf
from sim.config import load_scenario


@pytest.mark.parametrize(
    ("engine", "card"),
    [
        ("vllm-0.8.2", "vllm-0.8"),
        ("vllm 0.8.4", "vllm-0.8"),
        ("vllm-0.11.2.dev358", "vllm-0.11"),
        ("vllm-0.5", "vllm-0.5"),
        ("vllm-0.4.2", "vllm-0.5"),  # older than every line: the oldest
        ("trtllm-0.6.1", "trtllm-0.5"),
        ("TensorRT-LLM v1.2.0rc1", "trtllm-1.0"),
        ("sglang-0.4.3.post4", "sglang-0.4"),
        ("sglang-0.5.5.post1", "sglang-0.5"),
        ("generic", "generic"),
    ],
)
def test_a_cases_engine_string_names_its_engine_card(engine, card):
    assert sc.engine_card(engine) == card


def test_every_modelled_case_runs_on_its_engine_card():
    for case in sc.load_suite():
        if case.not_modelled:
            continue
        scn = load_scenario("default", sc.case_overrides(case))
        assert scn.engine.name == sc.engine_card(case.engine), case.name


def test_engine_values_go_only_on_their_engines_cases():
    params = {"hbm_efficiency": 0.9, "engine.vllm-0.8.request_overlapped_us": 120.0}
    assert sf.overrides_for(params, "vllm-0.8") == ["hardware.hbm_efficiency=0.9", "engine.request_overlapped_us=120.0"]
    assert sf.overrides_for(params, "trtllm") == ["hardware.hbm_efficiency=0.9"]
    assert sf.card_params(params) == {"hbm_efficiency": 0.9}
    assert sf.engine_params(params) == {"vllm-0.8": {"request_overlapped_us": 120.0}}
    (case,) = sc.load_suite(["vllmbench_h200_llama31_8b_fp8_vllm082_10000_500"])
    scn = load_scenario("default", [*sc.case_overrides(case), *sf.overrides_for(params, "vllm-0.8")])
    assert scn.engine.request_overlapped_us == 120.0 and scn.hardware.hbm_efficiency == 0.9


def test_fitted_engines_have_fit_cases_and_the_start_is_within_bounds():
    fit_engines = {sc.engine_card(c.engine) for c in sc.load_suite() if not c.not_modelled}
    assert set(sf.ENGINE_FIT_PARAMETERS) <= fit_engines  # an engine without fit cases is not fitted
    start = sf.shipped_start()
    assert start.keys() == sf.PARAMETERS.keys()
    for name, value in start.items():
        lo, hi, _ = sf.PARAMETERS[name]
        assert lo <= value <= hi, name


def test_the_first_trial_reads_a_card_as_the_simulator_does(tmp_path):
    """A card without fp8_mfu / attn_mfu starts the fit at the efficiency the compute model falls back to
    (prefill_mfu)."""
    import yaml

    from sim.config.loader import load_card

    card = {k: v for k, v in load_card("hardware", "h200").items() if k not in ("fp8_mfu", "attn_mfu")}
    card["prefill_mfu"], card["decode_step_overhead_us"] = 0.61, 777.0
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(card))
    start = sf.shipped_start(str(path))
    assert start["fp8_mfu"] == start["attn_mfu"] == 0.61
    assert start["decode_step_overhead_us"] == 777.0
