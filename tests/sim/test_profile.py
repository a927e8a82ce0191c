"""Calibrated profiles in the simulator: loading, precedence, compute, selection cost, inline I/O, recall stats."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from sim.config import Profile
from sim.config.loader import ScenarioError, load_card, load_scenario
from sim.config.profiles import load_profile
from sim.policies import make_policy
from sim.run import simulate_policy
from sim.step.compute import ComputeModel
from sim.step.link import LinkModel
from sim.step.recall import RecallModel
from tests.sim.oracles import recall_step

COMPUTE = {
    "model": "qwen3-14b",
    "layer_base_us": 500.0,
    "layer_per_request_us": 20.0,
    "layer_per_token_ns": 3.0,
    "head_base_us": 700.0,
    "head_per_request_us": 10.0,
}


def _profile(tmp_path, **sections) -> str:
    hardware = {**load_card("hardware", "h200"), "name": "calibrated-h200", "measured": True}
    data = {"name": "test", "hardware": hardware, "model": load_card("model", "qwen3-14b"), **sections}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return str(path)


def _scenario(tmp_path, profile: str, extra: dict | None = None, overrides: list[str] | None = None):
    raw = {
        "name": "profiled",
        "profile": profile,
        "workload": {
            "trace": None,
            "synthetic": {"num_requests": 6, "rate_per_s": 50, "prompt_tokens_mean": 20000, "output_tokens_mean": 50},
        },
        "serving": {"prefill": "disaggregated"},
        "policies": ["sglang", "pulseinfer"],
        "run": {"progress": False},
        **(extra or {}),
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_scenario(str(path), overrides)


def test_profile_fills_hardware_model_and_compute(tmp_path):
    scenario = _scenario(tmp_path, _profile(tmp_path, compute=COMPUTE))
    assert scenario.hardware.name == "calibrated-h200" and scenario.hardware.measured
    assert scenario.model.name == "qwen3-14b"
    compute = ComputeModel(scenario.model, scenario.hardware, scenario.profile.compute)
    # by hand: 500 us + 20 us * 4 + 3 ns * 10,000 = 610 us; head 700 + 10 * 4 = 740 us; no separate overhead
    assert compute.decode_layer_s(4, 10_000) == pytest.approx(610e-6)
    assert compute.decode_head_s(4) == pytest.approx(740e-6)
    assert compute.step_overhead_s == 0.0
    policy = make_policy(scenario, "sglang")
    assert policy.compute.decode_layer_s(4, 10_000) == pytest.approx(610e-6)


def test_folder_and_override_name_the_profile(tmp_path):
    path = _profile(tmp_path, compute=COMPUTE)
    assert load_profile(tmp_path).compute.layer_base_us == 500.0  # a calibration folder works as well
    scenario = _scenario(tmp_path, None, overrides=[f"profile={path}"])
    assert scenario.hardware.name == "calibrated-h200"


def test_profile_compute_for_another_model_is_refused(tmp_path):
    profile = _profile(tmp_path, compute={**COMPUTE, "model": "llama-3.1-8b"})
    data = yaml.safe_load(open(profile))
    data["model"] = load_card("model", "llama-3.1-8b")
    open(profile, "w").write(yaml.safe_dump(data))
    with pytest.raises(ScenarioError, match="measured on model 'llama-3.1-8b'"):
        _scenario(tmp_path, profile, {"model": "qwen3-14b"})


def test_hardware_card_and_profile_hardware_conflict(tmp_path):
    profile = _profile(tmp_path)
    with pytest.raises(ScenarioError, match="hardware: the scenario names 'h100-sxm'"):
        _scenario(tmp_path, profile, {"hardware": "h100-sxm"})


def test_bad_profile_field_is_one_line(tmp_path):
    profile = _profile(tmp_path, compute={**COMPUTE, "layer_base_us": -1})
    with pytest.raises(ScenarioError) as err:
        load_profile(profile)
    assert "compute.layer_base_us" in str(err.value) and "\n" not in str(err.value)


def test_selection_profile_replaces_summary_tokens(tmp_path):
    selection = {"base_us": 100.0, "per_block_ns": 50.0}
    with_sel = _scenario(tmp_path, _profile(tmp_path, compute=COMPUTE, selection=selection))
    without = _scenario(tmp_path, _profile(tmp_path, compute=COMPUTE))
    ctx = np.array([20_000, 40_000])
    offloaded = np.array([True, True])
    cold = np.zeros(2, dtype=bool)
    a = make_policy(with_sel, "pulseinfer").step_cost(ctx, offloaded, cold, np.random.default_rng(0))
    b = make_policy(without, "pulseinfer").step_cost(ctx, offloaded, cold, np.random.default_rng(0))
    pol = with_sel.policy["pulseinfer"]
    sparse = pol.sink_tokens + pol.recent_tokens + pol.budget_tokens
    candidates = ((ctx - pol.sink_tokens - pol.recent_tokens) // pol.block_size).sum()
    assert a.attended_tokens == 2 * sparse
    assert b.attended_tokens == 2 * sparse + (-(-ctx // pol.block_size)).sum()  # summaries as tokens
    layer = 500e-6 + 20e-6 * 2 + 3e-9 * 2 * sparse + 100e-6 + 50e-9 * candidates
    assert a.recall_bytes > 0  # a step that recalls runs its layers eagerly
    assert a.compute_s[0] == pytest.approx(layer + pol.eager_launch_us_per_layer * 1e-6)


def test_inline_io_adds_recall_to_each_layer(tmp_path):
    overlap = _scenario(
        tmp_path, _profile(tmp_path, compute=COMPUTE), overrides=["policy.pulseinfer.scheduling=sequential"]
    )
    profile = _profile(tmp_path, compute=COMPUTE)
    data = yaml.safe_load(open(profile))
    data["hardware"]["io_overlaps_compute"] = False
    open(profile, "w").write(yaml.safe_dump(data))
    inline = _scenario(tmp_path, profile, overrides=["policy.pulseinfer.scheduling=sequential"])
    ctx, offloaded, cold = np.array([30_000, 50_000]), np.array([True, True]), np.array([True, False])
    a = make_policy(overlap, "pulseinfer").step_cost(ctx, offloaded, cold, np.random.default_rng(7))
    b = make_policy(inline, "pulseinfer").step_cost(ctx, offloaded, cold, np.random.default_rng(7))
    assert a.recall_s is not None and b.recall_s is None and b.gather_s is None
    eager_s = overlap.policy["pulseinfer"].eager_launch_us_per_layer * 1e-6  # the GPU's recalling step runs eagerly
    expected = np.array(a.compute_s) - eager_s + np.array(a.recall_s) + np.array(a.gather_s)
    assert np.allclose(b.compute_s, expected)
    assert b.recall_bytes == a.recall_bytes > 0


def test_serving_none_starts_decoding_at_arrival(tmp_path):
    scenario = _scenario(tmp_path, _profile(tmp_path, compute=COMPUTE), {"serving": {"prefill": "none"}})
    import pandas as pd

    n = scenario.serving.num_prefill_gpus + 2  # more requests than prefill GPUs: none of them waits for one
    workload = pd.DataFrame(
        {
            "request_id": range(n),
            "arrival_s": [0.0] * n,
            "prompt_tokens": [4000] * (n - 1) + [9000],
            "output_tokens": [5] * (n - 1) + [3],
        }
    )
    result = simulate_policy(scenario, workload, "sglang")
    req = result.requests
    assert (req["first_token_s"] == 0.0).all()
    decode = result.steps[result.steps["phase"] == "decode"]
    assert list(decode["batch_size"]) == [n, n, n - 1, n - 1]  # the last request needs 2 decode steps, the others 4
    assert decode["start_s"].iloc[0] == 0.0
    assert (result.steps["phase"] == "decode").all()  # no prefill forward on this GPU


@pytest.mark.parametrize("level", [0.08, 0.3])
def test_recall_bytes_follow_profile_miss_fractions(tmp_path, level):
    """A profile's measured recall_stats drive the recall volume: mean recalled / selected = the change level."""
    stats = {
        "change_mean_by_depth": [[0.0, level], [1.0, level / 2]],
        "change_shape_a": 1.5,
        "returning_frac": 0.0,  # every changed block is new: miss fraction = change fraction
        "working_set_steps": 12,
    }
    scenario = _scenario(tmp_path, _profile(tmp_path, recall_stats=stats))
    assert scenario.recall_stats.change_mean_by_depth == [(0.0, level), (1.0, level / 2)]
    pol = scenario.policy["pulseinfer"]
    recall = RecallModel(scenario.model, pol, scenario.recall_stats, LinkModel(scenario.hardware))
    n = 4000
    ctx = np.full(n, 100_007)  # off a block boundary: no block is leaving the recent window (no fresh-block misses)
    rec = recall_step.step(recall, ctx, np.zeros(n, dtype=bool), np.random.default_rng(0))
    selected = pol.budget_tokens // pol.block_size
    per_layer = rec.fragments[0] / (n * selected)  # measured miss fraction per layer
    depth = np.linspace(0, 1, scenario.model.num_layers)
    expected = level + (level / 2 - level) * depth
    assert np.allclose(per_layer, expected, rtol=0.06)
    bytes_per_block = pol.block_size * scenario.model.kv_bytes_per_token_per_layer
    assert rec.nbytes.sum() == pytest.approx(n * selected * expected.sum() * bytes_per_block, rel=0.02)


def test_scenario_without_recall_stats_keeps_its_own(tmp_path):
    stats = {"change_mean_by_depth": [[0.0, 0.5]], "returning_frac": 0.2}
    scenario = _scenario(
        tmp_path, _profile(tmp_path, recall_stats=stats), {"recall_stats": {"change_mean_by_depth": [[0.0, 0.1]]}}
    )
    assert scenario.recall_stats.change_mean_by_depth == [(0.0, 0.1)]  # the scenario's own section wins


def test_profile_round_trips_through_write(tmp_path):
    from sim.config.profiles import write_profile

    prof = Profile.model_validate(yaml.safe_load(open(_profile(tmp_path, compute=COMPUTE))))
    write_profile(prof, tmp_path / "again" / "profile.yaml")
    assert load_profile(tmp_path / "again") == prof


def test_profile_of_a_few_layers_applies_to_the_whole_model(tmp_path):
    """A GPU calibration runs 4 layers of the card at full width; its per-layer compute serves all 40."""
    few = {**load_card("model", "qwen3-14b"), "name": "qwen3-14b-4l", "num_layers": 4}
    path = tmp_path / "profile.yaml"
    hardware = {**load_card("hardware", "h200"), "name": "calibrated-h200"}
    path.write_text(
        yaml.safe_dump({"hardware": hardware, "model": few, "compute": {**COMPUTE, "model": "qwen3-14b-4l"}})
    )
    scenario = _scenario(tmp_path, str(path), {"model": "qwen3-14b"})
    assert scenario.model.num_layers == 40 and scenario.profile.compute.model == "qwen3-14b-4l"
    narrow = {**few, "name": "qwen3-14b-4l-w4", "num_kv_heads": 2, "num_heads": 10}
    path.write_text(
        yaml.safe_dump({"hardware": hardware, "model": narrow, "compute": {**COMPUTE, "model": "qwen3-14b-4l-w4"}})
    )
    with pytest.raises(ScenarioError, match="measured on model 'qwen3-14b-4l-w4'"):
        _scenario(tmp_path, str(path), {"model": "qwen3-14b"})


def test_null_hardware_override_takes_the_profiles(tmp_path):
    profile = _profile(tmp_path, compute=COMPUTE)
    scenario = _scenario(tmp_path, None, {"hardware": "h100-sxm"}, overrides=["hardware=null", f"profile={profile}"])
    assert scenario.hardware.name == "calibrated-h200"


def test_measured_working_set_ratio_sets_the_buffer_hit(tmp_path):
    """With a measured W / k the LRU hit is clip((B − k) / (k (r − 1))): a buffer of 2k holds a 1.5k working set,
    so every returning block hits and the miss fraction is change · (1 − returning_frac)."""
    stats = {"change_mean_by_depth": [[0.0, 0.2]], "returning_frac": 0.8, "working_set_ratio": 1.5}
    scenario = _scenario(tmp_path, _profile(tmp_path, recall_stats=stats))
    pol = scenario.policy["pulseinfer"].model_copy(update={"recall_buffer_blocks": 2 * 128, "budget_tokens": 2048})
    recall = RecallModel(scenario.model, pol, scenario.recall_stats, LinkModel(scenario.hardware))
    q = recall_step.miss_frac(recall, np.full(20000, 128), np.zeros(20000, dtype=bool), np.random.default_rng(1))
    assert q.mean() == pytest.approx(0.2 * (1 - 0.8), rel=0.03)
    assumed = RecallModel(
        scenario.model, pol, scenario.recall_stats.model_copy(update={"working_set_ratio": None}), recall.link
    )
    q_assumed = recall_step.miss_frac(
        assumed, np.full(20000, 128), np.zeros(20000, dtype=bool), np.random.default_rng(1)
    )
    assert q_assumed.mean() > q.mean() * 1.3  # the assumed W = k (1 + 12 · 0.2) = 3.4 k overflows a 2k buffer


def test_profile_input_errors_are_one_clear_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ScenarioError, match="has no profile.yaml"):
        load_profile(empty)
    bad = tmp_path / "bad.yaml"
    bad.write_text("hardware: [1, 2\n")
    with pytest.raises(ScenarioError, match=r"line 2, column 1"):
        load_profile(bad)
    zero = {**COMPUTE, "layer_base_us": 0, "layer_per_request_us": 0, "layer_per_token_ns": 0}
    with pytest.raises(ScenarioError, match="would take no time"):
        load_profile(_profile(tmp_path, compute=zero))
    with pytest.raises(ScenarioError, match="compute.model 'other' differs from model.name 'qwen3-14b'"):
        load_profile(_profile(tmp_path, compute={**COMPUTE, "model": "other"}))


def test_a_field_filled_from_the_profile_is_reported_once(tmp_path):
    path = _profile(tmp_path)
    data = yaml.safe_load(open(path))
    data["hardware"]["h2d_bandwidth_gbps"] = -5
    open(path, "w").write(yaml.safe_dump(data))
    with pytest.raises(ScenarioError) as err:
        _scenario(tmp_path, path)
    assert str(err.value).count("h2d_bandwidth_gbps") == 1


def test_relative_profile_path_is_found_next_to_the_scenario(tmp_path, monkeypatch):
    folder = tmp_path / "study"
    folder.mkdir()
    _profile(folder, compute=COMPUTE)  # study/profile.yaml
    (folder / "scenario.yaml").write_text(
        yaml.safe_dump(
            {
                "profile": "profile.yaml",
                "workload": {
                    "trace": None,
                    "synthetic": {
                        "num_requests": 2,
                        "rate_per_s": 1,
                        "prompt_tokens_mean": 9000,
                        "output_tokens_mean": 9,
                    },
                },
                "policies": ["sglang"],
            }
        )
    )
    monkeypatch.chdir(tmp_path)  # the profile is not in the current directory
    assert load_scenario(str(folder / "scenario.yaml")).hardware.name == "calibrated-h200"
