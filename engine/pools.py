"""Paged KV pools (device and host tiers) and their block allocator.

A pool holds, per layer, one block-major tensor [num_blocks, 2, block_size, num_kv_heads, head_dim]
(index 0 of dim 1 is K, 1 is V). A block id names the same block position in every layer, as in vLLM,
so one allocator serves all layers. Block-major means a whole block (every KV head) is one contiguous
chunk: SoloHead recall moves whole blocks, head-wise recall moves (block, head) fragments.

Lifecycle: `allocate(n)` hands out n free ids or returns None when the pool cannot (the caller decides
to evict, offload or wait); `free(ids)` returns them and rejects ids that are out of range or already
free. The host pool is pinned when CUDA is present, so host-to-device copies can run asynchronously.
"""

from __future__ import annotations

import math

import torch

TIERS = ("device", "host")


class BlockAllocator:
    """Free list of block ids [0, num_blocks); O(1) per block; lowest ids come out first when fresh."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks={num_blocks} must be >= 0")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() gives the lowest id first
        self._is_free = [True] * num_blocks

    @property
    def num_free(self) -> int:
        """Block ids currently free."""
        return len(self._free)

    def is_free(self, block_id: int) -> bool:
        """Whether block_id (in [0, num_blocks)) is free; IndexError outside that range."""
        return self._is_free[block_id]

    def allocate(self, n: int) -> list[int] | None:
        """Take n free ids, or None (taking nothing) if fewer than n are free.

        Raises:
            ValueError: if n < 0.
        """
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        if n > len(self._free):
            return None
        ids = [self._free.pop() for _ in range(n)]
        for i in ids:
            self._is_free[i] = False
        return ids

    def free(self, ids: list[int]) -> None:
        """Return ids to the free list; all-or-nothing.

        Raises:
            ValueError: if an id is out of [0, num_blocks), already free, or repeated in ids.
        """
        seen: set[int] = set()
        for i in ids:
            if not 0 <= i < self.num_blocks:
                raise ValueError(f"block id {i} is out of range [0, {self.num_blocks})")
            if self._is_free[i] or i in seen:
                raise ValueError(f"block id {i} is already free (double free)")
            seen.add(i)
        for i in ids:
            self._is_free[i] = True
            self._free.append(i)


class KVPool:
    """One tier's KV blocks for every layer, plus the allocator of its block ids.

    Attributes:
        layers: per layer, [num_blocks, 2, block_size, num_kv_heads, head_dim], `dtype`, on `device`
            (pinned CPU memory when `pin_memory`).
        allocator: hands out block ids valid in every layer.
    """

    def __init__(
        self,
        tier: str,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        pin_memory: bool = False,
    ) -> None:
        """Allocate zeroed pools.

        Raises:
            ValueError: if tier is not "device" or "host", or a size is < 1 (num_blocks may be 0).
        """
        if tier not in TIERS:
            raise ValueError(f"tier={tier!r} must be one of {TIERS}")
        for name, value in (("num_layers", num_layers), ("block_size", block_size)):
            if value < 1:
                raise ValueError(f"{name}={value} must be >= 1")
        if num_kv_heads < 1 or head_dim < 1:
            raise ValueError(f"num_kv_heads={num_kv_heads} and head_dim={head_dim} must be >= 1")
        self.tier = tier
        self.device = torch.device(device)
        self.block_shape = (2, block_size, num_kv_heads, head_dim)
        self.allocator = BlockAllocator(num_blocks)
        shape = (num_blocks, *self.block_shape)
        self.layers = [
            torch.zeros(shape, dtype=dtype, device=self.device, pin_memory=pin_memory) for _ in range(num_layers)
        ]

    @property
    def num_blocks(self) -> int:
        """Blocks per layer."""
        return self.allocator.num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block (P)."""
        return self.block_shape[1]

    @property
    def num_kv_heads(self) -> int:
        """KV heads per token (Hkv)."""
        return self.block_shape[2]

    @property
    def dtype(self) -> torch.dtype:
        """Element dtype of every layer's tensor."""
        return self.layers[0].dtype

    @property
    def block_bytes(self) -> int:
        """Bytes of one block in one layer (all heads, K and V)."""
        return math.prod(self.block_shape) * self.layers[0].element_size()

    @property
    def fragment_bytes(self) -> int:
        """Bytes of one (block, KV head) fragment in one layer: 2 * block_size * head_dim * dtype bytes."""
        return self.block_bytes // self.num_kv_heads


def make_pools(
    num_layers: int,
    num_device_blocks: int,
    num_host_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> tuple[KVPool, KVPool]:
    """A device pool on `device` and a host pool in CPU memory, pinned when `device` is CUDA.

    On a CPU-only machine the device pool is a second CPU tensor standing in for device memory.

    Returns:
        (device_pool, host_pool).
    """
    device = torch.device(device)
    dims = (block_size, num_kv_heads, head_dim, dtype)
    device_pool = KVPool("device", num_layers, num_device_blocks, *dims, device=device)
    host_pool = KVPool("host", num_layers, num_host_blocks, *dims, device="cpu", pin_memory=device.type == "cuda")
    return device_pool, host_pool
