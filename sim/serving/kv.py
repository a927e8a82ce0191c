"""KV capacity accounting: the device pool (HBM, in blocks) and host DRAM (bytes) of one replica.

Only counts are kept here; which block holds what is the engine's business. Exhaustion is a return
value (``allocate`` → False), never an exception: the scheduler decides whether to wait or preempt.

Device pool size follows SGLang's rule (docs/sources.md §5.1): HBM − reserve − weights, in blocks of
``block_size × kv_bytes_per_token`` bytes. With tensor parallelism the model and card handed in are one GPU's
(sim/config/parallel.py): weights / tp, KV heads / tp, reserve (c + tp/2) GB — the pool of each GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import GIB, HardwareSpec, ModelSpec
from sim.serving.prefix import PrefixCache


class CapacityError(ValueError):
    """The model cannot be served on this hardware at all (weights + reserve exceed HBM)."""


@dataclass(slots=True)
class Pool:
    """A counted pool of identical units (device blocks, or host bytes)."""

    capacity: int
    used: int = 0
    peak: int = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def allocate(self, n: int) -> bool:
        """Take ``n`` units; False (and nothing taken) if fewer than ``n`` are free."""
        if n > self.capacity - self.used:
            return False
        self.used += n
        if self.used > self.peak:
            self.peak = self.used
        return True

    def release(self, n: int) -> None:
        """Give back ``n`` units taken earlier."""
        assert 0 <= n <= self.used, f"release of {n} units with only {self.used} in use"
        self.used -= n


def device_pool_blocks(model: ModelSpec, hardware: HardwareSpec, block_size: int) -> int:
    """Blocks of ``block_size`` tokens that fit in HBM after weights and reserve.

    Raises:
        CapacityError: if weights plus reserve leave no room for KV, with the numbers and a fix.
    """
    pool_bytes = hardware.hbm_bytes - hardware.reserve_bytes - model.weight_bytes
    block_bytes = block_size * model.kv_bytes_per_token
    if pool_bytes < block_bytes:
        raise CapacityError(
            f"model {model.name} does not fit on hardware {hardware.name}: weights "
            f"{model.weight_bytes / GIB:.1f} GiB + reserve {hardware.reserve_gib:.1f} GiB exceed "
            f"hbm_gib {hardware.hbm_gib:.1f} GiB (per GPU); pick a larger GPU, a smaller model/dtype or a larger "
            f"serving.tp_size"
        )
    return pool_bytes // block_bytes


class KvState:
    """The KV capacity of one replica: the device pool (blocks), host DRAM (bytes) and the requests
    holding them.

    Args:
        device_blocks: device-pool size in blocks (:func:`device_pool_blocks`).
        host_bytes: host DRAM for offloaded KV.
        block_bytes: bytes of one device block (block_size × KV bytes per token).
        fixed_hbm_bytes: weights + reserve (HBM that is never KV).
        prefix: the radix prefix cache whose nodes hold device blocks (sim/serving/prefix.py), or None.

    With a prefix cache, a request's device charge is its blocks minus ``shared_blocks`` (its chain's nodes,
    held once by the cache); unreferenced nodes count as free space that :meth:`make_room` can evict.
    """

    def __init__(
        self, device_blocks: int, host_bytes: int, block_bytes: int, fixed_hbm_bytes: int, prefix=None
    ) -> None:
        self.device = Pool(device_blocks)
        self.host = Pool(host_bytes)
        self.block_bytes = block_bytes
        self.fixed_hbm_bytes = fixed_hbm_bytes
        self.num_offloaded = 0  # offloaded requests holding KV
        self.prefix: PrefixCache | None = prefix
        self.clock = lambda: 0.0  # simulation time, for the prefix cache's LRU (the replica sets it)

    @property
    def evictable_blocks(self) -> int:
        """Device blocks held only by unreferenced prefix-cache nodes (0 without a cache)."""
        return self.prefix.evictable_blocks if self.prefix is not None else 0

    def make_room(self, blocks: int) -> bool:
        """Evict unreferenced prefix nodes (LRU) until ``blocks`` are free; whether they are."""
        short = blocks - self.device.free
        if short > 0 and self.prefix is not None:
            self.device.release(self.prefix.evict(short))
        return self.device.free >= blocks

    def warm(self, chains: list[tuple[tuple[int, ...], int]], block_tokens: int) -> int:
        """Put ``(hash ids, tokens)`` prefixes in the prefix cache before a run, unreferenced, in order (the last most
        recently used; one that does not fit even after evicting earlier ones is left out): what a measured server's
        cache held (calibrate/measured.py ``prefix_chains``). Returns the chains inserted."""
        inserted = 0
        for ids, tokens in chains if self.prefix is not None else ():  # room for the whole chain: eviction may
            whole = sum(-(-t // self.prefix.page_tokens) for t in self.prefix.chain_tokens(ids, tokens, block_tokens))
            if self.make_room(whole):  # take the part already cached, which is then added again
                path, _, added = self.prefix.acquire(ids, tokens, block_tokens, self.clock())
                assert self.device.allocate(added), "warm: room made for the chain it does not have"
                self.prefix.release(path, self.clock())
                inserted += 1
        return inserted

    @property
    def hbm_used_bytes(self) -> int:
        """Weights + reserve + the device blocks in use."""
        return self.fixed_hbm_bytes + self.device.used * self.block_bytes

    def hold(self, req, blocks: int, host_bytes: int) -> None:
        """Give ``req`` (a ``sim.serving.request.Request``) ``blocks`` device blocks and, when it is offloaded,
        ``host_bytes`` of host DRAM. The caller has checked both fit."""
        own = blocks - req.shared_blocks  # the prefix chain's blocks are the cache's (0 without one)
        device_ok = self.device.allocate(own)
        assert device_ok, f"hold of {own} blocks with {self.device.free} free"
        if req.offloaded:
            host_ok = self.host.allocate(host_bytes)
            assert host_ok, f"hold of {host_bytes} host bytes with {self.host.free} free"
            self.num_offloaded += 1
        req.device_blocks, req.host_bytes, req.holds_kv = blocks, host_bytes, True

    def release(self, req) -> None:
        """Give back what ``req`` holds (idempotent: a request holding nothing is left alone)."""
        if not req.holds_kv:  # e.g. a preempted request finishing in its remote re-prefill
            return
        self.device.release(req.device_blocks - req.shared_blocks)
        req.device_blocks, req.holds_kv = 0, False
        if req.prefix_path is not None:
            self.prefix.release(req.prefix_path, self.clock())
            req.prefix_path, req.shared_blocks = None, 0
        if req.offloaded:
            self.host.release(req.host_bytes)
            self.num_offloaded -= 1
            req.host_bytes = 0
