"""The layer pipeline of decode steps: from what k consecutive steps cost to when each ends (one definition, any k).

**Sequential pipeline** (one-layer look-ahead). Per step, with per-layer host gather times ``g[l]``, link times
``r[l]`` and compute times ``c[l]``::

    recall l   issued at  t0 (l = 0) or when compute of layer l-1 starts (l ≥ 1)
    gather l   starts at  max(issue, host free)            — gather-scatter only; g = 0 otherwise; the
                                                             host-gather resource, not the link
    copy l     starts at  max(gather l end, link free)     — one H2D DMA queue per GPU, FIFO
    compute l  starts at  max(compute l-1 end, copy l end) — stall = the wait on the recall

Model assumption (docs/design.md §5, mechanism 3): selection for layer l+1 is known when layer l starts, so layer
l+1's recall overlaps layer l's compute; layer 0's recall cannot start before the step does.

**Interruptible pipeline** (docs/design.md §5, mechanism 3, which defines the work items, the prefetch and urgent
correction jobs, ranks and chunk-boundary pre-emption; Model assumption: ``late_correction_frac × (d − 1)`` of a
selection d layers ahead is wrong). Work items run in the order (g0,l0), (g1,l0), (g0,l1), ...; K =
lookahead_layers × micro_batches. When a job is released at the very instant the link picks its next job, the link
has already picked (FIFO at ties); the new job then takes over at the first chunk boundary. A gather-scatter job
streams (sim/step/link.py ``LinkModel.streamed_s``): it holds the link for its whole service time, but only its copy
share counts as link busy time and its gather share as host-gather busy time (a pre-empted job's busy time is split
in the same proportions). The event loop has three timers (GPU end, link done, pre-emption check) and a binary heap
of ready jobs keyed by rank: the urgent correction of item i has key i, the prefetch of item i key n + i.

**Steps in order** (:func:`time_steps`; docs/design.md §13). Each step starts where the previous one ended, from the
link's queue the previous step left: D2H queue (:func:`fifo_end_s`), H2D slowdown (:func:`h2d_slowdown`; a job's
copy share, and its link-held time with it, stretched as :func:`_release` releases the job), one of the two pipelines
from ``start + overhead``, and the clock advanced by ``end + head − start`` (at least the engine's overlapped host
work, :func:`host_bound_s`) as a SimPy timeout of that delay does (:func:`idle_step_s` for a step that recalls
nothing). It stops before the first step that ends at or after the next event (``next_event_s``: one a step in flight
would see, the horizon), or that would be the ``stop_recall``-th step that recalls; and after the first step that
ends past ``soft_s`` (an event a step in flight does not see: its effects reach the scheduler at the decision after
that step, sim/serving/decode_run.py), before one that ends exactly at it. A step's timing depends on the steps before
it only, so the first i steps timed are what timing i steps gives (the queues after each step are returned too).

**Compiled.** The functions below are plain Python; :func:`compiled_time_steps` compiles copies of them with numba
(the ``fast`` extra; cached on disk), and ``run.kernels: python`` runs them as they are. Every compiled function
lives in this file: numba's cache notices a change to the file of a cached function, not to the files of the
functions it calls. Oracles: tests/sim/oracles/step_timing.py (tests/sim/test_kernels.py).
"""

from __future__ import annotations

import math
import types

import numpy as np

# Interval kinds of the timeline (the recorded step's intervals, column 0 of the intervals array).
COMPUTE, GATHER, TRANSFER = 0, 1, 2
INTERVAL_KINDS = ("compute", "gather", "transfer")
# float state slots of the interruptible loop
_SEG, _LINK_FREE, _LINK_DONE, _CHECK, _BUSY, _GBUSY = range(6)
# Its work arrays (:func:`interrupt_scratch`; two arrays, not seven: each array a compiled call is passed costs it):
# rows of the floats per job key (remaining service s, chunk s, copy and gather shares of the service), and of the
# ints (heap of released keys, missing jobs per item, the link: [key of the job on it (-1: none), heap size]).
_REM, _CHUNK, _COPY, _GATHER = range(4)
_HEAP, _MISSING, _LINK = range(3)


def host_bound_s(serial_s, host_s):
    """Seconds a decode step holds the clock: its serial part ``serial_s`` (host overhead, layers with their recall
    stalls, LM head and serial per-request host work) or, when longer, the engine's host work that overlaps the GPU
    step ``host_s`` (B · ``request_overlapped_us``, sim/step/compute.py ``ComputeModel.overlapped_host_s``; 0 for an
    engine that overlaps nothing, which leaves ``serial_s`` as it is). The one place the max rule is applied."""
    return serial_s if serial_s >= host_s else host_s


def idle_step_s(overhead_s, compute_s, head_s, host_s):
    """Seconds a decode step that recalls nothing holds the clock: the host overhead, its items' compute back to back
    (``compute_s``: an iterable of seconds, summed in order) and the LM head, at least the overlapped host work
    ``host_s`` (:func:`host_bound_s`)."""
    return host_bound_s(overhead_s + sum(compute_s) + head_s, host_s)


def h2d_slowdown(d2h_busy_s, step_s, coupling):
    """Factor (≥ 1) stretching H2D times in a step of ``step_s`` seconds during ``d2h_busy_s`` of which D2H runs, on a
    card whose D2H traffic slows H2D by ``coupling`` at most (sim/step/link.py ``LinkModel.d2h_slowdown``)."""
    if d2h_busy_s <= 0.0 or coupling == 0.0 or step_s <= 0.0:
        return 1.0
    return 1.0 / (1.0 - coupling * min(1.0, d2h_busy_s / step_s))


def fifo_end_s(now_s, queue_end_s, seconds):
    """When a FIFO queue that is busy until ``queue_end_s`` finishes ``seconds`` of work queued at ``now_s``."""
    return max(now_s, queue_end_s) + seconds


def _record(intervals, count, kind, item, start, end, preempted):
    """Write interval row ``count`` (kind, item, start s, end s, pre-empted 0/1) when ``intervals`` has rows (a
    recorded step); return the rows written."""
    if intervals.shape[0] == 0:
        return count
    intervals[count, 0] = kind
    intervals[count, 1] = item
    intervals[count, 2] = start
    intervals[count, 3] = end
    intervals[count, 4] = preempted
    return count + 1


def _sequential(t0, compute, link_s, gather_s, slow, link_free, stalls, intervals, count):  # noqa: PLR0913
    """One step's sequential pipeline (module docstring) from ``t0``: float64 [n] compute, link (× ``slow``) and
    host gather seconds per layer; fills ``stalls`` [n]. Returns (end of the last compute, stall, link busy, link
    free, gather busy, interval rows written)."""
    gpu_free = t0
    issue = t0
    host_free = t0
    stall = 0.0
    busy = 0.0
    gbusy = 0.0
    for layer in range(compute.shape[0]):
        r = link_s[layer] * slow if slow != 1.0 else link_s[layer]
        g = gather_s[layer]
        ready = gpu_free
        if r > 0.0:
            start = issue
            if g > 0.0:
                host_free = (issue if issue > host_free else host_free) + g
                gbusy += g
                start = host_free
                count = _record(intervals, count, GATHER, layer, host_free - g, host_free, 0)
            if link_free > start:
                start = link_free
            link_free = start + r
            busy += r
            count = _record(intervals, count, TRANSFER, layer, start, link_free, 0)
            if link_free > ready:
                stalls[layer] = link_free - ready
                stall += stalls[layer]
                ready = link_free
        issue = ready  # the next layer's recall is issued when this layer's compute starts
        gpu_free = ready + compute[layer]
        count = _record(intervals, count, COMPUTE, layer, ready, gpu_free, 0)
    return gpu_free, stall, busy, link_free, gbusy, count


def _push(ints, key):
    """Push ``key`` on the binary min-heap ``ints[_HEAP, :size]`` (size = ``ints[_LINK, 1]``)."""
    i = ints[_LINK, 1]
    ints[_LINK, 1] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if ints[_HEAP, parent] <= key:
            break
        ints[_HEAP, i] = ints[_HEAP, parent]
        i = parent
    ints[_HEAP, i] = key


def _pop(ints):
    """Pop the lowest key of the heap (which is not empty)."""
    top = ints[_HEAP, 0]
    ints[_LINK, 1] -= 1
    size = ints[_LINK, 1]
    last = ints[_HEAP, size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and ints[_HEAP, child + 1] < ints[_HEAP, child]:
            child += 1
        if last <= ints[_HEAP, child]:
            break
        ints[_HEAP, i] = ints[_HEAP, child]
        i = child
    ints[_HEAP, i] = last
    return top


def _release(table, i, key, t, chunk_bytes, slow, keyed, ints, fs):  # noqa: PLR0913
    """Release item i's job of ``table`` (float64 [n, 4]: bytes, link-held s, copy s, gather s) under ``key``, its copy
    share ``slow`` times longer (the link-held time grows by the extra copy time); if it outranks the job on the
    link, arm the pre-emption check at that job's next chunk boundary."""
    nbytes = table[i, 0]
    service = table[i, 1]
    if service <= 0.0:
        return
    copy = table[i, 2]
    if slow != 1.0:
        extra = copy * (slow - 1.0)
        service += extra
        copy += extra
    keyed[_REM, key] = service
    keyed[_CHUNK, key] = service * min(1.0, chunk_bytes / nbytes)
    keyed[_COPY, key] = copy / service
    keyed[_GATHER, key] = table[i, 3] / service
    _push(ints, key)
    c = ints[_LINK, 0]
    if c >= 0 and key < c:
        seg = fs[_SEG]
        chunks = math.ceil((t - seg) / keyed[_CHUNK, c] - 1e-12) if t > seg else 1
        boundary = seg + max(chunks, 1) * keyed[_CHUNK, c]
        if boundary < seg + keyed[_REM, c] - 1e-15 and boundary < fs[_CHECK]:
            fs[_CHECK] = boundary


def _dispatch(t, keyed, ints, fs):
    """Put the best-ranked ready job on an idle link."""
    if ints[_LINK, 0] < 0 and ints[_LINK, 1] > 0:
        k = _pop(ints)
        ints[_LINK, 0] = k
        fs[_SEG] = t if t > fs[_LINK_FREE] else fs[_LINK_FREE]
        fs[_LINK_DONE] = fs[_SEG] + keyed[_REM, k]


def _preempt_or_finish(t, n, finished, keyed, ints, fs, intervals, count):  # noqa: PLR0913
    """The job on the link leaves it at ``t``: finished (its item misses one job less) or pre-empted (back on the
    heap with what remains); its segment's copy and gather shares count as busy. Returns the interval rows."""
    c = ints[_LINK, 0]
    seg = fs[_SEG]
    fs[_BUSY] += (t - seg) * keyed[_COPY, c]
    fs[_GBUSY] += (t - seg) * keyed[_GATHER, c]
    item = c if c < n else c - n
    count = _record(intervals, count, TRANSFER, item, seg, t, 0 if finished else 1)
    if finished:
        ints[_MISSING, item] -= 1
        fs[_CHECK] = math.inf
    else:
        keyed[_REM, c] -= t - seg
        _push(ints, c)
    ints[_LINK, 0] = -1
    fs[_LINK_FREE] = t
    fs[_LINK_DONE] = math.inf
    _dispatch(t, keyed, ints, fs)
    return count


def interrupt_scratch(n):
    """The work arrays of :func:`_interruptible` for n items, allocated once per run of steps: per job key (2 n keys)
    the remaining service, chunk seconds, copy and gather shares (float64 [4, 2 n], rows ``_REM`` ...); the heap of
    released keys, missing jobs per item and the link state (int64 [3, max(2 n, 2)], rows ``_HEAP``, ``_MISSING``,
    ``_LINK``); the float state slots (float64 [6])."""
    keys = 2 * n
    return np.zeros((4, keys)), np.zeros((3, max(keys, 2)), dtype=np.int64), np.zeros(6)


def _interruptible(  # noqa: C901, PLR0913
    t0, compute, prefetch, correction, lookahead, chunk_bytes, slow, link_free_s, stalls, intervals, count, scratch
):
    """One step's interruptible pipeline (module docstring) from ``t0``: float64 [n] compute seconds per item, float64
    [n, 4] prefetch and correction jobs (bytes, link-held s, copy s, gather s; no job where link-held is 0), their
    copies ``slow`` times longer (:func:`_release`); fills ``stalls`` [n]; ``scratch``: :func:`interrupt_scratch` of n
    items (overwritten; a job key's entries are read only after its release sets them). Returns (end of the last
    compute, stall, link busy, link free, gather busy, interval rows).

    Raises:
        RuntimeError: an item waits for a recall never released (malformed jobs).
    """
    n = compute.shape[0]
    keyed, ints, fs = scratch
    for i in range(n):
        ints[_MISSING, i] = (1 if prefetch[i, 1] > 0.0 else 0) + (1 if correction[i, 1] > 0.0 else 0)
    ints[_LINK, 0] = -1  # no job on the link, none on the heap
    ints[_LINK, 1] = 0
    fs[:] = 0.0
    fs[_LINK_FREE] = link_free_s if link_free_s > t0 else t0
    fs[_LINK_DONE] = math.inf
    fs[_CHECK] = math.inf
    gpu_end = math.inf
    gpu_next = 0
    gpu_free = t0
    gpu_item = -1
    for i in range(min(lookahead, n)):
        _release(prefetch, i, n + i, t0, chunk_bytes, slow, keyed, ints, fs)
    if n:
        _release(correction, 0, 0, t0, chunk_bytes, slow, keyed, ints, fs)
    _dispatch(t0, keyed, ints, fs)
    try_start = True  # the GPU may start its next item at t
    t = t0
    while True:
        if try_start:
            try_start = False
            if gpu_item < 0 and gpu_next < n and ints[_MISSING, gpu_next] == 0:
                i = gpu_next
                start = t if t > gpu_free else gpu_free
                stalls[i] = start - gpu_free
                gpu_item = i
                gpu_end = start + compute[i]
                count = _record(intervals, count, COMPUTE, i, start, gpu_end, 0)
                if i + lookahead < n:
                    j = i + lookahead
                    _release(prefetch, j, n + j, start, chunk_bytes, slow, keyed, ints, fs)
                    _dispatch(start, keyed, ints, fs)
        if gpu_next >= n:
            break
        t = min(gpu_end, fs[_LINK_DONE], fs[_CHECK])
        if t == math.inf:
            raise RuntimeError("interruptible step deadlocked: an item waits for a recall never released")
        if t == gpu_end:  # the GPU finishes an item; the next one is about to run
            gpu_free = t
            gpu_next = gpu_item + 1
            gpu_item = -1
            gpu_end = math.inf
            if gpu_next < n:
                _release(correction, gpu_next, gpu_next, t, chunk_bytes, slow, keyed, ints, fs)
                _dispatch(t, keyed, ints, fs)
            try_start = True
        elif t == fs[_LINK_DONE]:
            count = _preempt_or_finish(t, n, True, keyed, ints, fs, intervals, count)
            try_start = True
        else:  # a chunk boundary at which a better-ranked job may wait
            fs[_CHECK] = math.inf
            if ints[_LINK, 0] >= 0 and ints[_LINK, 1] > 0 and ints[_HEAP, 0] < ints[_LINK, 0]:
                count = _preempt_or_finish(t, n, False, keyed, ints, fs, intervals, count)
    stall = 0.0
    for i in range(n):  # in item order
        stall += stalls[i]
    link_free = fs[_LINK_FREE] if ints[_LINK, 0] < 0 else fs[_LINK_DONE]
    return gpu_free, stall, fs[_BUSY], link_free, fs[_GBUSY], count


def time_steps(  # noqa: PLR0913
    now_s, compute, has_recall, pipeline, prefetch, correction, lookahead, chunk_bytes, link_s, gather_s, overhead_s,
    head_s, d2h_s, coupling, link_free, d2h_free, d2h_busy, next_event_s, stop_recall, intervals, host_s, soft_s,
):  # fmt: skip
    """Time up to k decode steps in order from ``now_s`` (module docstring); rows past the steps timed are scratch.

    Args:
        now_s: the clock at the first step's start (seconds).
        compute: float64 [k, n] GPU seconds per work item of each step.
        has_recall: bool [k] the step recalls (timed by ``pipeline``; else by :func:`idle_step_s`).
        pipeline: 1 sequential, 2 interruptible (0: no step recalls).
        prefetch, correction: float64 [k, n, 4] the interruptible jobs of each step (else any [k', n', 4]).
        lookahead: K ≥ 1 items; chunk_bytes: the link's pre-emption granularity.
        link_s, gather_s: float64 [k, n] the sequential pipeline's link and host gather seconds (else any [k', n']).
        overhead_s: host overhead before layer 0; head_s: LM head after the last layer (each step).
        d2h_s: seconds of one step's offload writes on the D2H queue, −1 when it queues none; coupling: the card's
            D2H coupling (0: no slowdown).
        link_free, d2h_free, d2h_busy: the H2D queue's end, the D2H queue's end and D2H seconds queued so far.
        next_event_s: stop before the first step that would end at or after it; stop_recall: stop before the
            ``stop_recall``-th step that recalls.
        intervals: float64 [m, 5] receives the steps' intervals (kind, item, start s, end s, pre-empted), m ≥ 5 n per
            step timed; [0, 5]: none recorded.
        host_s: the engine's overlapped host work of one step (the batch is the same in every step): each step
            holds the clock at least this long (:func:`host_bound_s`).
        soft_s: stop after the first step that ends past it, before one that ends exactly at it (``math.inf``: none).

    Returns:
        (steps timed j, times float64 [k + 1] of which the first j + 1 are the step boundaries, each step's clock
        advance float64 [k], stall, link busy and gather busy float64 [k], stall per item float64 [k, n], the link
        queue's end, the D2H queue's end and D2H seconds queued after the j steps, interval rows written, and those
        three after each step, float64 [k, 3] (rows past j: scratch), from which the first i < j steps' state is read
        without timing them again).
    """
    k, n = compute.shape
    times = np.empty(k + 1)
    step_s = np.zeros(k)
    stalls = np.zeros(k)
    busys = np.zeros(k)
    gathers = np.zeros(k)
    item_stalls = np.zeros((k, n))
    queues = np.empty((k, 3))
    times[0] = now_s
    scratch = interrupt_scratch(n if pipeline == 2 else 0)  # the interruptible pipeline's, allocated once
    now = now_s
    recalled = 0
    done = 0
    count = 0
    for t in range(k):
        start = now
        step_free, step_busy = d2h_free, d2h_busy
        if d2h_s >= 0.0:  # the step's offload writes
            step_free = fifo_end_s(start, d2h_free, d2h_s)
            step_busy = d2h_busy + d2h_s
        if has_recall[t] and pipeline > 0:
            if recalled + 1 >= stop_recall:
                break
            slow = h2d_slowdown(step_free - start, sum(compute[t]), coupling)
            if pipeline == 2:
                end_s, stall, busy, free, gbusy, count = _interruptible(
                    start + overhead_s, compute[t], prefetch[t], correction[t], lookahead, chunk_bytes, slow, link_free,
                    item_stalls[t], intervals, count, scratch,
                )  # fmt: skip
            else:
                end_s, stall, busy, free, gbusy, count = _sequential(
                    start + overhead_s, compute[t], link_s[t], gather_s[t], slow, link_free, item_stalls[t],
                    intervals, count,
                )  # fmt: skip
            delay = host_bound_s(end_s + head_s - start, host_s)
            if start + delay >= next_event_s or start + delay == soft_s:
                break
            recalled += 1
            link_free = free
            stalls[t], busys[t], gathers[t] = stall, busy, gbusy
        else:
            delay = idle_step_s(overhead_s, compute[t], head_s, host_s)
            if start + delay >= next_event_s or start + delay == soft_s:
                break
        d2h_free, d2h_busy = step_free, step_busy
        step_s[t] = delay
        queues[t, 0] = link_free
        queues[t, 1] = d2h_free
        queues[t, 2] = d2h_busy
        now = start + delay
        times[t + 1] = now
        done = t + 1
        if now > soft_s:  # the step the soft event fell in
            break
    return done, times, step_s, stalls, busys, gathers, item_stalls, link_free, d2h_free, d2h_busy, count, queues


KERNEL_FUNCTIONS = (
    "host_bound_s", "idle_step_s", "fifo_end_s", "h2d_slowdown", "interrupt_scratch",
    "_record", "_sequential", "_push", "_pop", "_release", "_dispatch", "_preempt_or_finish", "_interruptible",
    "time_steps",
)  # fmt: skip
# numba inlines these into their callers' IR (_release, called for every job: a call of its own costs a fifth of
# the interruptible pipeline's time in reference counts of the arrays it is passed)
INLINED_FUNCTIONS = ("_release",)
_compiled: dict = {}


def compiled_time_steps():
    """:func:`time_steps` compiled by numba: the first call imports numba (~0.4 s with the machine code cached on
    disk) and compiles a copy of each of :data:`KERNEL_FUNCTIONS`, each calling the others' compiled copies; the
    module's own functions stay plain Python (``run.kernels: python``).

    Raises:
        ImportError: numba is not installed (``pip install 'pulseinfer[fast]'``).
    """
    if not _compiled:
        from numba import njit

        namespace = dict(globals())  # the copies' globals: each name resolves to its compiled copy
        for name in KERNEL_FUNCTIONS:
            f = namespace[name]
            inline = "always" if name in INLINED_FUNCTIONS else "never"
            copy = types.FunctionType(f.__code__, namespace, name, f.__defaults__)
            namespace[name] = njit(cache=True, inline=inline)(copy)
        _compiled.update(namespace)
    return _compiled["time_steps"]
