"""Sparse decode attention over paged blocks equals dense attention when it covers the context."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.attention import dense_decode_attention, sparse_decode_attention  # noqa: E402

BLOCK_SIZES = [1, 4, 16]
NUM_KV_HEADS = [1, 2, 4]
DTYPES = [torch.float32, torch.bfloat16]
H, D = 4, 8


def _paged(k, v, block_size, num_blocks, gen):
    """Scatter one request's k, v [T, Hkv, D] into random blocks of a fresh pool; return (pool, block_ids, tokens)."""
    t, hkv, d = k.shape
    nb = -(-t // block_size)
    pool = torch.randn(num_blocks, 2, block_size, hkv, d, generator=gen).to(k.dtype)  # garbage elsewhere
    block_ids = torch.randperm(num_blocks, generator=gen)[:nb]
    tokens = torch.tensor([min(block_size, t - j * block_size) for j in range(nb)])
    for j in range(nb):
        n = int(tokens[j])
        pool[block_ids[j], 0, :n] = k[j * block_size : j * block_size + n]
        pool[block_ids[j], 1, :n] = v[j * block_size : j * block_size + n]
    order = torch.randperm(nb, generator=gen)  # attention must not depend on block order
    return pool, block_ids[order], tokens[order]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads", NUM_KV_HEADS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_sparse_attention_over_all_blocks_equals_dense(block_size, num_kv_heads, dtype):
    gen = torch.Generator().manual_seed(block_size * 10 + num_kv_heads)
    t = 3 * block_size + 1  # a partly filled tail block
    q = torch.randn(1, H, D, generator=gen).to(dtype)
    k = torch.randn(t, num_kv_heads, D, generator=gen).to(dtype)
    v = torch.randn(t, num_kv_heads, D, generator=gen).to(dtype)
    pool, block_ids, tokens = _paged(k, v, block_size, 12, gen)
    sparse = sparse_decode_attention(q, pool, block_ids[None], tokens[None])
    dense = dense_decode_attention(q, k[None], v[None])
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(sparse, dense, rtol=tol, atol=tol)


def test_padding_slots_with_zero_tokens_are_ignored():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, H, D, generator=gen)
    pool = torch.randn(6, 2, 4, 2, D, generator=gen)
    block_ids = torch.tensor([[0, 1, 5], [2, 3, 4]])
    tokens = torch.tensor([[4, 2, 0], [4, 4, 4]])
    out = sparse_decode_attention(q, pool, block_ids, tokens)
    alone = sparse_decode_attention(q[:1], pool, block_ids[:1, :2], tokens[:1, :2])
    torch.testing.assert_close(out[:1], alone)


def test_dense_lengths_mask_equals_truncation():
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, H, D, generator=gen)
    k = torch.randn(2, 7, 2, D, generator=gen)
    v = torch.randn(2, 7, 2, D, generator=gen)
    out = dense_decode_attention(q, k, v, torch.tensor([7, 3]))
    torch.testing.assert_close(out[1:], dense_decode_attention(q[1:], k[1:, :3], v[1:, :3]))


def test_misshaped_inputs_raise_value_error():
    q = torch.zeros(1, 3, D)
    with pytest.raises(ValueError, match="must match and divide"):
        dense_decode_attention(q, torch.zeros(1, 2, 2, D), torch.zeros(1, 2, 2, D))
    with pytest.raises(ValueError, match="do not fit kv_layer"):
        sparse_decode_attention(torch.zeros(1, 4, D), torch.zeros(3, 2, 4, 2, D), torch.zeros(1, 2).long(),
                                torch.zeros(1, 3).long())  # fmt: skip
