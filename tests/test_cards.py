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
