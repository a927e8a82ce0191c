"""sim.serving.kv: the counted Pool and the device-pool size (SGLang's HBM − reserve − weights rule)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.config import HardwareSpec, ModelSpec
from sim.config.loader import load_card
from sim.serving.kv import CapacityError, Pool, device_pool_blocks


def _model(name: str) -> ModelSpec:
    return ModelSpec.model_validate(load_card("model", name))


def _hardware(name: str) -> HardwareSpec:
    """The card with SGLang 0.4's reserve ((c + tp/2) GB, the rule these worked examples use) filled in."""
    from sim.config import load_scenario

    return load_scenario("default", [f"hardware={name}", "engine=sglang-0.4"]).hardware


def test_allocate_over_capacity_returns_false_and_takes_nothing():
    pool = Pool(capacity=10)
    assert pool.allocate(7)
    assert pool.allocate(4) is False
    assert (pool.used, pool.free, pool.peak) == (7, 3, 7)


def test_allocate_exactly_the_free_units_succeeds():
    pool = Pool(capacity=10)
    assert pool.allocate(6)
    assert pool.allocate(4)
    assert pool.free == 0


def test_release_then_allocate_reuses_units():
    pool = Pool(capacity=10)
    assert pool.allocate(10)
    pool.release(6)
    assert pool.allocate(6)
    assert pool.used == 10


def test_peak_tracks_the_highest_use_after_release():
    pool = Pool(capacity=100)
    pool.allocate(30)
    pool.allocate(50)
    pool.release(70)
    pool.allocate(20)
    assert (pool.used, pool.peak) == (30, 80)


def test_release_of_more_than_used_is_refused():
    pool = Pool(capacity=10)
    pool.allocate(3)
    with pytest.raises(AssertionError, match="release of 4 units"):
        pool.release(4)


# One op: ("alloc", n) takes n units; ("free", i) gives back outstanding allocation number i (mod count).
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(min_value=0, max_value=40)),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=1000)),
    ),
    max_size=60,
)


@given(capacity=st.integers(min_value=0, max_value=100), ops=OPS)
def test_random_allocate_release_keeps_used_equal_to_outstanding(capacity, ops):
    pool = Pool(capacity=capacity)
    outstanding: list[int] = []
    highest = 0
    for op, arg in ops:
        if op == "alloc":
            before = pool.used
            ok = pool.allocate(arg)
            assert ok == (arg <= capacity - before)
            if ok:
                outstanding.append(arg)
            else:
                assert pool.used == before
        elif outstanding:
            pool.release(outstanding.pop(arg % len(outstanding)))
        highest = max(highest, pool.used)
        assert 0 <= pool.used <= pool.capacity
        assert pool.used == sum(outstanding)
        assert pool.free == capacity - pool.used
        assert pool.peak == highest


def test_qwen3_14b_on_h200_holds_about_657k_tokens():
    # docs/sources.md §5.1 worked example: ~657K KV tokens for Qwen3-14B on one H200. the sources derive their
    # reserve from mem_fraction_static ≈ 0.911 (12 GB + 0.5 GB, in GB), the card reserves 12.5 GiB and
    # computes weights from the shape (27.5 GiB vs the sources' 27.6), so the two differ slightly: 5 % tolerance.
    blocks = device_pool_blocks(_model("qwen3-14b"), _hardware("h200"), block_size=1)
    assert blocks == pytest.approx(657_000, rel=0.05)


def test_device_pool_blocks_scale_inversely_with_block_size():
    model, hw = _model("qwen3-14b"), _hardware("h200")
    tokens = device_pool_blocks(model, hw, block_size=1)
    assert device_pool_blocks(model, hw, block_size=32) == tokens // 32


def test_device_pool_is_hbm_minus_reserve_minus_weights():
    model, hw = _model("llama-3.1-8b"), _hardware("h100-sxm")
    expected = (hw.hbm_bytes - hw.reserve_bytes - model.weight_bytes) // model.kv_bytes_per_token
    assert device_pool_blocks(model, hw, block_size=1) == expected


def test_model_too_big_for_hbm_raises_capacity_error_naming_model_hardware_and_gib():
    with pytest.raises(CapacityError) as exc:
        device_pool_blocks(_model("llama-3.1-70b"), _hardware("h100-sxm"), block_size=1)
    message = str(exc.value)
    assert "llama-3.1-70b" in message
    assert "h100-sxm" in message
    assert "GiB" in message
    assert "\n" not in message
