"""Shipped model and hardware cards and scenarios validate, and their derived sizes match docs/sources.md."""

from __future__ import annotations

import pytest

from sim.config import GIB, HardwareSpec, ModelSpec
from sim.config.loader import card_names, load_card, load_scenario, scenarios_dir

MODEL_CARDS = card_names("model")
HARDWARE_CARDS = card_names("hardware")
SHIPPED_SCENARIOS = sorted(scenarios_dir().glob("*.yaml")) + sorted(scenarios_dir().glob("examples/*.yaml"))

# docs/sources.md §4: KV bytes per token = 2 (K, V) × layers × KV heads × head_dim × 2 B (bf16).
KV_BYTES_PER_TOKEN = {
    "qwen3-14b": 163840,  # 160 KiB
    "qwen3-30b-a3b": 98304,  # 96 KiB
    "llama-3.1-8b": 131072,  # 128 KiB
    "llama-3.1-70b": 327680,  # 320 KiB
    "qwen2.5-7b": 57344,  # 56 KiB
}


def _model(name: str) -> ModelSpec:
    return ModelSpec.model_validate(load_card("model", name))


def test_every_model_named_in_reference_has_a_card():
    assert set(KV_BYTES_PER_TOKEN) <= set(MODEL_CARDS)


def test_shipped_hardware_includes_h200_and_h100():
    assert {"h200", "h100-sxm"} <= set(HARDWARE_CARDS)


def test_at_least_one_shipped_scenario():
    assert any(p.stem == "default" for p in SHIPPED_SCENARIOS)


@pytest.mark.parametrize("name", MODEL_CARDS)
def test_model_card_validates_and_is_named_after_its_file(name):
    assert _model(name).name == name


@pytest.mark.parametrize("name", HARDWARE_CARDS)
def test_hardware_card_validates_and_is_named_after_its_file(name):
    assert HardwareSpec.model_validate(load_card("hardware", name)).name == name


@pytest.mark.parametrize("name", HARDWARE_CARDS)
def test_hardware_card_is_marked_datasheet_not_measured(name):
    card = HardwareSpec.model_validate(load_card("hardware", name))
    assert card.measured is False
    assert "docs/sources.md" in card.source


@pytest.mark.parametrize(("name", "expected"), sorted(KV_BYTES_PER_TOKEN.items()))
def test_kv_bytes_per_token_matches_reference(name, expected):
    assert _model(name).kv_bytes_per_token == expected


def test_qwen3_14b_weights_are_27_6_gib():
    # docs/sources.md §5.1 worked example: "Qwen3-14B weights ≈ 27.6 GiB".
    assert _model("qwen3-14b").weight_bytes / GIB == pytest.approx(27.6, rel=0.02)


def test_qwen3_30b_a3b_has_30_5b_parameters():
    m = _model("qwen3-30b-a3b")
    total = m.num_layers * m.params_per_layer + m.embedding_params
    assert total == pytest.approx(30.5e9, rel=0.03)


def test_qwen3_30b_a3b_activates_3_3b_parameters_per_token():
    m = _model("qwen3-30b-a3b")
    active = m.num_layers * m.active_params_per_layer + m.embedding_params
    assert active == pytest.approx(3.3e9, rel=0.10)


@pytest.mark.parametrize("path", SHIPPED_SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_loads(path):
    scenario = load_scenario(path)
    assert scenario.model.name in MODEL_CARDS
    assert scenario.hardware.name in HARDWARE_CARDS


@pytest.mark.parametrize("name", HARDWARE_CARDS)
def test_hardware_card_cites_sections_that_exist(name):
    import re

    sources = (scenarios_dir().parent / "docs" / "sources.md").read_text()
    headings = set(re.findall(r"^#+ (\d+(?:\.\d+)?)\.? ", sources, flags=re.M))
    text = (scenarios_dir() / "hardware" / f"{name}.yaml").read_text()
    cited = set(re.findall(r"§(\d+(?:\.\d+)?)", text))
    assert cited and cited <= headings, f"{name} cites {sorted(cited - headings)} missing from docs/sources.md"


@pytest.mark.parametrize("name", HARDWARE_CARDS)
def test_hardware_card_has_node_figures(name):
    card = HardwareSpec.model_validate(load_card("hardware", name))
    # A card either runs tensor parallelism (a GPU-to-GPU link) or says its node holds one GPU.
    assert card.nvlink_bandwidth_gbps is not None or card.gpus_per_node == 1
    assert card.host_dram_gbps_per_socket is not None


@pytest.mark.parametrize("name", HARDWARE_CARDS)
def test_every_card_serves_qwen3_14b(name):
    from sim.run import simulate

    overrides = [f"hardware={name}", "workload.max_requests=4", "policies=sglang,pulseinfer", "run.progress=false"]
    result = simulate(load_scenario("default", overrides))
    assert all(r.summary["finished"] == 4 for r in result.policies.values())


def test_gh200_host_link_is_several_times_pcie_gen5():
    gh200 = HardwareSpec.model_validate(load_card("hardware", "gh200"))
    h200 = HardwareSpec.model_validate(load_card("hardware", "h200"))
    assert gh200.h2d_bandwidth_gbps > 5 * h200.h2d_bandwidth_gbps
