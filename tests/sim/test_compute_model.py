"""sim.step.compute.ComputeModel: the decode roofline per layer, MoE expert coverage and prefill FLOPs."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import HardwareSpec, ModelSpec
from sim.config.loader import load_card
from sim.step.compute import ComputeModel


def _model(name: str) -> ModelSpec:
    return ModelSpec.model_validate(load_card("model", name))


# The shipped cards carry fitted efficiencies; these tests take the plain roofline the formula reduces to when the
# size-dependent terms are off, and the tests at the end switch each term on by hand.
ROOFLINE = dict(hbm_half_bytes=0.0, attn_efficiency=1.0, attn_half_tokens=0.0, moe_efficiency=1.0,
                allreduce_call_us=0.0, decode_request_overhead_us=0.0, fp8_mfu=None, attn_mfu=None,
                prefill_act_passes=0.0, moe_half_bytes=0.0, moe_layer_us=0.0, attn_half_tiles=0.0,
                attn_fp8_efficiency=1.0)  # fmt: skip


@pytest.fixture(scope="module")
def h200() -> HardwareSpec:
    return HardwareSpec.model_validate({**load_card("hardware", "h200"), **ROOFLINE})


@pytest.fixture(scope="module")
def dense(h200) -> ComputeModel:
    return ComputeModel(_model("qwen3-14b"), h200)


@pytest.fixture(scope="module")
def moe(h200) -> ComputeModel:
    return ComputeModel(_model("qwen3-30b-a3b"), h200)


def _bandwidth(hw: HardwareSpec) -> float:
    return hw.hbm_bandwidth_gbps * 1e9 * hw.hbm_efficiency


def _flops_per_s(hw: HardwareSpec) -> float:
    return hw.bf16_tflops * 1e12 * hw.prefill_mfu


def test_decode_layer_at_batch_1_reads_the_layer_weights_once(dense, h200):
    m = _model("qwen3-14b")
    layer_bytes = (m.attn_params_per_layer + 3 * m.hidden_size * m.intermediate_size) * m.dtype_bytes
    assert dense.decode_layer_s(1, 0) == pytest.approx(layer_bytes / _bandwidth(h200), rel=1e-12)


def test_decode_layer_grows_linearly_in_attended_tokens_once_kv_dominates(dense, h200):
    m = _model("qwen3-14b")
    t = [dense.decode_layer_s(16, n) for n in (1_000_000, 2_000_000, 3_000_000)]
    slope = m.kv_bytes_per_token_per_layer / _bandwidth(h200)
    assert t[1] - t[0] == pytest.approx(1_000_000 * slope, rel=1e-9)
    assert t[2] - t[1] == pytest.approx(1_000_000 * slope, rel=1e-9)


def test_decode_layer_is_compute_bound_for_a_huge_batch(dense, h200):
    m = _model("qwen3-14b")
    batch = 1_000_000
    flops = 2 * batch * m.active_params_per_layer
    assert dense.decode_layer_s(batch, 0) == pytest.approx(flops / _flops_per_s(h200), rel=1e-12)


def test_dense_model_touches_no_experts(dense):
    assert dense.experts_touched(1) == 0
    assert dense.experts_touched(4096) == 0


def test_moe_batch_1_touches_the_active_experts(moe):
    assert moe.experts_touched(1) == pytest.approx(_model("qwen3-30b-a3b").num_active_experts, rel=1e-12)


def test_moe_large_batch_touches_nearly_every_expert(moe):
    num_experts = _model("qwen3-30b-a3b").num_experts
    assert moe.experts_touched(4096) == pytest.approx(num_experts, rel=1e-9)
    assert moe.experts_touched(16) < moe.experts_touched(64) < num_experts


def test_moe_decode_layer_reads_touched_experts(moe, h200):
    m = _model("qwen3-30b-a3b")
    shared = (m.attn_params_per_layer + m.hidden_size * m.num_experts) * m.dtype_bytes
    expected = (shared + m.num_active_experts * m.expert_params * m.dtype_bytes) / _bandwidth(h200)
    assert moe.decode_layer_s(1, 0) == pytest.approx(expected, rel=1e-12)


def test_prefill_is_weight_bound_for_one_token(dense, h200):
    assert dense.prefill_s([(1, 0)], 1) == pytest.approx(_model("qwen3-14b").weight_bytes / _bandwidth(h200))


@pytest.mark.parametrize(("c1", "c2"), [(3000, 5000), (4096, 4096), (8000, 500)])
def test_prefill_split_into_two_chunks_costs_the_same_when_compute_bound(dense, c1, c2):
    whole = dense.prefill_s([(c1 + c2, 0)], 1)
    first = dense.prefill_s([(c1, 0)], 0)
    second = dense.prefill_s([(c2, c1)], 1)
    # Compute-bound: each part costs more than one read of the weights.
    assert first > dense.weight_bytes / dense.bandwidth_bps
    assert second > dense.weight_bytes / dense.bandwidth_bps
    assert first + second == pytest.approx(whole, rel=1e-9)


def test_layer_time_of_k_steps_is_each_steps_scalar_time(dense, moe):
    """One formula for one step or k (numpy broadcasting): an int64 [k] of attended tokens gives float64 [k], each the
    time of the scalar call, bit for bit; an int gives a float."""
    attended = np.array([0, 1_000, 123_457, 3_000_000], dtype=np.int64)
    for compute in (dense, moe):
        many = compute.decode_layer_s(16, attended)
        assert many.dtype == np.float64 and many.shape == (4,)
        assert many.tolist() == [compute.decode_layer_s(16, int(a)) for a in attended]
        assert type(compute.decode_layer_s(16, 1_000)) is float


# ---- the fitted parameters (issue 32): each term checked by hand against the module docstring's formula ----------


def _card(**fields) -> HardwareSpec:
    return HardwareSpec.model_validate({**load_card("hardware", "h200"), **ROOFLINE, **fields})


FITTED = dict(hbm_efficiency=0.85, hbm_half_bytes=2e6, attn_efficiency=0.7, attn_half_tokens=300.0,
              moe_efficiency=0.5, prefill_mfu=0.55, allreduce_call_us=20.0, decode_request_overhead_us=0.0)  # fmt: skip


def test_decode_layer_by_hand_with_every_fitted_term():
    m, hw = _model("qwen3-14b"), _card(**FITTED)
    c = ComputeModel(m, hw)
    bw = hw.hbm_bandwidth_gbps * 1e9 * 0.85
    weights = (m.attn_params_per_layer + 3 * m.hidden_size * m.intermediate_size) * 2
    batch, attended = 8, 8 * 5000
    gemm = max((weights + 4 * 2e6) / bw, 2 * batch * m.active_params_per_layer / (hw.bf16_tflops * 1e12 * 0.55))
    attn = m.kv_bytes_per_token_per_layer * (attended + batch * 300.0) / (bw * 0.7)
    assert c.decode_layer_s(batch, attended) == pytest.approx(gemm + attn, rel=1e-12)
    steps = np.array([attended, attended + batch])  # the k-step form gives each step's scalar value
    assert c.decode_layer_s(batch, steps)[1] == c.decode_layer_s(batch, attended + batch)


def test_moe_experts_read_at_the_grouped_gemm_efficiency():
    m = _model("qwen3-30b-a3b")
    full, half = ComputeModel(m, _card(moe_efficiency=1.0)), ComputeModel(m, _card(moe_efficiency=0.5))
    experts = full.experts_touched(4) * m.expert_params * 2 / (_bandwidth(_card()))
    assert half.decode_layer_s(4, 0) - full.decode_layer_s(4, 0) == pytest.approx(experts, rel=1e-9)


def test_fp8_weights_halve_the_weight_read_and_use_the_fp8_peak():
    bf16, fp8 = _model("llama-3.1-8b"), ModelSpec.model_validate({**load_card("model", "llama-3.1-8b"), "dtype": "fp8"})
    hw = _card()
    a, b = ComputeModel(bf16, hw), ComputeModel(fp8, hw)
    assert b.flops_per_s == pytest.approx(a.flops_per_s * hw.fp8_tflops / hw.bf16_tflops)
    assert b.shared_weight_bytes_layer * 2 == a.shared_weight_bytes_layer
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token  # kv_dtype unset: the weights' dtype
    no_fp8 = ComputeModel(fp8, _card(fp8_tflops=None))  # a card without FP8 tensor cores runs BF16 GEMMs
    assert no_fp8.flops_per_s == pytest.approx(a.flops_per_s)


def test_prefill_by_hand_with_its_own_gemm_attention_and_memory_terms():
    """FP8 GEMMs at fp8_mfu of the FP8 peak, attention at attn_mfu of the BF16 peak, and prefill_act_passes
    hidden-size activation reads/writes per token and layer at the HBM roofline (module docstring)."""
    fp8 = ModelSpec.model_validate({**load_card("model", "llama-3.1-8b"), "dtype": "fp8"})
    hw = _card(prefill_mfu=0.6, fp8_mfu=0.4, attn_mfu=0.5, prefill_act_passes=12.0)
    c = ComputeModel(fp8, hw)
    new, cached = 3000, 1000
    gemm = (2 * new * fp8.num_layers * fp8.active_params_per_layer + 2 * fp8.vocab_size * fp8.hidden_size) / (
        hw.fp8_tflops * 1e12 * 0.4
    )
    attn_flops = 4 * fp8.num_heads * fp8.head_dim * fp8.num_layers * (new * cached + new * (new + 1) / 2)
    attn = attn_flops / (hw.bf16_tflops * 1e12 * 0.5)
    passes = new * fp8.num_layers * 12.0 * fp8.hidden_size * fp8.activation_bytes / _bandwidth(hw)
    assert c.prefill_s([(new, cached)], 1) == pytest.approx(gemm + attn + passes, rel=1e-12)
    assert c.prefill_extra_s([(new, cached)], 1) == pytest.approx(gemm + attn + passes, rel=1e-12)
    # BF16 weights ignore fp8_mfu; unset efficiencies take prefill_mfu, and no passes cost nothing
    bf16 = ComputeModel(_model("llama-3.1-8b"), hw)
    assert bf16.flops_per_s == pytest.approx(hw.bf16_tflops * 1e12 * 0.6)
    plain = ComputeModel(fp8, _card(prefill_mfu=0.6))
    assert plain.flops_per_s == pytest.approx(hw.fp8_tflops * 1e12 * 0.6)
    assert plain.attn_flops_per_s == pytest.approx(hw.bf16_tflops * 1e12 * 0.6)
    assert plain.prefill_token_layer_s == 0.0


def test_activation_passes_lift_a_bandwidth_rich_cards_share_of_its_peak():
    """The memory-bound passes cost the same bytes on every card, so they take a smaller share of a prefill on a
    card with more bandwidth per FLOP (H20) than on one with less (H100)."""
    m = _model("llama-3.1-8b")
    shares = {}
    for name in ("h20", "h100-sxm"):
        card = {**load_card("hardware", name), **ROOFLINE, "prefill_mfu": 0.6}
        with_passes = ComputeModel(m, HardwareSpec.model_validate({**card, "prefill_act_passes": 20.0}))
        without = ComputeModel(m, HardwareSpec.model_validate(card))
        chunk = [(8192, 0)]
        shares[name] = without.prefill_s(chunk, 1) / with_passes.prefill_s(chunk, 1)
    assert 0 < shares["h100-sxm"] < shares["h20"] < 1


def test_an_fp8_kv_cache_halves_the_kv_bytes():
    fp8_kv = ModelSpec.model_validate({**load_card("model", "llama-3.1-8b"), "kv_dtype": "fp8"})
    assert fp8_kv.kv_bytes_per_token * 2 == _model("llama-3.1-8b").kv_bytes_per_token


def test_a_mixed_prefill_chunk_adds_its_flops_not_the_weight_read():
    c = ComputeModel(_model("qwen3-14b"), _card())
    small = [(16, 0)]  # a small chunk: alone it is bound by reading the weights, riding in a step it costs its FLOPs
    assert c.prefill_s(small, 0) == pytest.approx(c.weight_bytes / c.bandwidth_bps)
    assert c.prefill_extra_s(small, 0) < 0.2 * c.prefill_s(small, 0)
    big = [(8192, 0)]  # compute-bound: the two agree
    assert c.prefill_extra_s(big, 1) == pytest.approx(c.prefill_s(big, 1), rel=1e-12)


def test_each_all_reduce_pays_its_per_call_cost():
    m = _model("llama-3.1-70b")
    from sim.config.parallel import shard_model

    shard = shard_model(m, 4)
    a, b = ComputeModel(shard, _card(), None, 4), ComputeModel(shard, _card(allreduce_call_us=25.0), None, 4)
    assert b.decode_layer_s(8, 8000) - a.decode_layer_s(8, 8000) == pytest.approx(2 * 25e-6, rel=1e-9)


def test_each_request_adds_its_host_work_after_the_last_layer():
    m = _model("qwen3-14b")
    a, b = ComputeModel(m, _card()), ComputeModel(m, _card(decode_request_overhead_us=40.0))
    assert b.decode_head_s(10) - a.decode_head_s(10) == pytest.approx(10 * 40e-6, rel=1e-12)
    assert b.decode_layer_s(10, 1000) == a.decode_layer_s(10, 1000)
