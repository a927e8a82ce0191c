"""The serving engine's host path (sim/config/engine.py ``EngineSpec``, scenarios/engines/): engine cards load and are
validated; the serial costs fall back to the card's; the overlapped host work bounds each step from below —
max(serial step, B · request_overlapped_us), sim/step/pipeline.py ``host_bound_s`` — over the step axis (k steps
timed at once, recalling or not, compiled or not), and a simulation honours it with skip-ahead on and off."""

from __future__ import annotations

import numpy as np
import pytest

from sim import load_scenario
from sim.config import DEFAULT_ENGINE, EngineSpec, ScenarioError, scenarios_dir
from sim.config.loader import card_names
from sim.run import simulate
from sim.step.compute import ComputeModel
from sim.step.pipeline import host_bound_s, idle_step_s
from sim.step.timing import StepDevices
from tests.sim.oracles.steps import time_steps

SHORT = [
    "model=llama-3.1-8b", "hardware=h100-sxm", "workload.trace=azure_conv_2023", "workload.max_requests=60",
    "workload.max_prompt_tokens=3500", "workload.time_scale=1", "workload.target_rate_per_s=4",
    "serving.prefill=colocated", "run.progress=false", "run.debug_checks=true",
]  # fmt: skip


# ---- engine cards -------------------------------------------------------------------------------


def test_every_shipped_engine_card_loads_and_todays_names_still_work(tmp_path):
    names = card_names("engine")
    assert {"vllm-0.8", "generic", "sglang-0.5", "trtllm-1.0"} <= set(names)
    for name in names:
        assert load_scenario("default", [f"engine={name}"]).engine.name == name
    assert load_scenario("default").engine.name == "sglang-0.4"  # the shipped scenario names the line it was run on
    text = (scenarios_dir() / "default.yaml").read_text()
    (tmp_path / "bare.yaml").write_text("\n".join(line for line in text.splitlines() if not line.startswith("engine:")))
    bare = load_scenario(tmp_path / "bare.yaml").engine
    assert bare.name == "sglang-0.5" and bare != DEFAULT_ENGINE  # no engine key: the newest SGLang line
    for old, line in [
        ("sglang", "sglang-0.5"),
        ("trtllm", "trtllm-1.0"),
        ("vllm-0.8", "vllm-0.8"),
        ("vllm", "vllm-0.11"),
    ]:
        assert load_scenario("default", [f"engine={old}"]).engine.name == line
    shipped = load_scenario("default", ["engine=sglang"]).engine
    assert (shipped.step_serial_us, shipped.request_serial_us, shipped.request_overlapped_us) == (None, None, 0.0)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("engine=vllm-9", "engine: 'vllm-9' is outside every vllm release line"),
        ("engine=foo-1.0", "engine: unknown engine 'foo-1.0'"),
        ("engine.request_overlapped_us=-1", "engine.request_overlapped_us"),
        ("engine.request_serial_us=20000", "engine.request_serial_us"),
        ("engine.step_serial_us=1e6", "engine.step_serial_us"),
        ("engine.overlap_us=3", "engine.overlap_us"),
    ],
)
def test_a_bad_engine_is_refused_in_one_line_naming_the_key(override, needle):
    with pytest.raises(ScenarioError) as err:
        load_scenario("default", [override])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_unset_serial_costs_are_the_cards_and_set_ones_replace_them():
    scn = load_scenario("default", ["model=llama-3.1-8b", "hardware=h200"])
    hw = scn.hardware
    card = ComputeModel(scn.model, hw)
    assert card.step_overhead_s == hw.decode_step_overhead_us * 1e-6
    assert card.request_overhead_s == hw.decode_request_overhead_us * 1e-6
    assert card.overlapped_host_s(64) == 0.0
    own = ComputeModel(scn.model, hw, engine=EngineSpec(name="x", step_serial_us=123.0, request_serial_us=4.0))
    assert own.step_overhead_s == pytest.approx(123e-6) and own.request_overhead_s == pytest.approx(4e-6)
    assert own.decode_head_s(10) - card.decode_head_s(10) == pytest.approx(10 * (4e-6 - card.request_overhead_s))
    overlapped = ComputeModel(scn.model, hw, engine=EngineSpec(name="y", request_overlapped_us=50.0))
    assert overlapped.overlapped_host_s(40) == pytest.approx(40 * 50e-6)
    assert overlapped.decode_head_s(40) == card.decode_head_s(40)  # overlapped work adds nothing serially


# ---- the max rule over the step axis ------------------------------------------------------------


def test_host_bound_is_the_max_and_leaves_a_serial_step_bit_for_bit():
    assert host_bound_s(3e-3, 5e-3) == 5e-3 and host_bound_s(5e-3, 3e-3) == 5e-3
    serial = idle_step_s(7e-4, [1e-4] * 32, 3e-4, 0.0)
    assert serial == 7e-4 + sum([1e-4] * 32) + 3e-4  # 0 overlapped: the serial sum, unchanged
    assert idle_step_s(7e-4, [1e-4] * 32, 3e-4, 9e-3) == 9e-3


def _kernels() -> list[str]:
    import importlib.util

    return ["python", "auto"] if importlib.util.find_spec("numba") else ["python"]


@pytest.mark.parametrize("kernels", _kernels())
def test_each_of_k_steps_lasts_at_least_the_overlapped_host_work(kernels):
    k, layers = 6, 4
    compute = np.tile(np.array([1e-4, 2e-4, 3e-4, 4e-4]), (k, 1)) * np.arange(1, k + 1)[:, None]  # growing steps
    serial = 5e-5 + compute.sum(axis=1) + 1e-4  # overhead + layers + head
    host_s = float(serial[2])  # steps 0-2 host-bound (step 2 exactly), 3-5 GPU-bound
    devices = StepDevices(None, None, kernels)
    idle = time_steps(devices, 0.0, compute, np.zeros(k, bool), 5e-5, 1e-4, 0, host_s=host_s)
    assert idle.steps == k
    np.testing.assert_allclose(idle.step_s, np.maximum(serial, host_s), rtol=0, atol=1e-15)
    assert np.all(idle.step_s[:3] == host_s) and np.all(idle.step_s[3:] > host_s)
    # steps that recall (sequential pipeline): the same floor over their end + head
    link = np.full((k, layers), 5e-5)
    recall = time_steps(devices, 0.0, compute, np.ones(k, bool), 5e-5, 1e-4, 0, sequential=(link, 0 * link))
    floored = time_steps(
        devices, 0.0, compute, np.ones(k, bool), 5e-5, 1e-4, 0, sequential=(link, 0 * link), host_s=host_s
    )
    np.testing.assert_allclose(floored.step_s, np.maximum(recall.step_s, host_s), rtol=0, atol=1e-15)
    assert floored.step_s[0] == host_s and floored.step_s[-1] == recall.step_s[-1]


# ---- a simulation honours it, skip-ahead on and off -----------------------------------------------


def _decode(result):
    steps = result.steps
    return steps[steps["phase"] == "decode"]


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(["policies=sglang"], id="dense"),
        pytest.param(["policies=pulseinfer", "policy.pulseinfer.offload_threshold_tokens=1500"], id="offloaded"),
    ],
)
def test_the_overlapped_cost_is_not_ignored_with_skip_ahead_on_or_off(policy):
    """Mutation-style: an engine whose overlapped host work exceeds most steps (5 ms per request) must stretch the
    steps of both the stepped and the skip-ahead simulation to B · 5 ms, identically; with 0 it must not."""
    per_request_s = 5e-3
    host = [*SHORT, *policy, f"engine.request_overlapped_us={per_request_s * 1e6}"]
    name = policy[0].split("=")[1]
    stepped = simulate(load_scenario("default", [*host, "run.skip_ahead=false"])).policies[name]
    skipped = simulate(load_scenario("default", [*host, "run.skip_ahead=true"])).policies[name]
    plain = simulate(load_scenario("default", [*SHORT, *policy])).policies[name]
    for result in (stepped, skipped):
        d = _decode(result)
        # every decode step lasts at least its batch's overlapped host work (mixed prefill is off: pure decode)
        assert np.all(d["duration_s"].to_numpy() >= d["batch_size"].to_numpy() * per_request_s * (1 - 1e-12))
    assert np.array_equal(_decode(stepped)["duration_s"].to_numpy(), _decode(skipped)["duration_s"].to_numpy())
    assert stepped.summary["tpot_mean_s"] == skipped.summary["tpot_mean_s"]
    assert stepped.summary["tpot_mean_s"] > 1.5 * plain.summary["tpot_mean_s"]
    host_bound = _decode(plain)["duration_s"].to_numpy() < _decode(plain)["batch_size"].to_numpy() * per_request_s
    assert host_bound.mean() > 0.5  # the override did bind (else the comparison proves nothing)
