"""Draw streams (sim/step/draws.py): a kind's values depend only on how many were taken before, never on how the
takes were grouped or how the buffer refilled — the property that lets skip-ahead draw k steps at once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.step.draws import DrawStream, RecallDraws, as_draws

KINDS = {
    "uniform": lambda g: g.random,
    "normal": lambda g: g.standard_normal,
    "geometric": lambda g: lambda n: g.geometric(0.3, n),
    "binomial": lambda g: lambda n: g.binomial(8, 0.87, n),
}


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    chunk=st.sampled_from([0, 1, 7, 64, 4096]),
    seed=st.integers(0, 2**31),
)
def test_grouping_does_not_change_the_values(kind, sizes, chunk, seed):
    stream = DrawStream(KINDS[kind](np.random.default_rng(seed)), chunk)
    got = np.concatenate([stream.take(n) for n in sizes])
    want = KINDS[kind](np.random.default_rng(seed))(sum(sizes))
    np.testing.assert_array_equal(got, want)


def test_peek_reads_ahead_without_consuming():
    stream = DrawStream(np.random.default_rng(3).random, chunk=4)
    ahead = stream.peek(10).copy()
    np.testing.assert_array_equal(stream.peek(3), ahead[:3])
    stream.consume(6)
    np.testing.assert_array_equal(stream.take(4), ahead[6:])
    assert not stream.peek(5).flags.writeable  # callers cannot change values later takes will see


def test_consuming_more_than_was_peeked_is_refused():
    stream = DrawStream(np.random.default_rng(0).random)
    stream.peek(2)
    with pytest.raises(ValueError, match=r"consume\(5000\)"):
        stream.consume(5000)


def test_streams_are_independent_and_reproducible():
    a, b = RecallDraws(np.random.default_rng(7)), RecallDraws(np.random.default_rng(7))
    a.change.take(1000)  # using one kind moves no other
    a.binomial(8, 0.5).take(10)
    np.testing.assert_array_equal(a.rounding.take(5), b.rounding.take(5))
    np.testing.assert_array_equal(a.drift.take(5), b.drift.take(5))
    np.testing.assert_array_equal(a.geometric(0.25).take(5), b.geometric(0.25).take(5))
    assert not np.array_equal(RecallDraws(np.random.default_rng(8)).change.take(5), b.change.take(5))


def test_as_draws_keeps_streams_and_wraps_generators():
    draws = RecallDraws(np.random.default_rng(1))
    assert as_draws(draws) is draws
    assert isinstance(as_draws(np.random.default_rng(1)), RecallDraws)
