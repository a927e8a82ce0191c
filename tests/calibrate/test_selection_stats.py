"""Selection statistics for the simulator's recall model (calibrate/selection_stats.py) on the seeded tiny decoder."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from calibrate.accuracy import teacher_forced_trace  # noqa: E402
from calibrate.selection_stats import (  # noqa: E402
    STATS_COLUMNS,
    change_counts,
    collect_selection_stats,
    lru_misses,
    working_set_sizes,
)
from engine.kv_cache import SparsePolicy  # noqa: E402
from engine.model import init_weights, tiny_cpu_config  # noqa: E402

LAYOUT = SparsePolicy(block_size=16, sink_tokens=16, recent_tokens=64, budget_tokens=0)


@pytest.fixture(scope="module")
def trace():
    torch.set_num_threads(1)
    config = tiny_cpu_config()
    weights = init_weights(config, seed=0)
    tokens = torch.randint(0, config.vocab_size, (512 + 40,), generator=torch.Generator().manual_seed(2))
    return teacher_forced_trace(config, weights, tokens, 512, LAYOUT)


def test_lru_misses_match_a_hand_computed_buffer():
    # capacity 3; a hit refreshes a block (LRU, not FIFO): step 2 touches block 1, so step 3 evicts 2, not 1.
    # t0 {1,2}: 2 missing -> [1,2]; t1 {2,3}: 3 -> [1,2,3]; t2 {1,4}: 4 -> [2,3,1,4] -> evict 2 -> [3,1,4]
    # t3 {2,3}: 2 -> [1,4,2,3] -> evict 1 -> [4,2,3]; t4 {1,4}: 1 missing
    steps = [np.array(s) for s in ([1, 2], [2, 3], [1, 4], [2, 3], [1, 4])]
    assert lru_misses(steps, capacity=3).tolist() == [2, 1, 1, 1, 1]
    assert lru_misses(steps, capacity=4).tolist() == [2, 1, 1, 0, 0]


def test_lru_rejects_a_buffer_smaller_than_the_selection():
    with pytest.raises(ValueError, match="capacity=1"):
        lru_misses([np.array([1, 2])], capacity=1)


def test_change_and_returning_counts_match_a_hand_example():
    sets = [{0, 1}, {1, 2}, {0, 2}, {3, 4}, {0, 1}]
    selected = np.zeros((len(sets), 6), dtype=bool)
    for t, s in enumerate(sets):
        selected[t, sorted(s)] = True
    changed, returning = change_counts(selected, working_set_steps=2)
    assert np.isnan(changed[0]) and changed[1:].tolist() == [1, 1, 2, 2]
    # t2: new {0}, seen at t0 (within 2 steps); t3: {3,4} never seen; t4: {0,1}: 0 at t2, 1 at t1 is 3 back
    assert np.isnan(returning[:2]).all() and returning[2:].tolist() == [1, 0, 1]
    sizes = working_set_sizes(selected, working_set_steps=2)  # distinct blocks of the last two sets
    assert np.isnan(sizes[0]) and sizes[1:].tolist() == [3, 3, 4, 4]


def test_table_has_one_row_per_budget_layer_and_step(trace):
    stats = collect_selection_stats(trace, (32, 64), LAYOUT)
    assert list(stats.columns) == STATS_COLUMNS
    assert len(stats) == 2 * len(trace.q) * trace.steps
    assert (stats["buffer_blocks"] == 2 * stats["budget_tokens"] // 16).all()
    assert (stats["selected_blocks"] == stats["budget_tokens"] // 16).all()


def test_headwise_union_is_at_least_the_solohead_set(trace):
    stats = collect_selection_stats(trace, (32, 64, 128), LAYOUT)
    assert (stats["union_ratio"] >= 1).all()
    assert (stats["headwise_union_blocks"] <= 2 * stats["selected_blocks"]).all()  # tiny model: 2 KV heads


def test_step_zero_is_cold_and_misses_never_exceed_the_selection(trace):
    stats = collect_selection_stats(trace, (64,), LAYOUT)
    first = stats[stats["step"] == 0]
    assert (first["miss_frac"] == 1).all() and (first["headwise_miss_frac"] == 1).all()
    assert (stats["missing_blocks"] <= stats["selected_blocks"]).all()
    assert (stats["solohead_fragments"] == stats["missing_blocks"]).all()


def test_a_budget_covering_every_candidate_changes_only_by_new_candidates(trace):
    stats = collect_selection_stats(trace, (1024,), LAYOUT)
    for _, rows in stats.groupby("layer"):
        grown = np.diff(rows["candidate_blocks"].to_numpy())
        assert rows["changed_blocks"].to_numpy()[1:].tolist() == grown.tolist()
        assert (rows["union_ratio"] == 1).all()
    assert stats["changed_blocks"].sum() > 0  # the 40 steps cross a block boundary: one new candidate


def test_a_buffer_smaller_than_the_budget_is_refused(trace):
    with pytest.raises(ValueError, match="buffer_blocks=2"):
        collect_selection_stats(trace, (64,), LAYOUT, buffer_blocks=2)
