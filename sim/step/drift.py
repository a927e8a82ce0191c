"""The recall state's one step-to-step recurrence (sim/step/recall.py ``RecallModel.run``): the AR(1) drift of a
request's change fraction and its topic shifts, over k steps element by element. One source: numba compiles it when
installed, plain Python runs it otherwise."""

from __future__ import annotations

import numpy as np


def drift_steps_py(x, left, z, starts, lengths, corr, scale, burst_prob, burst):  # noqa: PLR0913
    """The recall state's recurrence over k steps, element by element: the drift x ← corr·x + scale·z, a topic
    shift starting where none runs (uniform < burst_prob) with its geometric length, the steps of shift left
    counting down. ``x``, ``left``: float64 [n] before the run (overwritten); ``z``, ``starts``, ``lengths``:
    float64 [k, n] draws. Returns (drift float64 [k, n], left float64 [k, n], shifting bool [k, n]) after each step."""
    k, n = z.shape
    drift = np.empty((k, n))
    lefts = np.empty((k, n))
    shifting = np.empty((k, n), dtype=np.bool_)
    for t in range(k):
        for r in range(n):
            x[r] = corr * x[r] + scale * z[t, r]
            if burst and left[r] <= 0 and starts[t, r] < burst_prob:
                left[r] = lengths[t, r]
            shifting[t, r] = left[r] > 0
            left[r] = max(left[r] - 1.0, 0.0)
            drift[t, r] = x[r]
            lefts[t, r] = left[r]
    return drift, lefts, shifting


_compiled: list = []  # the compiled drift_steps_py, made at the first call (numba is imported only when runs need it)


def drift_steps(*args):
    """:func:`drift_steps_py`, compiled when numba is installed (the ``fast`` extra), else as it is."""
    if not _compiled:
        try:
            from numba import njit

            _compiled.append(njit(cache=True)(drift_steps_py))
        except ImportError:  # pragma: no cover - exercised where numba is absent
            _compiled.append(drift_steps_py)
    return _compiled[0](*args)
