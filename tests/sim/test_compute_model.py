"""sim.step.compute.ComputeModel: the decode roofline per layer, MoE expert coverage and prefill FLOPs."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import HardwareSpec, ModelSpec
from sim.config.loader import load_card
from sim.step.compute import ComputeModel


def _model(name: str) -> ModelSpec:
    return ModelSpec.model_validate(load_card("model", name))


@pytest.fixture(scope="module")
def h200() -> HardwareSpec:
    return HardwareSpec.model_validate(load_card("hardware", "h200"))


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
