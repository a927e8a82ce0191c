"""Per-step reference implementations of the layer pipeline (test oracles): the sequential pipeline as a recurrence
over Python lists (:func:`run_closed_form`) and as SimPy processes on real resources (:func:`run_events`), the
interruptible pipeline as an event loop over Python tuples and a heap of lists (:func:`run_interruptible`), and one
decode step through the devices' queues as ``run_step`` timed it (:func:`step_reference`). sim/step/pipeline.py
defines the pipeline once over a step axis (``time_steps``; a single step is a run of one), compiled by numba or run
as Python; tests/sim/test_kernels.py checks it against these on random plans, bit for bit."""

from __future__ import annotations

import heapq
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np
import simpy


@dataclass(slots=True)
class StepTiming:
    """Result of one step's layer pipeline (seconds on the simulation clock)."""

    end_s: float  # when the last layer's compute ends
    stall_s: float  # total time the GPU waited on recalls
    link_busy_s: float  # total H2D time of the recalls
    link_free_s: float  # when the link is next free
    layer_stall_s: list[float]  # per layer
    gather_busy_s: float = 0.0  # total host-gather time of the recalls (not link time)


def run_closed_form(
    t0: float,
    compute_s: Sequence[float],
    recall_s: Sequence[float],
    link_free_s: float,
    gather_s: Sequence[float] | None = None,
    intervals: list[tuple] | None = None,
) -> StepTiming:
    """Layer pipeline by recurrence.

    Args:
        t0: time the step's layer 0 may start (seconds).
        compute_s: per-layer GPU time, length num_layers.
        recall_s: per-layer link (copy) time, length num_layers; 0 means nothing to recall.
        link_free_s: when the H2D link finishes work queued before this step.
        gather_s: per-layer host gather time before each copy (gather-scatter), or None; it occupies the
            host-gather resource, never the link.
        intervals: if a list, receives ``(kind, layer, start_s, end_s, preempted)`` tuples for the
            timeline (kind ``compute``, ``gather`` or ``transfer``; never pre-empted here).

    Returns:
        The step's :class:`StepTiming`.
    """
    # Hot path: plain floats, one pass over the layers.
    gpu_free = issue = host_free = t0
    link_free = link_free_s
    stall = busy = gbusy = 0.0
    stalls = [0.0] * len(compute_s)
    gathers = gather_s if gather_s is not None else [0.0] * len(compute_s)
    for layer, (c, r, g) in enumerate(zip(compute_s, recall_s, gathers)):
        ready = gpu_free
        if r > 0.0:
            start = issue
            if g > 0.0:
                host_free = (issue if issue > host_free else host_free) + g
                gbusy += g
                start = host_free
                if intervals is not None:
                    intervals.append(("gather", layer, host_free - g, host_free, False))
            if link_free > start:
                start = link_free
            link_free = start + r
            busy += r
            if intervals is not None:
                intervals.append(("transfer", layer, start, link_free, False))
            if link_free > ready:
                stalls[layer] = link_free - ready
                stall += stalls[layer]
                ready = link_free
        issue = ready  # the next layer's recall is issued when this layer's compute starts
        gpu_free = ready + c
        if intervals is not None:
            intervals.append(("compute", layer, ready, gpu_free, False))
    return StepTiming(gpu_free, stall, busy, link_free, stalls, gbusy)


def run_events(
    env: simpy.Environment,
    link: simpy.Resource,
    gpu: simpy.Resource,
    compute_s: Sequence[float],
    recall_s: Sequence[float],
    host: simpy.Resource | None = None,
    gather_s: Sequence[float] | None = None,
) -> Generator[simpy.Event, object, StepTiming]:
    """Layer pipeline as SimPy processes; use as ``timing = yield env.process(run_events(...))``.

    The recall of layer l is a process that waits for its issue event, holds ``host`` for
    ``gather_s[l]`` (gather-scatter), then ``link`` for ``recall_s[l]``, and fires ``done[l]``; the
    compute loop holds ``gpu`` per layer.
    """
    num_layers = len(compute_s)
    issued = [env.event() for _ in range(num_layers)]
    done = [env.event() for _ in range(num_layers)]
    busy = [0.0, 0.0]  # link, host gather

    def recall(layer: int) -> Generator[simpy.Event, object, None]:
        yield issued[layer]
        if recall_s[layer] > 0.0:
            if gather_s is not None and gather_s[layer] > 0.0:
                with host.request() as req:
                    yield req
                    yield env.timeout(gather_s[layer])
                    busy[1] += gather_s[layer]
            with link.request() as req:
                yield req
                yield env.timeout(recall_s[layer])
                busy[0] += recall_s[layer]
        done[layer].succeed()

    for layer in range(num_layers):
        env.process(recall(layer))
    issued[0].succeed()
    stalls = [0.0] * num_layers
    for layer in range(num_layers):
        wait_from = env.now
        yield done[layer]
        stalls[layer] = env.now - wait_from
        with gpu.request() as req:
            yield req
            if layer + 1 < num_layers:
                issued[layer + 1].succeed()
            yield env.timeout(compute_s[layer])
    return StepTiming(env.now, sum(stalls), busy[0], env.now, stalls, busy[1])


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


def stretched(jobs: np.ndarray, slow: float) -> np.ndarray:
    """The jobs (float64 [n, 4]) with each present job's copy share ``slow`` times longer."""
    if slow == 1.0:
        return jobs
    out = jobs.copy()
    extra = np.where(jobs[:, 1] > 0, jobs[:, 2] * (slow - 1.0), 0.0)
    out[:, 1] += extra
    out[:, 2] += extra
    return out


@dataclass
class Queues:
    """The devices' state between steps: the H2D queue's end, the D2H queue's end and D2H seconds queued."""

    link_free_s: float = 0.0
    d2h_free_s: float = 0.0
    d2h_busy_s: float = 0.0


def step_reference(  # noqa: PLR0913
    queues: Queues,
    start_s: float,
    compute_s: list[float],
    overhead_s: float,
    head_s: float,
    d2h_s: float,
    coupling: float,
    recall_s: list[float] | None = None,
    gather_s: list[float] | None = None,
    plan: tuple[np.ndarray, np.ndarray, int, float] | None = None,
    intervals: list[tuple] | None = None,
) -> tuple[float, StepTiming | None]:
    """One decode step from ``start_s`` as ``run_step`` timed it before the pipeline was written over a step axis:
    the step's offload writes (``d2h_s`` seconds, −1 for none) join the D2H queue, its H2D times stretch by the D2H
    slowdown, then the sequential (``recall_s``, ``gather_s``) or interruptible (``plan``: prefetch, correction,
    look-ahead items, chunk bytes) pipeline runs from ``start_s + overhead_s``; ``queues`` is updated. Returns the
    SimPy delay the step's timeout takes and its timing (None: it recalled nothing)."""
    if d2h_s >= 0:
        queues.d2h_free_s = max(start_s, queues.d2h_free_s) + d2h_s
        queues.d2h_busy_s += d2h_s
    if recall_s is None and plan is None:
        return overhead_s + sum(compute_s) + head_s, None
    busy_s, step_s = queues.d2h_free_s - start_s, sum(compute_s)
    slow = 1.0 if busy_s <= 0 or coupling == 0 or step_s <= 0 else 1.0 / (1.0 - coupling * min(1.0, busy_s / step_s))
    if plan is not None:
        prefetch, correction, lookahead, chunk_bytes = plan
        timing = run_interruptible(
            start_s + overhead_s, compute_s, stretched(prefetch, slow).tolist(), stretched(correction, slow).tolist(),
            lookahead, chunk_bytes, queues.link_free_s, intervals,
        )  # fmt: skip
    else:
        recall = recall_s if slow == 1.0 else [r * slow for r in recall_s]
        timing = run_closed_form(start_s + overhead_s, compute_s, recall, queues.link_free_s, gather_s, intervals)
    queues.link_free_s = timing.link_free_s
    return timing.end_s + head_s - start_s, timing


def jobs4(jobs: Sequence[tuple[float, ...]]) -> np.ndarray:
    """Jobs as (bytes, service s[, copy s, gather s]) tuples → float64 [n, 4] (copy = service, no gather if absent)."""
    rows = [tuple(j) if len(j) == 4 else (j[0], j[1], j[1], 0.0) for j in jobs]
    return np.array(rows, dtype=np.float64).reshape(-1, 4)
