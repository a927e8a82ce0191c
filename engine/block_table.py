"""Block tables: (request, logical block) -> (tier, block_id).

A request's logical block i holds its tokens [i * block_size, (i + 1) * block_size). Each logical block
lives in exactly one tier at a time; offloading moves it from "device" to "host" (`move`). The table
also keeps the reverse map, so a (tier, block_id) can never be owned twice; the caller frees the ids
that `remove_request` returns. Pure bookkeeping: no tensors, no allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.pools import TIERS


@dataclass(frozen=True, slots=True)
class BlockRef:
    """Where one logical block lives: a tier and a block id in that tier's pool."""

    tier: str  # "device" or "host"
    block_id: int  # index into that tier's pool


class BlockTable:
    """Per-request lists of BlockRef, with a reverse map that rejects double ownership."""

    def __init__(self) -> None:
        self._tables: dict[int, list[BlockRef]] = {}
        self._owner: dict[BlockRef, tuple[int, int]] = {}

    @property
    def requests(self) -> list[int]:
        """Ids of the requests with a table, in insertion order."""
        return list(self._tables)

    def add_request(self, request_id: int) -> None:
        """Start an empty table. Raises ValueError if request_id already has one."""
        if request_id in self._tables:
            raise ValueError(f"request_id={request_id} already has a block table")
        self._tables[request_id] = []

    def blocks(self, request_id: int) -> tuple[BlockRef, ...]:
        """The request's blocks in logical order. Raises KeyError for an unknown request."""
        return tuple(self._tables[request_id])

    def num_blocks(self, request_id: int) -> int:
        """Logical blocks of the request. Raises KeyError for an unknown request."""
        return len(self._tables[request_id])

    def append(self, request_id: int, tier: str, block_id: int) -> int:
        """Map the request's next logical block to (tier, block_id); returns its logical index.

        Raises:
            ValueError: if tier is unknown or (tier, block_id) already belongs to a block.
        """
        ref = self._claim(request_id, len(self._tables[request_id]), tier, block_id)
        self._tables[request_id].append(ref)
        return len(self._tables[request_id]) - 1

    def move(self, request_id: int, logical: int, tier: str, block_id: int) -> BlockRef:
        """Remap logical block `logical` to (tier, block_id); returns the old ref (its id is now unowned).

        Raises:
            ValueError: as `append`; IndexError if `logical` is out of range.
        """
        old = self._tables[request_id][logical]
        ref = self._claim(request_id, logical, tier, block_id)
        del self._owner[old]
        self._tables[request_id][logical] = ref
        return old

    def remove_request(self, request_id: int) -> list[BlockRef]:
        """Drop the request's table and return its refs, for the caller to free."""
        refs = self._tables.pop(request_id)
        for ref in refs:
            del self._owner[ref]
        return refs

    def ids_in(self, tier: str) -> set[int]:
        """Every block id of `tier` owned by some request."""
        return {ref.block_id for ref in self._owner if ref.tier == tier}

    def _claim(self, request_id: int, logical: int, tier: str, block_id: int) -> BlockRef:
        if tier not in TIERS:
            raise ValueError(f"tier={tier!r} must be one of {TIERS}")
        ref = BlockRef(tier, block_id)
        if ref in self._owner:
            raise ValueError(f"({tier}, block_id={block_id}) already belongs to (request, block) {self._owner[ref]}")
        self._owner[ref] = (request_id, logical)
        return ref
