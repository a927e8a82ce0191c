"""Engine test setup: GPU-marked tests are skipped without CUDA; small factories for pools and models."""

from __future__ import annotations

import importlib.util

import pytest


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def make_pools():
    """Factory: (device_pool, host_pool) with random host blocks and a recognisable device fill."""
    torch = pytest.importorskip("torch")
    from engine.pools import make_pools as _make_pools

    def make(
        num_layers=2, num_device_blocks=12, num_host_blocks=20, block_size=4, num_kv_heads=2, head_dim=8,
        dtype=torch.float32, device="cpu", seed=0,
    ):  # fmt: skip
        device_pool, host_pool = _make_pools(
            num_layers, num_device_blocks, num_host_blocks, block_size, num_kv_heads, head_dim, dtype, device
        )
        gen = torch.Generator().manual_seed(seed)
        for layer in host_pool.layers:
            layer.copy_(torch.randn(layer.shape, generator=gen).to(dtype))
        for layer in device_pool.layers:
            layer.fill_(-7)
        return device_pool, host_pool

    return make
