"""An explicit LRU recall buffer that tracks block ids: conserves blocks, and its long-run miss fraction
matches the closed-form buffer-hit model of sim/step/recall.py (which the simulator uses for speed)."""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np
import pytest

from sim.config import HardwareSpec, ModelSpec, OffloadPolicy, RecallStatsSpec
from sim.config.loader import load_card
from sim.step.link import LinkModel
from sim.step.recall import RecallModel


def lru_miss_fraction(num_blocks, k, capacity, change, returning, window, steps, rng):
    """Mean fraction of the selection missing from an LRU buffer, skipping the cold first step."""
    selected = set(rng.choice(num_blocks, k, replace=False).tolist())
    history: deque[set[int]] = deque(maxlen=window)  # selections of the last `window` steps
    buffer: OrderedDict[int, None] = OrderedDict()
    misses = []
    for t in range(steps):
        if t:
            recent = set().union(*history)
            returning_pool = list(recent - selected)
            drop = rng.choice(sorted(selected), int(round(change * k)), replace=False).tolist()
            selected -= set(drop)
            for _ in drop:
                if returning_pool and rng.random() < returning:
                    b = returning_pool.pop(int(rng.integers(len(returning_pool))))
                else:
                    while True:
                        b = int(rng.integers(num_blocks))
                        if b not in recent and b not in selected:
                            break
                selected.add(b)
        missing = [b for b in selected if b not in buffer]
        for b in sorted(selected):  # recall misses, touch every selected block
            buffer[b] = None
            buffer.move_to_end(b)
        while len(buffer) > capacity:
            buffer.popitem(last=False)
        host_only = set(range(num_blocks)) - set(buffer)
        assert len(buffer) <= capacity
        assert selected <= set(buffer)
        assert len(buffer) + len(host_only) == num_blocks  # every block is in exactly one place
        history.append(set(selected))
        if t:
            misses.append(len(missing) / k)
    return float(np.mean(misses))


@pytest.mark.parametrize("capacity", [64, 96, 128, 256])
def test_closed_form_buffer_hits_match_an_lru_buffer(capacity):
    k, change, returning, window = 64, 0.2, 0.5, 12
    stats = RecallStatsSpec(
        change_mean_by_depth=[(0.0, change)], returning_frac=returning, working_set_steps=window, working_set_ratio=None
    )
    model = ModelSpec.model_validate(load_card("model", "qwen3-14b"))
    link = LinkModel(HardwareSpec.model_validate(load_card("hardware", "h200")))
    rec = RecallModel(model, OffloadPolicy(recall_buffer_blocks=capacity), stats, link)
    hit = np.clip((capacity - k) / (k * rec.working_growth[0]), 0, 1)
    expected = change * (1 - returning * hit)
    measured = lru_miss_fraction(4000, k, capacity, change, returning, window, 400, np.random.default_rng(0))
    assert measured == pytest.approx(expected, abs=0.025)


def shared_lru_miss_fraction(num_streams, num_blocks, k, capacity, change, returning, window, steps, rng):
    """Mean miss fraction of ``num_streams`` selections (requests × layers) sharing one LRU cache of block ids.

    Each stream evolves as in :func:`lru_miss_fraction`; a step touches the streams in order (layer by layer, as a
    decode step does), recalling the missing blocks of each into the one cache, evicting the least recently used.
    """
    streams = [_Stream(num_blocks, k, window, s, rng) for s in range(num_streams)]
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    misses, selected_total = 0, 0
    for t in range(steps):
        for stream in streams:
            if t:
                stream.advance(change, returning, rng)
            keys = [(stream.sid, b) for b in sorted(stream.selected)]
            missed = sum(key not in cache for key in keys)
            for key in keys:
                cache[key] = None
                cache.move_to_end(key)
            while len(cache) > capacity:
                cache.popitem(last=False)
            assert len(cache) <= capacity
            if t >= window:  # skip the cold start and the first fill of the working sets
                misses += missed
                selected_total += len(keys)
    return misses / selected_total


class _Stream:
    """One (request, layer) selection of k blocks that changes by `change` per step, returning from its window."""

    def __init__(self, num_blocks, k, window, sid, rng):
        self.num_blocks, self.sid = num_blocks, sid
        self.selected = set(rng.choice(num_blocks, k, replace=False).tolist())
        self.history: deque[set[int]] = deque([set(self.selected)], maxlen=window)

    def advance(self, change, returning, rng):
        recent = set().union(*self.history)
        pool = list(recent - self.selected)
        drop = rng.choice(sorted(self.selected), int(round(change * len(self.selected))), replace=False).tolist()
        self.selected -= set(drop)
        for _ in drop:
            if pool and rng.random() < returning:
                b = pool.pop(int(rng.integers(len(pool))))
            else:
                while True:
                    b = int(rng.integers(self.num_blocks))
                    if b not in recent and b not in self.selected:
                        break
            self.selected.add(b)
        self.history.append(set(self.selected))


@pytest.mark.parametrize("fill", [0.8, 1.3, 1.7, 3.0, 4.0])
def test_shared_cache_closed_form_matches_an_lru_cache_of_block_ids(fill):
    """``fill`` = cache / K, the fragments the batch selects per step: < 1 thrashes (every selected block misses);
    between 1 and W/K = 1 + w·m = 3.4 returning blocks partly hit; beyond, the cache holds every working set."""
    requests, k, change, returning, window = 3, 32, 0.2, 0.5, 12
    model = ModelSpec.model_validate(load_card("model", "qwen3-14b")).model_copy(update={"num_layers": 2})
    stats = RecallStatsSpec(
        change_mean_by_depth=[(0.0, change)], returning_frac=returning, working_set_steps=window, working_set_ratio=None
    )
    link = LinkModel(HardwareSpec.model_validate(load_card("hardware", "h200")))
    rec = RecallModel(model, OffloadPolicy(recall_cache="shared"), stats, link)
    selected = np.full(requests, k)
    total = requests * k * model.num_layers  # K
    capacity = int(total * fill)
    hit, thrashing = rec.shared_hit(selected, capacity)
    expected = 1.0 if thrashing else change * (1 - returning * hit)
    streams = requests * model.num_layers
    rng = np.random.default_rng(0)
    measured = shared_lru_miss_fraction(streams, 4000, k, capacity, change, returning, window, 150, rng)
    assert thrashing == (fill < 1)
    assert measured == pytest.approx(expected, abs=0.03)
