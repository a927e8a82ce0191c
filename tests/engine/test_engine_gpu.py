"""The same oracles on CUDA: pinned host pool, the I/O engine's own stream, prefetch overlapping compute.

Marked ``gpu``: skipped without CUDA (tests/engine/conftest.py); run with ``pytest -m gpu``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.io import make_io  # noqa: E402
from engine.kv_cache import SparsePolicy  # noqa: E402
from engine.model import DenseDecoder, init_weights, tiny_cpu_config  # noqa: E402
from engine.pipeline import OffloadedDecoder  # noqa: E402
from engine.timing import Timer  # noqa: E402

pytestmark = pytest.mark.gpu
MODES = ["per_fragment", "gather_scatter", "gpu_gather"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_heads", [False, True])
def test_cuda_recall_matches_host_blocks_in_both_modes(make_pools, with_heads, dtype):
    gen = torch.Generator().manual_seed(0)
    src = torch.randperm(20, generator=gen)[:6]
    dst = torch.randperm(12, generator=gen)[:6]
    heads = torch.arange(6) % 2 if with_heads else None
    results = []
    for mode in MODES:
        device_pool, host_pool = make_pools(dtype=dtype, device="cuda", block_size=16)
        assert host_pool.layers[0].is_pinned()
        host_before = host_pool.layers[1].clone()
        io = make_io(mode, host_pool, device_pool, **({"staging_bytes": 4096} if mode == "gather_scatter" else {}))
        for layer in range(2):
            io.recall(layer, src, dst, heads)
            io.wait(layer)
        torch.cuda.synchronize()
        assert torch.equal(host_pool.layers[1], host_before)
        if heads is None:
            assert torch.equal(device_pool.layers[1][dst.cuda()].cpu(), host_pool.layers[1][src])
        results.append(torch.cat([layer.cpu().view(-1).view(torch.uint8) for layer in device_pool.layers]))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_cuda_gpu_gather_runs_the_triton_kernel_when_triton_is_there(make_pools):
    """The gpu_gather mode must really be a GPU kernel on pinned host memory, not the gather_scatter fallback."""
    pytest.importorskip("triton")
    device_pool, host_pool = make_pools(dtype=torch.bfloat16, device="cuda", block_size=16)
    io = make_io("gpu_gather", host_pool, device_pool)
    src, dst = torch.arange(4), torch.arange(4) + 2
    io.recall(0, src, dst)
    io.wait(0)
    torch.cuda.synchronize()
    assert io.path == "triton_uva"
    assert torch.equal(device_pool.layers[0][dst.cuda()].cpu(), host_pool.layers[0][src])


@pytest.mark.parametrize("selection", ["solohead", "headwise"])
def test_cuda_full_budget_decode_with_prefetch_equals_dense(selection):
    config = tiny_cpu_config()
    weights = init_weights(config, seed=0, device="cuda")
    policy = SparsePolicy(block_size=8, sink_tokens=8, recent_tokens=16, budget_tokens=10_000)
    decoder = OffloadedDecoder(
        config, weights, policy, 64, 48, selection=selection, prefetch=True, device="cuda", timer=Timer("cuda")
    )
    dense = DenseDecoder(config, weights)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).cuda() for n in (37, 64, 50)]
    caches = []
    for i, prompt in enumerate(prompts):
        decoder.add_request(i, prompt)
        caches.append(dense.prefill(prompt)[1])
    tokens = torch.tensor([1, 2, 3], device="cuda")
    for _ in range(12):
        got = decoder.decode_step([0, 1, 2], tokens)
        want, caches = dense.decode(tokens, caches)
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        tokens = got.argmax(-1)
    timing = decoder.timer.table()
    assert bool((timing["seconds"] >= 0).all()) and "recall" in set(timing["name"])
