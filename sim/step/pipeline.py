"""The layer pipeline of one decode step: recall over the H2D link overlapped with layer compute.

Per step, with per-layer host gather times ``g[l]``, link times ``r[l]`` and compute times ``c[l]``
(one-layer look-ahead)::

    recall l   issued at  t0 (l = 0) or when compute of layer l-1 starts (l ≥ 1)
    gather l   starts at  max(issue, host free)            — gather-scatter only; g = 0 otherwise; the
                                                             host-gather resource, not the link
    copy l     starts at  max(gather l end, link free)     — one H2D DMA queue per GPU, FIFO
    compute l  starts at  max(compute l-1 end, copy l end) — stall = the wait on the recall

Model assumption (docs/design.md, mechanism 3, first version): selection for layer l+1 is known when layer l
starts (speculated from layer l's input), so layer l+1's recall overlaps layer l's compute; layer 0's
recall cannot start before the step does.

Two implementations give the same times: :func:`run_closed_form` (a recurrence over layers, the default,
O(num_layers) with no events) and :func:`run_events` (a SimPy process in which the link and the GPU
stream are real ``simpy.Resource`` objects). ``tests/sim/test_pipeline.py`` checks they agree.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

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
