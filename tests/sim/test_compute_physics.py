"""The compute model's kernel physics (issue 46, sim/step/compute.py): MoE experts by their size and token share,
shared experts and leading dense layers, multi-head latent attention's KV and FLOPs, split-KV fill and FP8 KV."""

from __future__ import annotations

import pytest

from sim.config import HardwareSpec, ModelSpec, load_scenario
from sim.config.loader import load_card
from sim.config.parallel import shard_model
from sim.step.compute import ComputeModel

PLAIN = dict(hbm_half_bytes=0.0, attn_efficiency=1.0, attn_half_tokens=0.0, moe_efficiency=1.0, moe_half_bytes=0.0,
             moe_layer_us=0.0, attn_half_tiles=0.0, attn_fp8_efficiency=1.0, allreduce_call_us=0.0,
             decode_request_overhead_us=0.0, fp8_mfu=None, attn_mfu=None, prefill_act_passes=0.0)  # fmt: skip


def _model(name: str, **changes) -> ModelSpec:
    return ModelSpec.model_validate({**load_card("model", name), **changes})


def _card(**changes) -> HardwareSpec:
    return HardwareSpec.model_validate({**load_card("hardware", "h200"), **PLAIN, **changes})


def test_deepseek_v3_shape_from_its_config():
    """671B weights, ~37B active per token, 576 latent elements of KV per token and layer (DeepSeek-V3 report)."""
    m = _model("deepseek-v3")
    total = m.num_layers * m.params_per_layer + m.embedding_params
    active = m.num_layers * m.active_params_per_layer + m.embedding_params
    assert total == pytest.approx(671e9, rel=0.02)
    assert active == pytest.approx(37e9, rel=0.06)
    assert m.kv_bytes_per_token == 61 * 576 * 2  # FP8 weights, a BF16 latent cache (the card's kv_dtype)
    assert _model("deepseek-v3", kv_dtype="fp8").kv_bytes_per_token_per_layer == 576


def test_mla_latent_is_not_split_by_tensor_parallelism():
    m = _model("deepseek-v3", kv_dtype="bf16")
    assert shard_model(m, 8).kv_bytes_per_token_per_layer == m.kv_bytes_per_token_per_layer


def test_an_engine_without_latent_caching_stores_per_head_keys_and_values():
    """vLLM's 0.5 line ran DeepSeek MLA as per-head K (qk 192) and V (128), both padded to 256 for its kernel:
    2 × 16 heads × 256 × 2 B per layer for DeepSeek-V2-Lite; a newer engine caches the 576-element latent."""
    sets = ["model=deepseek-v2-lite", "hardware=a100-80gb", "serving.prefill=colocated"]
    old = load_scenario("default", [*sets, "engine=vllm-0.6.3"]).model
    new = load_scenario("default", [*sets, "engine=vllm-0.11.0"]).model
    assert not old.mla_cache and new.mla_cache
    assert old.kv_bytes_per_token_per_layer == 2 * 16 * 256 * 2
    assert new.kv_bytes_per_token_per_layer == 576 * 2
    forced = load_scenario("default", [*sets, "engine=vllm-0.6.3", "model.mla_cache=true"]).model
    assert forced.mla_cache  # a --set wins over the engine


def test_a_large_expert_reads_at_the_roofline_and_a_small_one_below_it():
    """One expert's read is (W + H_moe) / BW: near the roofline for Mixtral's 352 MB experts, far below it for
    Qwen3-30B-A3B's 9.4 MB ones."""
    card = _card(moe_half_bytes=8e6)
    bw = card.hbm_bandwidth_gbps * 1e9 * card.hbm_efficiency
    share = {}
    for name in ("mixtral-8x7b", "qwen3-30b-a3b"):
        m = _model(name)
        compute = ComputeModel(m, card)
        one = compute.experts_s(1) / compute.experts_touched(1)
        share[name] = m.expert_params * m.dtype_bytes / bw / one
    assert share["mixtral-8x7b"] > 0.95 and share["qwen3-30b-a3b"] < 0.6


def test_experts_touched_grow_to_every_expert_and_compute_takes_over():
    m = _model("mixtral-8x7b")
    compute = ComputeModel(m, _card())
    assert compute.experts_touched(1) == pytest.approx(2)
    assert compute.experts_touched(256) == pytest.approx(8, rel=1e-6)
    # at a large batch each expert's FLOPs outlast its weight read: time grows with tokens
    assert compute.experts_s(8192) > 1.5 * compute.experts_s(2048)


def test_routing_cost_is_paid_once_per_moe_layer():
    m = _model("qwen3-30b-a3b")
    base, routed = ComputeModel(m, _card()), ComputeModel(m, _card(moe_layer_us=25.0))
    assert routed.decode_layer_s(8, 8000) - base.decode_layer_s(8, 8000) == pytest.approx(25e-6)


def test_leading_dense_layers_and_shared_experts_count_in_every_token_read():
    m = _model("deepseek-v3")
    dense_free = _model("deepseek-v3", first_dense_layers=0, num_shared_experts=0, intermediate_size=18432)
    assert m.dense_mlp_params_per_layer > dense_free.dense_mlp_params_per_layer
    assert m.moe_layers == 58 and dense_free.moe_layers == 61


def test_split_kv_fills_the_gpu_with_context_and_batch():
    """A 70B model at TP8 holds one KV head per GPU: one short request fills little of the GPU, many long ones all."""
    m = shard_model(_model("llama-3.1-70b"), 8)
    half, none = ComputeModel(m, _card(attn_half_tiles=0.5)), ComputeModel(m, _card())  # 66 tiles on 132 SMs

    def attn(c: ComputeModel, b: int, t: int) -> float:  # the layer less its GEMMs (which do not depend on t)
        return c.decode_layer_s(b, t) - c.decode_layer_s(b, 0)

    assert attn(half, 1, 512) / attn(none, 1, 512) > 10  # 2 tiles against 66 at half: ~34x slower
    assert attn(half, 64, 64 * 131072) / attn(none, 64, 64 * 131072) == pytest.approx(1.0, abs=0.01)


def test_fp8_kv_reads_half_the_bytes_at_its_own_efficiency():
    bf16, fp8 = _model("llama-3.1-8b"), _model("llama-3.1-8b", kv_dtype="fp8")
    card = _card(attn_fp8_efficiency=0.5)
    t = 64 * 100_000  # attention-dominated
    a, b = ComputeModel(bf16, card), ComputeModel(fp8, card)
    gemm = a.decode_layer_s(64, 0)
    assert (b.decode_layer_s(64, t) - gemm) == pytest.approx(a.decode_layer_s(64, t) - gemm, rel=0.02)


def test_mla_decode_attention_is_compute_heavier_than_gqa():
    """Absorbed MLA does heads × (4 × 512 + 2 × 64) FLOPs per KV token: at 128 heads and a 576-element latent that is
    ~240 FLOPs per byte, near the H200's ridge, so the FLOPs side binds on an FP8 latent."""
    m = shard_model(_model("deepseek-v3", kv_dtype="fp8"), 1)
    compute = ComputeModel(m, _card())
    assert compute.attn_flops_per_token == 128 * (4 * 512 + 2 * 64)
    assert compute.attn_flops_per_token / m.kv_bytes_per_token_per_layer > 200


def test_an_empty_micro_batch_group_costs_no_expert():
    from sim.config import DEFAULT_ENGINE

    compute = ComputeModel(_model("qwen3-30b-a3b"), _card(moe_layer_us=25.0), engine=DEFAULT_ENGINE)
    assert compute.experts_s(0) == 0.0
    assert compute.decode_layer_s(0, 0) < compute.decode_layer_s(1, 1)
