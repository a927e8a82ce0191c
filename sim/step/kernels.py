"""Compiled fast paths of the per-step hot loops (optional: the ``fast`` extra installs numba).

Why numba: the interruptible layer pipeline (sim/step/interrupt.py) is an event loop over ~2 × items recall
jobs with chunk-boundary pre-emption — data-dependent control flow that numpy cannot vectorise. In Python it
costs ~1 µs per event (~500 µs per 32-layer step); compiled it costs well under 10 µs. numba compiles the same
loop from Python source, keeps no C toolchain in the install and caches the machine code on disk
(``cache=True``), so only the first run on a machine pays the compile (~1–2 s).

:func:`interruptible_arrays` is a line-by-line port of :func:`sim.step.interrupt.run_interruptible` (the
reference, kept in pure Python and used whenever numba is missing or intervals are recorded); the two are
tested equal on random plans (tests/sim/test_kernels.py). Job ranks: the urgent correction of item i has
key i, the prefetch of item i key n + i, so the lowest key is the best rank (urgent first, then the
earliest item), as the reference's ``(urgent ^ 1, item)`` tuples.
"""

from __future__ import annotations

import math

import numpy as np

from sim.step.pipeline import StepTiming

try:  # optional dependency (pip install 'pulseinfer[fast]')
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is absent
    HAVE_NUMBA = False

# float state slots
_SEG, _LINK_FREE, _LINK_DONE, _CHECK, _BUSY, _GBUSY = range(6)


def _release(table, i, key, t, chunk_bytes, rem, chunk, cfrac, gfrac, heap, st, fs):  # noqa: PLR0913
    """Release item i's job of ``table`` (columns bytes, service s, copy s, gather s) under ``key``; if it
    outranks the job on the link, arm the pre-emption check at that job's next chunk boundary."""
    nbytes = table[i, 0]
    service = table[i, 1]
    if service <= 0.0:
        return
    rem[key] = service
    chunk[key] = service * min(1.0, chunk_bytes / nbytes)
    cfrac[key] = table[i, 2] / service
    gfrac[key] = table[i, 3] / service
    _push(heap, st, key)
    c = st[0]
    if c >= 0 and key < c:
        seg = fs[_SEG]
        chunks = math.ceil((t - seg) / chunk[c] - 1e-12) if t > seg else 1
        boundary = seg + max(chunks, 1) * chunk[c]
        if boundary < seg + rem[c] - 1e-15 and boundary < fs[_CHECK]:
            fs[_CHECK] = boundary


def _push(heap, st, key):
    """Push ``key`` on the binary min-heap ``heap[:st[1]]`` (st[1] = its size)."""
    i = st[1]
    st[1] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = key


def _pop(heap, st):
    """Pop the lowest key of the heap (which is not empty)."""
    top = heap[0]
    st[1] -= 1
    size = st[1]
    last = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if last <= heap[child]:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = last
    return top


def _dispatch(t, rem, heap, st, fs):
    """Put the best-ranked ready job on an idle link."""
    if st[0] < 0 and st[1] > 0:
        k = _pop(heap, st)
        st[0] = k
        fs[_SEG] = t if t > fs[_LINK_FREE] else fs[_LINK_FREE]
        fs[_LINK_DONE] = fs[_SEG] + rem[k]


def _interruptible(t0, compute_s, prefetch, correction, lookahead, chunk_bytes, link_free_s):  # noqa: C901
    """The event loop of :func:`sim.step.interrupt.run_interruptible` over arrays (see there)."""
    n = compute_s.shape[0]
    inf = math.inf
    missing = np.zeros(n, dtype=np.int64)
    for i in range(n):
        missing[i] = (1 if prefetch[i, 1] > 0.0 else 0) + (1 if correction[i, 1] > 0.0 else 0)
    rem = np.zeros(2 * n)
    chunk = np.zeros(2 * n)
    cfrac = np.zeros(2 * n)
    gfrac = np.zeros(2 * n)
    heap = np.zeros(2 * n, dtype=np.int64)  # keys of released jobs not on the link
    st = np.zeros(2, dtype=np.int64)  # [key of the job on the link (-1: none), heap size]
    st[0] = -1
    fs = np.zeros(6)
    fs[_LINK_FREE] = link_free_s if link_free_s > t0 else t0
    fs[_LINK_DONE] = inf
    fs[_CHECK] = inf
    gpu_end = inf
    gpu_next = 0
    gpu_free = t0
    gpu_item = -1
    stalls = np.zeros(n)

    for i in range(min(lookahead, n)):
        _release(prefetch, i, n + i, t0, chunk_bytes, rem, chunk, cfrac, gfrac, heap, st, fs)
    if n:
        _release(correction, 0, 0, t0, chunk_bytes, rem, chunk, cfrac, gfrac, heap, st, fs)
    _dispatch(t0, rem, heap, st, fs)
    # start_gpu is inlined (three call sites): flag `try_start` and fall through to the block below.
    try_start = True
    t = t0
    while True:
        if try_start:
            try_start = False
            if gpu_item < 0 and gpu_next < n and missing[gpu_next] == 0:
                i = gpu_next
                start = t if t > gpu_free else gpu_free
                stalls[i] = start - gpu_free
                gpu_item = i
                gpu_end = start + compute_s[i]
                if i + lookahead < n:
                    j = i + lookahead
                    _release(prefetch, j, n + j, start, chunk_bytes, rem, chunk, cfrac, gfrac, heap, st, fs)
                    _dispatch(start, rem, heap, st, fs)
        if gpu_next >= n:
            break
        t = min(gpu_end, fs[_LINK_DONE], fs[_CHECK])
        if t == inf:
            raise RuntimeError("interruptible step deadlocked: an item waits for a recall never released")
        if t == gpu_end:
            gpu_free = t
            gpu_next = gpu_item + 1
            gpu_item = -1
            gpu_end = inf
            if gpu_next < n:
                _release(correction, gpu_next, gpu_next, t, chunk_bytes, rem, chunk, cfrac, gfrac, heap, st, fs)
                _dispatch(t, rem, heap, st, fs)
            try_start = True
        elif t == fs[_LINK_DONE]:
            c = st[0]
            fs[_BUSY] += (t - fs[_SEG]) * cfrac[c]
            fs[_GBUSY] += (t - fs[_SEG]) * gfrac[c]
            item = c if c < n else c - n
            missing[item] -= 1
            st[0] = -1
            fs[_LINK_FREE] = t
            fs[_LINK_DONE] = inf
            fs[_CHECK] = inf
            _dispatch(t, rem, heap, st, fs)
            try_start = True
        else:
            fs[_CHECK] = inf
            c = st[0]
            if c >= 0:
                if st[1] > 0 and heap[0] < c:
                    fs[_BUSY] += (t - fs[_SEG]) * cfrac[c]
                    fs[_GBUSY] += (t - fs[_SEG]) * gfrac[c]
                    rem[c] -= t - fs[_SEG]
                    _push(heap, st, c)
                    st[0] = -1
                    fs[_LINK_FREE] = t
                    fs[_LINK_DONE] = inf
                    _dispatch(t, rem, heap, st, fs)
    link_free = fs[_LINK_FREE] if st[0] < 0 else fs[_LINK_DONE]
    stall = 0.0
    for i in range(n):  # in order, as the reference's sum()
        stall += stalls[i]
    return gpu_free, stalls, stall, fs[_BUSY], link_free, fs[_GBUSY]


if HAVE_NUMBA:
    _push = njit(cache=True)(_push)
    _pop = njit(cache=True)(_pop)
    _release = njit(cache=True)(_release)
    _dispatch = njit(cache=True)(_dispatch)
    _interruptible = njit(cache=True)(_interruptible)


def interruptible_arrays(
    t0: float,
    compute_s: np.ndarray,
    prefetch: np.ndarray,
    correction: np.ndarray,
    lookahead_items: int,
    chunk_bytes: float,
    link_free_s: float,
) -> StepTiming:
    """:func:`sim.step.interrupt.run_interruptible` on arrays, compiled when numba is installed.

    Args:
        t0: when item 0 may start (seconds).
        compute_s: float64 [n] GPU seconds per item.
        prefetch: float64 [n, 4] per item: bytes, link-held seconds, copy seconds, gather seconds (0 service:
            no job).
        correction: float64 [n, 4], the urgent part, same columns.
        lookahead_items: K ≥ 1.
        chunk_bytes: pre-emption granularity of the link.
        link_free_s: when the link finishes work queued before the step.

    Returns:
        :class:`~sim.step.pipeline.StepTiming` (``layer_stall_s`` a float64 [n] array).

    Raises:
        RuntimeError: an item waits for a recall never released (a malformed plan).
    """
    end, stalls, stall, busy, link_free, gbusy = _interruptible(
        float(t0),
        np.asarray(compute_s, dtype=np.float64),
        np.asarray(prefetch, dtype=np.float64),
        np.asarray(correction, dtype=np.float64),
        int(lookahead_items),
        float(chunk_bytes),
        float(link_free_s),
    )
    return StepTiming(end, stall, busy, link_free, stalls, gbusy)
