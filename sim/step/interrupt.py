"""Interruptible layer-wise scheduling of one decode step (docs/design.md mechanism 3, our reading).

The step is a sequence of GPU work items (layer l of micro-batch g, in the order the GPU runs them:
(g0,l0), (g1,l0), (g0,l1), ...). Item i needs its recall before it computes:

* a **prefetch** job (the blocks a speculative selection knows early) released when item i − K starts
  computing (K = look-ahead in items = lookahead_layers × micro_batches; at step start for i < K);
* a **correction** job (blocks the early selection got wrong, fetched once the true selection is known)
  released when item i − 1 finishes, i.e. when item i is about to compute. It is **urgent**.

The H2D link serves one job at a time in chunks of ``chunk_bytes``. Jobs are ranked (urgent first, then
the earliest item); a job released with a better rank than the one in service takes the link at the
next chunk boundary of the job in service (pre-emption), which resumes later. Without pre-emption
(``run_closed_form`` in sim/step/pipeline.py) a whole layer's copy runs to completion, FIFO. When a job is
released at the very instant the link picks its next job, the link has already picked (FIFO at ties);
the new job then takes over at the first chunk boundary.

Model assumptions (documented in sim/config/policy.py ``OffloadPolicy``): the selection for a layer d layers
ahead is known when the current layer starts, and a fraction ``late_correction_frac × (d − 1)`` (capped at
1) of its blocks is wrong and must be fetched as the urgent correction; with d = 1 the speculative
selection is exact, as in the sequential pipeline. A gather-scatter job streams: the host gathers chunk
j+1 while the link copies chunk j (sim/step/link.py ``LinkModel.streamed_s``). Such a job holds the link
for its whole service time, but only its copy share counts as link busy time and its gather share as
host-gather busy time (a link waiting on the gather is held, idle: no other job uses it unless it
pre-empts at a chunk boundary). A pre-empted job's busy time is split in the same proportions.

Hot path: three timers (GPU end, link done, pre-emption check) instead of an event heap; jobs are
released inline when the GPU starts or ends an item; the ready queue is a small heap. Intervals are
recorded only when asked (the timeline table).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from sim.step.pipeline import StepTiming

INF = math.inf


def run_interruptible(
    t0: float,
    compute_s: Sequence[float],
    prefetch: Sequence[tuple[float, float]],
    correction: Sequence[tuple[float, float]],
    lookahead_items: int,
    chunk_bytes: float,
    link_free_s: float,
    intervals: list[tuple] | None = None,
) -> StepTiming:
    """Simulate one step's items on the GPU and the chunked priority link.

    Args:
        t0: when item 0 may start (seconds).
        compute_s: GPU time per item, length n_items.
        prefetch: (bytes, service seconds[, copy seconds, gather seconds]) per item for its prefetch job;
            (0, 0) for none. Service is how long the job holds the link; without the last two it is all copy.
        correction: the same per item for its urgent correction job.
        lookahead_items: K ≥ 1; prefetch of item i is released when item i − K starts.
        chunk_bytes: pre-emption granularity of the link.
        link_free_s: when the link finishes work queued before the step.
        intervals: if a list, receives ``(kind, item, start_s, end_s, preempted)`` tuples, kind
            ``"compute"`` or ``"transfer"`` (one per uninterrupted transfer segment).

    Returns:
        :class:`StepTiming`; ``layer_stall_s`` holds the stall per item; ``link_busy_s`` the copy time
        served, ``gather_busy_s`` the host-gather time served.
    """
    n = len(compute_s)
    missing = [int(prefetch[i][1] > 0) + int(correction[i][1] > 0) for i in range(n)]  # int: numpy bools OR
    # heap of [rank, item, remaining_s, chunk_s, copy_frac, gather_frac]; rank = (0 urgent | 1, item)
    ready: list[list] = []
    cur: list | None = None  # the job on the link
    seg_start = 0.0
    link_free = link_free_s if link_free_s > t0 else t0
    link_done = check = INF
    gpu_end = INF
    gpu_next, gpu_free, gpu_item = 0, t0, -1
    busy = gbusy = 0.0
    stalls = [0.0] * n

    def release(table: Sequence[tuple[float, ...]], i: int, urgent: int, t: float) -> None:
        nonlocal check
        entry = table[i]
        nbytes, service = entry[0], entry[1]
        if service <= 0:
            return
        copy_frac, gather_frac = (entry[2] / service, entry[3] / service) if len(entry) > 2 else (1.0, 0.0)
        job = [(urgent ^ 1, i), i, service, service * min(1.0, chunk_bytes / nbytes), copy_frac, gather_frac]
        heapq.heappush(ready, job)
        if cur is not None and job[0] < cur[0]:  # pre-empt at the next chunk boundary of `cur`
            chunks = math.ceil((t - seg_start) / cur[3] - 1e-12) if t > seg_start else 1
            boundary = seg_start + max(chunks, 1) * cur[3]
            if boundary < seg_start + cur[2] - 1e-15 and boundary < check:
                check = boundary

    def dispatch(t: float) -> None:
        nonlocal cur, seg_start, link_done
        if cur is None and ready:
            cur = heapq.heappop(ready)
            seg_start = t if t > link_free else link_free
            link_done = seg_start + cur[2]

    def start_gpu(t: float) -> None:
        nonlocal gpu_item, gpu_end
        if gpu_item >= 0 or gpu_next >= n or missing[gpu_next]:
            return
        i = gpu_next
        start = t if t > gpu_free else gpu_free
        stalls[i] = start - gpu_free
        gpu_item, gpu_end = i, start + compute_s[i]
        if intervals is not None:
            intervals.append(("compute", i, start, gpu_end, False))
        if i + lookahead_items < n:
            release(prefetch, i + lookahead_items, 0, start)
            dispatch(start)

    for i in range(min(lookahead_items, n)):
        release(prefetch, i, 0, t0)
    if n:
        release(correction, 0, 1, t0)
    dispatch(t0)
    start_gpu(t0)
    while gpu_next < n:
        t = min(gpu_end, link_done, check)
        if t == INF:
            raise RuntimeError("interruptible step deadlocked: an item waits for a recall never released")
        if t == gpu_end:  # the GPU finishes an item; the next one is about to run
            gpu_free, gpu_next, gpu_item, gpu_end = t, gpu_item + 1, -1, INF
            if gpu_next < n:
                release(correction, gpu_next, 1, t)
                dispatch(t)
            start_gpu(t)
        elif t == link_done:
            busy += (t - seg_start) * cur[4]
            gbusy += (t - seg_start) * cur[5]
            if intervals is not None:
                intervals.append(("transfer", cur[1], seg_start, t, False))
            missing[cur[1]] -= 1
            cur, link_free, link_done, check = None, t, INF, INF
            dispatch(t)
            start_gpu(t)
        else:  # a chunk boundary at which a better-ranked job waits
            check = INF
            if cur is not None and ready and ready[0][0] < cur[0]:
                busy += (t - seg_start) * cur[4]
                gbusy += (t - seg_start) * cur[5]
                cur[2] -= t - seg_start
                if intervals is not None:
                    intervals.append(("transfer", cur[1], seg_start, t, True))
                heapq.heappush(ready, cur)
                cur, link_free, link_done = None, t, INF
                dispatch(t)
    return StepTiming(gpu_free, sum(stalls), busy, link_free if cur is None else link_done, stalls, gbusy)
