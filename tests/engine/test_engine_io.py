"""I/O engine copy oracles: source unchanged, recalled device blocks equal their host blocks, others untouched,
and per_fragment and gather_scatter leave byte-identical pools (after vLLM's tests/v1/kv_offload/test_cpu_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.io import GatherScatterIO, fragment_rows, make_io, offload_blocks, row_view  # noqa: E402

BLOCK_SIZES = [1, 4, 16]
NUM_KV_HEADS = [1, 2, 4]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MODES = ["per_fragment", "gather_scatter", "gpu_gather"]


def _choice(n_src: int, n_dst: int, n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n_src, generator=gen)[:n], torch.randperm(n_dst, generator=gen)[:n]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def _recall_all_layers(mode, device_pool, host_pool, src, dst, heads=None, **kwargs):
    io = make_io(mode, host_pool, device_pool, **kwargs)
    moved = sum(io.recall(layer, src, dst, heads) for layer in range(len(host_pool.layers)))
    for layer in range(len(host_pool.layers)):
        io.wait(layer)
    return moved


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads", NUM_KV_HEADS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_block_recall_copies_selected_blocks_and_nothing_else(make_pools, mode, block_size, num_kv_heads, dtype):
    device_pool, host_pool = make_pools(block_size=block_size, num_kv_heads=num_kv_heads, dtype=dtype)
    host_before = [layer.clone() for layer in host_pool.layers]
    src, dst = _choice(host_pool.num_blocks, device_pool.num_blocks, 5)
    moved = _recall_all_layers(mode, device_pool, host_pool, src, dst)
    assert moved == 5 * host_pool.block_bytes * len(host_pool.layers)
    untouched = torch.ones(device_pool.num_blocks, dtype=torch.bool)
    untouched[dst] = False
    for layer, dev, before in zip(host_pool.layers, device_pool.layers, host_before):
        assert torch.equal(_bytes(layer), _bytes(before))
        assert torch.equal(_bytes(dev[dst]), _bytes(layer[src]))
        assert bool((dev[untouched] == -7).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads", NUM_KV_HEADS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_head_fragment_recall_copies_only_the_given_heads(make_pools, mode, block_size, num_kv_heads, dtype):
    device_pool, host_pool = make_pools(block_size=block_size, num_kv_heads=num_kv_heads, dtype=dtype)
    gen = torch.Generator().manual_seed(2)
    n = 6
    src = torch.randint(0, host_pool.num_blocks, (n,), generator=gen)  # heads may share a host block
    heads = torch.randint(0, num_kv_heads, (n,), generator=gen)
    dst = torch.randperm(device_pool.num_blocks, generator=gen)[:n]  # unique device blocks, so unique (block, head)
    moved = _recall_all_layers(mode, device_pool, host_pool, src, dst, heads)
    assert moved == n * host_pool.fragment_bytes * len(host_pool.layers)
    for layer, dev in zip(host_pool.layers, device_pool.layers):
        expected = torch.full_like(dev, -7)
        for b, s, h in zip(src.tolist(), dst.tolist(), heads.tolist()):
            expected[s, :, :, h] = layer[b, :, :, h]
        assert torch.equal(_bytes(dev), _bytes(expected))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads", NUM_KV_HEADS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_modes_leave_byte_identical_pools(make_pools, block_size, num_kv_heads, dtype):
    pools = {mode: make_pools(block_size=block_size, num_kv_heads=num_kv_heads, dtype=dtype) for mode in MODES}
    src, dst = _choice(20, 12, 8, seed=3)
    heads = torch.arange(8) % num_kv_heads
    for mode, (device_pool, host_pool) in pools.items():
        _recall_all_layers(mode, device_pool, host_pool, src[:4], dst[:4])
        _recall_all_layers(mode, device_pool, host_pool, src[4:], dst[4:], heads[4:])
    (pf_dev, _), *others = pools.values()
    for dev, _ in others:
        for a, b in zip(pf_dev.layers, dev.layers):
            assert torch.equal(_bytes(a), _bytes(b))


@pytest.mark.parametrize("with_heads", [False, True])
def test_gather_scatter_in_several_chunks_equals_one_chunk(make_pools, with_heads):
    src, dst = _choice(20, 12, 10, seed=4)
    heads = torch.arange(10) % 2 if with_heads else None
    results = []
    for staging_bytes in (1 << 20, 2 * 4 * 2 * 8 * 4):  # ample; exactly one block
        device_pool, host_pool = make_pools()
        _recall_all_layers("gather_scatter", device_pool, host_pool, src, dst, heads, staging_bytes=staging_bytes)
        results.append(torch.cat([_bytes(layer) for layer in device_pool.layers]))
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_empty_recall_moves_nothing(make_pools):
    device_pool, host_pool = make_pools()
    empty = torch.empty(0, dtype=torch.int64)
    for mode in MODES:
        assert make_io(mode, host_pool, device_pool).recall(0, empty, empty) == 0
    assert bool((device_pool.layers[0] == -7).all())


def test_recall_rejects_misshaped_or_non_cpu_int64_indices(make_pools):
    device_pool, host_pool = make_pools()
    io = make_io("gather_scatter", host_pool, device_pool)
    with pytest.raises(ValueError, match="dst_block_ids has 2 entries but src_ids has 3"):
        io.recall(0, torch.tensor([0, 1, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="src_ids must be a 1-D CPU int64 tensor"):
        io.recall(0, torch.tensor([0.0]), torch.tensor([0]))


def test_construction_errors_name_the_argument(make_pools):
    device_pool, host_pool = make_pools()
    with pytest.raises(ValueError, match="mode='dma'"):
        make_io("dma", host_pool, device_pool)
    with pytest.raises(ValueError, match="staging_bytes=8"):
        GatherScatterIO(host_pool, device_pool, staging_bytes=8)
    other, _ = make_pools(block_size=8)
    with pytest.raises(ValueError, match="differ from device pool blocks"):
        make_io("per_fragment", host_pool, other)


def test_offload_copies_device_slots_to_host_blocks_in_every_layer(make_pools):
    device_pool, host_pool = make_pools()
    for i, layer in enumerate(device_pool.layers):
        layer[3] = float(i + 1)
    offload_blocks(device_pool, host_pool, [3], [11])
    for i, layer in enumerate(host_pool.layers):
        assert bool((layer[11] == float(i + 1)).all())
    with pytest.raises(ValueError, match="device_block_ids has 1 ids but host_ids has 2"):
        offload_blocks(device_pool, host_pool, [3], [1, 2])


def test_row_view_uses_the_widest_element_that_divides_a_row():
    t = torch.zeros(4, 6, dtype=torch.float16)  # 12-byte rows
    view = row_view(t, 12)
    assert view.dtype == torch.int32 and view.shape == (4, 3)
    view[1] = -1
    assert bool(t[1].isnan().all()) and bool((t[0] == 0).all())
    assert row_view(torch.zeros(2, 8), 32).dtype == torch.complex128


def test_fragment_rows_address_one_head_of_one_block():
    pool = torch.arange(3 * 2 * 2 * 4 * 5).view(3, 2, 2, 4, 5)  # [N, 2, P, Hkv, D]
    rows = fragment_rows(torch.tensor([2]), torch.tensor([1]), block_size=2, num_kv_heads=4)
    assert torch.equal(pool.view(-1, 5)[rows].view(2, 2, 5), pool[2, :, :, 1])


def test_staging_that_is_not_a_multiple_of_the_row_size_still_copies_exactly(make_pools):
    src, dst = _choice(20, 12, 7, seed=5)
    heads = torch.arange(7) % 2
    results = []
    for mode in MODES:
        device_pool, host_pool = make_pools(head_dim=12)  # 48-byte head rows, 768-byte blocks
        kwargs = {"staging_bytes": 1000} if mode == "gather_scatter" else {}
        _recall_all_layers(mode, device_pool, host_pool, src[:3], dst[:3], **kwargs)
        _recall_all_layers(mode, device_pool, host_pool, src[3:], dst[3:], heads[3:], **kwargs)
        results.append(torch.cat([_bytes(layer) for layer in device_pool.layers]))
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_gpu_gather_on_cpu_is_one_direct_index_copy(make_pools):
    """On CPU the mode reads host rows straight into device rows (no staging) and says so."""
    device_pool, host_pool = make_pools(block_size=4, num_kv_heads=2)
    io = make_io("gpu_gather", host_pool, device_pool)
    assert io.path == "cpu" and not hasattr(io, "_staging")
    src, dst = _choice(host_pool.num_blocks, device_pool.num_blocks, 3)
    io.recall(0, src, dst, torch.tensor([1, 0, 1]))
    assert torch.equal(_bytes(device_pool.layers[0][dst[0], :, :, 1]), _bytes(host_pool.layers[0][src[0], :, :, 1]))
