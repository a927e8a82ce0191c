"""Block table: single ownership of every (tier, block_id), offload moves, conservation with the allocators."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.block_table import BlockRef, BlockTable  # noqa: E402
from engine.pools import BlockAllocator  # noqa: E402


def test_append_and_move_keep_logical_order():
    table = BlockTable()
    table.add_request(7)
    assert table.append(7, "device", 3) == 0
    assert table.append(7, "device", 5) == 1
    old = table.move(7, 0, "host", 9)
    assert old == BlockRef("device", 3)
    assert table.blocks(7) == (BlockRef("host", 9), BlockRef("device", 5))
    assert table.ids_in("device") == {5} and table.ids_in("host") == {9}


def test_a_block_id_cannot_belong_to_two_blocks():
    table = BlockTable()
    table.add_request(1)
    table.add_request(2)
    table.append(1, "device", 0)
    with pytest.raises(ValueError, match="already belongs"):
        table.append(2, "device", 0)
    table.append(2, "host", 0)  # same id in the other tier is a different block


def test_moved_away_id_can_be_reused():
    table = BlockTable()
    table.add_request(1)
    table.append(1, "device", 0)
    table.move(1, 0, "host", 4)
    table.append(1, "device", 0)
    assert table.ids_in("device") == {0}


def test_unknown_tier_and_duplicate_request_raise():
    table = BlockTable()
    table.add_request(1)
    with pytest.raises(ValueError, match="request_id=1"):
        table.add_request(1)
    with pytest.raises(ValueError, match="tier='disk'"):
        table.append(1, "disk", 0)


def test_remove_request_returns_every_ref():
    table = BlockTable()
    table.add_request(1)
    table.append(1, "device", 2)
    table.append(1, "host", 3)
    assert table.remove_request(1) == [BlockRef("device", 2), BlockRef("host", 3)]
    assert table.requests == [] and table.ids_in("device") == set()


_OPS = st.lists(st.tuples(st.sampled_from(["add", "grow", "offload", "remove"]), st.integers(0, 4)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(_OPS)
def test_blocks_conserved_across_tiers_under_any_sequence(ops):
    """Owned ids of each tier are exactly the allocator's used ids; no id is owned twice."""
    device, host, table = BlockAllocator(6), BlockAllocator(8), BlockTable()
    for op, r in ops:
        known = r in table.requests
        if op == "add" and not known:
            table.add_request(r)
        elif op == "grow" and known and (ids := device.allocate(1)) is not None:
            table.append(r, "device", ids[0])
        elif op == "offload" and known:
            on_device = [j for j, ref in enumerate(table.blocks(r)) if ref.tier == "device"]
            if on_device and (ids := host.allocate(1)) is not None:
                device.free([table.move(r, on_device[0], "host", ids[0]).block_id])
        elif op == "remove" and known:
            refs = table.remove_request(r)
            device.free([x.block_id for x in refs if x.tier == "device"])
            host.free([x.block_id for x in refs if x.tier == "host"])
        for tier, alloc in (("device", device), ("host", host)):
            owned = [ref.block_id for q in table.requests for ref in table.blocks(q) if ref.tier == tier]
            assert len(owned) == len(set(owned))
            assert set(owned) == {i for i in range(alloc.num_blocks) if not alloc.is_free(i)}
