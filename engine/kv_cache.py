"""Offloaded KV cache: which blocks of each request live where, and the per-step index tensors.

A request's logical blocks split into the always-resident sink (the first `sink_tokens`), the recent
window (the last `recent_tokens`, including the partly filled tail) and the offloaded middle, which
lives in the host pool with a summary on the device. Per decode step (`prepare_step`):

  1. every request that starts a new block gets a device block for its tail;
  2. the block that just left the recent window is offloaded (device -> host, all layers), summarised,
     and its device block freed;
  3. a recall arena of B x K device blocks is allocated (K = selected blocks per request), and the index
     tensors every layer needs are built once: resident device block ids and token counts, candidate
     host block ids, arena device block ids. Layers then only select, recall into the arena, write the
     new token and attend.

`finish_step` frees the arena and advances the lengths. Allocation failures roll back and report:
`add_request` returns False, `prepare_step` raises RuntimeError naming the pool to enlarge.
Dimension names: B requests, R resident blocks, C candidate blocks, K arena blocks per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.block_table import BlockTable
from engine.io import offload_blocks
from engine.pools import KVPool, make_pools
from engine.summaries import BlockSummaries


@dataclass(frozen=True)
class SparsePolicy:
    """What stays resident and how much is recalled; all token counts are per (request, layer)."""

    block_size: int  # P, tokens per block
    sink_tokens: int  # always resident prefix; multiple of block_size, may be 0
    recent_tokens: int  # always resident suffix (incl. the tail block); multiple of block_size, >= block_size
    budget_tokens: int  # selected offloaded tokens attended per step; budget_blocks = budget_tokens // block_size

    def __post_init__(self) -> None:
        """Raises ValueError unless block_size >= 1, sink and recent tokens are block multiples with recent >= one
        block, and budget_tokens >= 0."""
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be >= 1")
        for name in ("sink_tokens", "recent_tokens"):
            value = getattr(self, name)
            if value < 0 or value % self.block_size:
                raise ValueError(f"{name}={value} must be a non-negative multiple of block_size={self.block_size}")
        if self.recent_tokens < self.block_size:
            raise ValueError(f"recent_tokens={self.recent_tokens} must be >= block_size={self.block_size}")
        if self.budget_tokens < 0:
            raise ValueError(f"budget_tokens={self.budget_tokens} must be >= 0")

    @property
    def resident_tokens(self) -> int:
        """Sink plus recent window: tokens always attended (per request and layer)."""
        return self.sink_tokens + self.recent_tokens

    def is_resident(self, logical: int, num_blocks: int) -> bool:
        """Whether logical block `logical` of a request with `num_blocks` blocks stays on the device."""
        p = self.block_size
        return logical < self.sink_tokens // p or logical >= num_blocks - self.recent_tokens // p


@dataclass
class StepIndices:
    """Index tensors of one decode step, built once and shared by every layer (device tensors unless noted)."""

    request_ids: list[int]
    positions: torch.Tensor  # int64 [B], position of the new token
    tail_block_ids: torch.Tensor  # int64 [B], device block id of the block the new token goes into
    tail_offsets: torch.Tensor  # int64 [B], its offset in that block (its slot: tail_block_ids * P + offset)
    attend_block_ids: torch.Tensor  # int64 [B, R + K]: per row the request's resident device blocks, its arena,
    # then padding
    attend_tokens: torch.Tensor  # int64 [B, R + K], valid tokens per listed block (0 = padding)
    attend_counts: list[int]  # host ints [B]: row b's first attend_counts[b] entries are its own resident blocks
    # and the arena blocks its selection fills (a request with fewer candidates than K leaves the rest unread)
    candidates: torch.Tensor  # int64 [B, C], host ids of offloaded blocks (padding: 0)
    candidate_valid: torch.Tensor  # bool [B, C]
    arena_cpu: torch.Tensor  # int64 [B, K] on CPU, device block ids the recall fills
    budget_blocks: int  # K


class OffloadedKVCache:
    """Device and host pools, block table, summaries and request lengths for a sparse-offloaded decoder."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        policy: SparsePolicy,
        num_device_blocks: int,
        num_host_blocks: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.policy = policy
        self.device = torch.device(device)
        dims = (policy.block_size, num_kv_heads, head_dim, dtype)
        self.device_pool, self.host_pool = make_pools(num_layers, num_device_blocks, num_host_blocks, *dims, device)
        self.summaries = BlockSummaries(num_layers, num_host_blocks, num_kv_heads, head_dim, dtype, self.device)
        self.table = BlockTable()
        self.lengths: dict[int, int] = {}
        self._arena: list[int] = []

    def add_request(self, request_id: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Store a prefilled prompt: kv[layer] = (k, v), each [T, Hkv, D] on the device, T >= 1.

        Returns:
            False (storing nothing) if either pool lacks free blocks; True otherwise.

        Raises:
            ValueError: if request_id is already stored.
        """
        if request_id in self.lengths:
            raise ValueError(f"request_id={request_id} is already stored")
        p, t = self.policy.block_size, kv[0][0].shape[0]
        nb = -(-t // p)
        resident = [self.policy.is_resident(j, nb) for j in range(nb)]
        dev_ids = self.device_pool.allocator.allocate(sum(resident))
        host_ids = self.host_pool.allocator.allocate(nb - sum(resident))
        if dev_ids is None or host_ids is None:
            self.device_pool.allocator.free(dev_ids or [])
            self.host_pool.allocator.free(host_ids or [])
            return False
        self.table.add_request(request_id)
        dev_iter, host_iter = iter(dev_ids), iter(host_ids)
        for j in range(nb):
            self.table.append(request_id, *(("device", next(dev_iter)) if resident[j] else ("host", next(host_iter))))
        mask = torch.tensor(resident, device=self.device)
        dev_index = torch.tensor(dev_ids, dtype=torch.int64, device=self.device)
        host_index = torch.tensor(host_ids, dtype=torch.int64)
        for layer, (k, v) in enumerate(kv):
            blocks = torch.zeros(nb * p, 2, *k.shape[1:], dtype=k.dtype, device=k.device)
            blocks[:t, 0], blocks[:t, 1] = k, v
            blocks = blocks.view(nb, p, 2, *k.shape[1:]).transpose(1, 2)  # [nb, 2, P, Hkv, D]
            self.device_pool.layers[layer][dev_index] = blocks[mask]
            self.host_pool.layers[layer][host_index] = blocks[~mask].cpu()
            self.summaries.update(layer, host_index.to(self.device), blocks[~mask][:, 0])
        self.lengths[request_id] = t
        return True

    def remove_request(self, request_id: int) -> None:
        """Free every block of the request."""
        refs = self.table.remove_request(request_id)
        self.device_pool.allocator.free([r.block_id for r in refs if r.tier == "device"])
        self.host_pool.allocator.free([r.block_id for r in refs if r.tier == "host"])
        del self.lengths[request_id]

    def prepare_step(self, request_ids: list[int]) -> StepIndices:
        """Grow tails, offload blocks that left the window, allocate the recall arena, build index tensors.

        Raises:
            ValueError: if a request is unknown or repeated.
            RuntimeError: if the device or host pool has no free block for a tail, offload or the arena.
        """
        if len(set(request_ids)) != len(request_ids) or any(r not in self.lengths for r in request_ids):
            raise ValueError(f"request_ids={request_ids} must be distinct, known requests")
        for r in request_ids:
            self._grow_and_offload(r)
        return self._build_indices(request_ids)

    def finish_step(self, step: StepIndices) -> None:
        """Free the arena and count the new tokens."""
        self.device_pool.allocator.free(self._arena)
        self._arena = []
        for r in step.request_ids:
            self.lengths[r] += 1

    def write_token(self, layer: int, step: StepIndices, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' k, v [B, Hkv, D] into their tail blocks of one layer."""
        pool = self.device_pool.layers[layer]
        pool[step.tail_block_ids, 0, step.tail_offsets] = k
        pool[step.tail_block_ids, 1, step.tail_offsets] = v

    def _grow_and_offload(self, request_id: int) -> None:
        """Give the new token a tail block if it starts one, and offload the block that leaves the window.

        Idempotent for a step (safe to retry after a RuntimeError), and all-or-nothing per request.
        """
        p = self.policy.block_size
        nb = self.table.num_blocks(request_id)
        if nb * p > self.lengths[request_id]:
            return  # the new token fits in the current tail
        leaving = nb - self.policy.recent_tokens // p  # logical index once the tail is appended
        offload = leaving >= self.policy.sink_tokens // p and self.table.blocks(request_id)[leaving].tier == "device"
        device_block_id = self._allocate(self.device_pool, 1, "a new tail block")[0]
        if not offload:
            self.table.append(request_id, "device", device_block_id)
            return
        host_ids = self.host_pool.allocator.allocate(1)
        if host_ids is None:
            self.device_pool.allocator.free([device_block_id])
            raise RuntimeError(_full_message(self.host_pool, 1, "an offloaded block"))
        self.table.append(request_id, "device", device_block_id)
        old = self.table.move(request_id, leaving, "host", host_ids[0])
        offload_blocks(self.device_pool, self.host_pool, [old.block_id], host_ids)
        ids = torch.tensor(host_ids, device=self.device)
        for layer, pool in enumerate(self.device_pool.layers):
            self.summaries.update(layer, ids, pool[old.block_id : old.block_id + 1, 0])
        self.device_pool.allocator.free([old.block_id])

    def _build_indices(self, request_ids: list[int]) -> StepIndices:
        p, b = self.policy.block_size, len(request_ids)
        resident, tokens, candidates = [], [], []
        for r in request_ids:
            refs, length = self.table.blocks(r), self.lengths[r]
            on_device = [(j, ref.block_id) for j, ref in enumerate(refs) if ref.tier == "device"]
            resident.append([block_id for _, block_id in on_device])
            tokens.append([min(p, length + 1 - j * p) for j, _ in on_device])  # the tail counts the new token
            candidates.append([ref.block_id for ref in refs if ref.tier == "host"])
        c_max = max(map(len, candidates))
        k = min(self.policy.budget_tokens // p, c_max)
        self.device_pool.allocator.free(self._arena)  # a step that was prepared but never finished
        self._arena = []
        self._arena = self._allocate(self.device_pool, b * k, f"a recall arena of {b} x {k} blocks")
        r_max = max(map(len, resident))
        block_rows, token_rows = [], []
        for i in range(b):  # each row: its resident blocks, its arena, then padding (a valid prefix per request)
            pad = [0] * (r_max - len(resident[i]))
            block_rows.append(resident[i] + self._arena[i * k : (i + 1) * k] + pad)
            filled = min(k, len(candidates[i]))
            token_rows.append(tokens[i] + [p] * filled + [0] * (k - filled) + pad)
        lengths = [self.lengths[r] for r in request_ids]
        tails = [self.table.blocks(r)[n // p].block_id for r, n in zip(request_ids, lengths)]
        dev = self.device
        return StepIndices(
            request_ids=list(request_ids),
            positions=torch.tensor(lengths, device=dev),
            tail_block_ids=torch.tensor(tails, device=dev),
            tail_offsets=torch.tensor([n % p for n in lengths], device=dev),
            attend_block_ids=torch.tensor(block_rows, dtype=torch.int64, device=dev),
            attend_tokens=torch.tensor(token_rows, dtype=torch.int64, device=dev),
            attend_counts=[len(r) + min(k, len(c)) for r, c in zip(resident, candidates)],  # filled arena only
            candidates=torch.tensor([c + [0] * (c_max - len(c)) for c in candidates], dtype=torch.int64, device=dev),
            candidate_valid=torch.tensor(
                [[True] * len(c) + [False] * (c_max - len(c)) for c in candidates], dtype=torch.bool, device=dev
            ),
            arena_cpu=torch.tensor(self._arena, dtype=torch.int64).view(b, k),
            budget_blocks=k,
        )

    @staticmethod
    def _allocate(pool: KVPool, n: int, what: str) -> list[int]:
        ids = pool.allocator.allocate(n)
        if ids is None:
            raise RuntimeError(_full_message(pool, n, what))
        return ids


def _full_message(pool: KVPool, n: int, what: str) -> str:
    return (
        f"{pool.tier} pool has {pool.allocator.num_free} free of {pool.num_blocks} blocks, needs {n} for {what}; "
        "give it more blocks"
    )
