"""The recall state's one step-to-step recurrence (sim/step/recall.py ``RecallModel.run``): the AR(1) drift of a
request's change fraction and its topic shifts, over k steps element by element. One source: numba compiles it when
installed, plain Python runs it otherwise or under ``run.kernels: python`` (:func:`drift_kernel`, as
sim/step/timing.py ``StepDevices`` picks sim/step/pipeline.py's ``compiled_time_steps``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

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


def compiled_drift_steps() -> Callable:
    """:func:`drift_steps_py` compiled by numba (cached on disk), compiled at the first call.

    Raises:
        ImportError: numba is not installed (``pip install 'pulseinfer[fast]'``).
    """
    if not _compiled:
        from numba import njit

        _compiled.append(njit(cache=True)(drift_steps_py))
    return _compiled[0]


def fast_drift(kernels: str) -> bool:
    """Whether ``run.kernels`` (``auto``, ``python`` or ``numba``) runs the compiled recurrence: not ``python``, and
    numba installed (found, not imported)."""
    return kernels != "python" and importlib.util.find_spec("numba") is not None


def drift_kernel(fast: bool) -> Callable:
    """The recurrence to call: :func:`compiled_drift_steps` when ``fast`` (:func:`fast_drift`), else
    :func:`drift_steps_py` as it is."""
    return compiled_drift_steps() if fast else drift_steps_py
