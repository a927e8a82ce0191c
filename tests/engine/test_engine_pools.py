"""Block allocator and KV pools: exhaustion returns None, frees are checked, invariants hold under any sequence."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.pools import BlockAllocator, KVPool, make_pools  # noqa: E402


def test_allocate_over_capacity_returns_none_and_takes_nothing():
    alloc = BlockAllocator(4)
    assert alloc.allocate(3) == [0, 1, 2]
    assert alloc.allocate(2) is None
    assert alloc.num_free == 1


def test_free_then_allocate_reuses_blocks():
    alloc = BlockAllocator(2)
    ids = alloc.allocate(2)
    alloc.free(ids)
    assert sorted(alloc.allocate(2)) == [0, 1]


def test_double_free_raises_and_changes_nothing():
    alloc = BlockAllocator(4)
    ids = alloc.allocate(2)
    alloc.free([ids[0]])
    with pytest.raises(ValueError, match="double free"):
        alloc.free([ids[1], ids[0]])
    assert alloc.num_free == 3 and not alloc.is_free(ids[1])


def test_free_rejects_out_of_range_and_repeated_ids():
    alloc = BlockAllocator(3)
    alloc.allocate(3)
    with pytest.raises(ValueError, match="out of range"):
        alloc.free([3])
    with pytest.raises(ValueError, match="double free"):
        alloc.free([1, 1])


def test_negative_sizes_are_rejected():
    with pytest.raises(ValueError, match="num_blocks=-1"):
        BlockAllocator(-1)
    with pytest.raises(ValueError, match="n=-2"):
        BlockAllocator(2).allocate(-2)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 12), st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=40))
def test_allocator_never_hands_out_an_id_twice_and_conserves_blocks(num_blocks, ops):
    alloc = BlockAllocator(num_blocks)
    held: list[int] = []
    for is_alloc, n in ops:
        if is_alloc:
            ids = alloc.allocate(n)
            if n > num_blocks - len(held):
                assert ids is None
            else:
                assert ids is not None and not set(ids) & set(held)
                held += ids
        else:
            alloc.free(held[:n])
            held = held[n:]
        assert alloc.num_free + len(held) == num_blocks
        assert all(not alloc.is_free(i) for i in held)


def test_pool_layers_are_block_major_with_the_given_dtype():
    pool = KVPool("device", 3, 5, 4, 2, 8, torch.bfloat16)
    assert len(pool.layers) == 3
    assert pool.layers[0].shape == (5, 2, 4, 2, 8) and pool.layers[0].dtype == torch.bfloat16
    assert pool.block_bytes == 2 * 4 * 2 * 8 * 2
    assert pool.fragment_bytes == pool.block_bytes // 2


def test_pool_rejects_unknown_tier_and_bad_sizes():
    with pytest.raises(ValueError, match="tier='gpu'"):
        KVPool("gpu", 1, 1, 1, 1, 1, torch.float32)
    with pytest.raises(ValueError, match="block_size=0"):
        KVPool("host", 1, 1, 0, 1, 1, torch.float32)


def test_make_pools_without_cuda_keeps_host_pool_unpinned_on_cpu():
    device_pool, host_pool = make_pools(1, 2, 3, 4, 1, 8, torch.float32, "cpu")
    assert (device_pool.tier, host_pool.tier) == ("device", "host")
    assert host_pool.layers[0].device.type == "cpu" and not host_pool.layers[0].is_pinned()
    assert host_pool.block_shape == device_pool.block_shape
