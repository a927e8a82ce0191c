"""KV capacity accounting: the device pool (HBM, in blocks) and host DRAM (bytes) of one replica.

Only counts are kept here; which block holds what is the engine's business. Exhaustion is a return
value (``allocate`` → False), never an exception: the scheduler decides whether to wait or retract.

Device pool size follows SGLang's rule (REFERENCE.md §5.1): HBM − reserve − weights, in blocks of
``block_size × kv_bytes_per_token`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import GIB, HardwareSpec, ModelSpec


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
            f"hbm_gib {hardware.hbm_gib:.1f} GiB; pick a larger GPU or a smaller model/dtype"
        )
    return pool_bytes // block_bytes
