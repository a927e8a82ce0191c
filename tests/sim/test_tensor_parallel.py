"""Tensor parallelism (serving.tp_size): one GPU's shard, its KV pool, its step time and all-reduces, by hand."""

from __future__ import annotations

import pytest

from sim.config import GIB, HardwareSpec, ModelSpec, ScenarioError, load_scenario
from sim.config.loader import load_card
from sim.config.parallel import allreduce_s, per_gpu_hardware, shard_model
from sim.policies import make_policy
from sim.run import simulate
from sim.serving.kv import device_pool_blocks


def _model(name: str) -> ModelSpec:
    return ModelSpec.model_validate(load_card("model", name))


def _card(name: str) -> HardwareSpec:
    return HardwareSpec.model_validate(load_card("hardware", name))


def _small(*overrides: str):
    return load_scenario(
        "default", ["workload.max_requests=12", "run.progress=false", "run.debug_checks=true", *overrides]
    )


def test_tp1_is_the_card_itself():
    m, hw = _model("qwen3-14b"), _card("h200")
    assert shard_model(m, 1) is m
    assert per_gpu_hardware(hw, 1) is hw


def test_ring_allreduce_by_hand():
    # 2 (n - 1) / n of the message per GPU at the link rate, plus 2 (n - 1) latency steps.
    assert allreduce_s(1e6, 4, 450.0, 1.0) == pytest.approx(1.5 * 1e6 / 450e9 + 6e-6, rel=1e-12)
    assert allreduce_s(1e6, 1, 450.0, 1.0) == 0.0


def test_llama70b_tp4_h100_decode_layer_by_hand():
    scn = _small("model=llama-3.1-70b", "hardware=h100-sxm", "serving.tp_size=4", "policies=sglang")
    pol = make_policy(scn, "sglang")
    hw = scn.hardware
    h, hd, tp = 8192, 128, 4
    q_dim, kv_dim = 64 // tp * hd, 8 // tp * hd
    layer_params = 2 * h * q_dim + 2 * h * kv_dim + 3 * h * (28672 // tp)
    kv_per_token_layer = 2 * kv_dim * 2
    batch, attended = 32, 32 * 20000
    bw = hw.hbm_bandwidth_gbps * 1e9 * hw.hbm_efficiency
    flops = hw.bf16_tflops * 1e12 * hw.prefill_mfu
    half = hw.hbm_half_bytes  # each of the 4 weight GEMMs reads this much more (sim/step/compute.py)
    gemm = max((layer_params * 2 + 4 * half) / bw, 2 * batch * layer_params / flops)
    tiles = batch * (8 // tp) * -(-attended // (batch * 256))  # split-KV tiles: 256-token chunks per KV head
    fill = tiles / (tiles + hw.attn_half_tiles * hw.sm_count)
    attn = max(
        kv_per_token_layer * (attended + batch * hw.attn_half_tokens) / (bw * hw.attn_efficiency * fill),
        4 * (64 // tp) * hd * attended / flops,
    )
    roofline = gemm + attn
    message = batch * h * 2
    allreduce = (2 * 3 / 4 * message / (450e9) + 6 * 1e-6 + hw.allreduce_call_us * 1e-6) * 2  # two per layer
    assert pol.compute.decode_layer_s(batch, attended) == pytest.approx(roofline + allreduce, rel=1e-12)


def test_llama70b_tp4_h100_kv_pool_per_gpu_by_hand():
    m, tp = _model("llama-3.1-70b"), 4
    scn = load_scenario(
        "default", ["model=llama-3.1-70b", "hardware=h100-sxm", "serving.tp_size=4", "engine=sglang-0.4"]
    )
    hw = scn.hardware
    weights_per_gpu = (
        80 * (2 * 8192 * 16 * 128 + 2 * 8192 * 2 * 128 + 3 * 8192 * 7168) + 2 * 8192 * (128256 // tp)
    ) * 2
    reserve = (9.5 + 0.5 * tp) * GIB  # SGLang 0.4's (9.5 + tp/2) GB per GPU
    kv_per_token = 2 * 2 * 128 * 2 * 80  # two KV heads per GPU
    expected = (int(hw.hbm_gib * GIB) - int(reserve) - weights_per_gpu) // kv_per_token
    assert device_pool_blocks(shard_model(m, tp), per_gpu_hardware(hw, tp), 1) == expected


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    m = _model("qwen3-30b-a3b")  # 4 KV heads
    shard = shard_model(m, 8)
    assert shard.num_kv_heads == 1
    assert shard.kv_bytes_per_token == m.kv_bytes_per_token // 4  # one head per GPU, not half a head


def test_offloaded_recall_moves_only_this_gpus_kv_heads():
    tp1 = make_policy(_small("policies=pulseinfer"), "pulseinfer")
    tp4 = make_policy(_small("policies=pulseinfer", "serving.tp_size=4"), "pulseinfer")
    assert tp4.recall.fragment_bytes * 4 == tp1.recall.fragment_bytes
    assert tp4.link.bps == tp1.link.bps  # one PCIe link per GPU (gpus_per_pcie_switch 1 on H200)


def test_pcie_switch_sharing_divides_the_link():
    hw = _card("l40s")
    assert per_gpu_hardware(hw, 4).h2d_bandwidth_gbps == hw.h2d_bandwidth_gbps / hw.gpus_per_pcie_switch


@pytest.mark.parametrize(("hardware", "tp"), [("h100-sxm", 4), ("h200", 2)])
def test_llama70b_runs_with_tp(hardware, tp):
    scn = _small("model=llama-3.1-70b", f"hardware={hardware}", f"serving.tp_size={tp}", "policies=sglang,pulseinfer")
    res = simulate(scn)
    for r in res.policies.values():
        assert r.summary["finished"] == 12


def test_llama70b_does_not_fit_one_h200():
    with pytest.raises(ValueError, match="tp_size"):
        simulate(_small("model=llama-3.1-70b", "policies=sglang"))


def test_more_gpus_shorten_the_decode_step():
    t = [make_policy(_small(f"serving.tp_size={tp}"), "sglang").compute.decode_layer_s(16, 16 * 8000) for tp in (1, 2)]
    assert t[1] < t[0]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["model=qwen2.5-7b", "serving.tp_size=8"], "num_heads"),
        (["hardware=gh200", "serving.tp_size=2"], "nvlink_bandwidth_gbps"),
        (["serving.tp_size=3"], "tp_size"),
    ],
)
def test_bad_tp_is_one_clear_error(overrides, needle):
    with pytest.raises(ScenarioError, match=needle):
        _small(*overrides)
