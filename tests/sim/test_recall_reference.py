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
    stats = RecallStatsSpec(change_mean_by_depth=[(0.0, change)], returning_frac=returning, working_set_steps=window)
    model = ModelSpec.model_validate(load_card("model", "qwen3-14b"))
    link = LinkModel(HardwareSpec.model_validate(load_card("hardware", "h200")))
    rec = RecallModel(model, OffloadPolicy(recall_buffer_blocks=capacity), stats, link)
    hit = np.clip((capacity - k) / (k * rec.working_growth[0]), 0, 1)
    expected = change * (1 - returning * hit)
    measured = lru_miss_fraction(4000, k, capacity, change, returning, window, 400, np.random.default_rng(0))
    assert measured == pytest.approx(expected, abs=0.025)
