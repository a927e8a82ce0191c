"""The recall model's random draws: one buffered stream per kind of draw, each from its own generator.

Why (docs/design.md §13): with one generator per kind, the values a kind yields depend only on how many were taken
before, never on how they were grouped — ``take(a)`` then ``take(b)`` equals ``take(a + b)``, as numpy's
``Generator`` fills its output element by element (tests/sim/test_draws.py checks each kind) — so the recall model
draws k steps at once (``RecallModel.run``) and a single step sees the numbers it would see within a longer run.
``peek`` reads ahead without consuming, so a skip-ahead run that ends early hands the unused draws on.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

DEFAULT_CHUNK = 4096  # values drawn per refill of a replica's streams (bounds their memory to ~32 KiB each)


class DrawStream:
    """I.i.d. draws of one distribution, read in order through a buffer.

    Args:
        draw: ``draw(count)`` returns the next ``count`` values of the distribution (a numpy array).
        chunk: the fewest values a refill draws (0: exactly what is asked).
    """

    def __init__(self, draw: Callable[[int], np.ndarray], chunk: int = DEFAULT_CHUNK) -> None:
        self._draw = draw
        self._chunk = chunk
        self._buf: np.ndarray | None = None
        self._pos = 0

    def peek(self, count: int) -> np.ndarray:
        """The next ``count`` values without consuming them (a read-only view, shape [count])."""
        buf, pos = self._buf, self._pos
        have = 0 if buf is None else len(buf) - pos
        if have < count or buf is None:
            new = self._draw(max(self._chunk, count - have))
            buf = new if not have else np.concatenate((buf[pos:], new))
            buf.flags.writeable = False
            self._buf, self._pos, pos = buf, 0, 0
        return buf[pos : pos + count]

    def consume(self, count: int) -> None:
        """Mark the next ``count`` values (already peeked) as used."""
        have = 0 if self._buf is None else len(self._buf) - self._pos
        if count > have:
            raise ValueError(f"consume({count}) beyond the {have} values peeked")
        self._pos += count

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` values, consumed."""
        out = self.peek(count)
        self._pos += count
        return out


class RecallDraws:
    """The streams the recall model (sim/step/recall.py) draws from, spawned from one seeded generator.

    Args:
        rng: the replica's seeded generator; each stream gets a child (``Generator.spawn``).
        chunk: refill size of each stream (0 for one-off use: draw exactly what is asked).

    Streams: ``change`` (uniform: Kumaraswamy inverse CDF), ``rounding`` (uniform: stochastic rounding of the misses),
    ``burst`` (uniform: topic-shift starts), ``join`` (standard normal: a joining request's persistent factors),
    ``drift`` (standard normal: the AR(1) drift), and per parameter ``geometric(p)`` (shift lengths) and
    ``binomial(n, p)`` (fresh blocks selected).
    """

    def __init__(self, rng: np.random.Generator, chunk: int = DEFAULT_CHUNK) -> None:
        gens = rng.spawn(7)
        self._chunk = chunk
        self.change = DrawStream(gens[0].random, chunk)
        self.rounding = DrawStream(gens[1].random, chunk)
        self.burst = DrawStream(gens[2].random, chunk)
        self.join = DrawStream(gens[3].standard_normal, chunk)
        self.drift = DrawStream(gens[4].standard_normal, chunk)
        self._kind_rng = {"geometric": gens[5], "binomial": gens[6]}  # children per parameter value, in order of use
        self._param: dict[tuple, DrawStream] = {}

    def geometric(self, p: float) -> DrawStream:
        """Geometric draws of success probability ``p`` (int64)."""
        return self._param_stream(("geometric", p), lambda g: lambda n: g.geometric(p, n))

    def binomial(self, trials: int, p: float) -> DrawStream:
        """Binomial draws of ``trials`` trials with probability ``p`` (int64)."""
        return self._param_stream(("binomial", trials, p), lambda g: lambda n: g.binomial(trials, p, n))

    def _param_stream(self, key: tuple, make: Callable) -> DrawStream:
        stream = self._param.get(key)
        if stream is None:
            (gen,) = self._kind_rng[key[0]].spawn(1)
            stream = self._param[key] = DrawStream(make(gen), self._chunk)
        return stream


def as_draws(rng: np.random.Generator | RecallDraws) -> RecallDraws:
    """``rng`` itself when it is a :class:`RecallDraws`, else one-off streams spawned from the generator."""
    return rng if isinstance(rng, RecallDraws) else RecallDraws(rng, chunk=0)
