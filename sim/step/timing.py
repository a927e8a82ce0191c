"""Decode steps on the simulation clock: from what steps cost to elapsed time, through the replica's devices.

:meth:`StepDevices.time_steps` hands :func:`sim.step.pipeline.time_steps` the devices' queues; :func:`run_step` is
a step that recalls as a run of one, on SimPy's clock. The pipeline follows from the cost (``cost.interrupt``:
interruptible, else sequential). A step that recalls nothing takes overhead + Σ compute + head, at least the
engine's overlapped host work (:func:`~sim.step.pipeline.idle_step_s`), and never loads numba. The link's queued
H2D work (``link_free_s``) carries over between steps.

D2H (docs/design.md §8; copy engines are per direction, docs/sources.md §3.2): one D2H queue per GPU carries the
eager per-token backups (``StepCost.d2h_bytes``, queued at each decode step's start) and the prompt KV of requests
offloaded after a colocated prefill (:meth:`StepDevices.queue_d2h`); while it is busy H2D copies slow down by the
card's ``d2h_coupling`` (sim/step/pipeline.py ``h2d_slowdown``; a streamed job's copy share only).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import simpy

from sim.config import HardwareSpec
from sim.step.cost import StepCost
from sim.step.link import LinkModel
from sim.step.pipeline import INTERVAL_KINDS, compiled_time_steps, fifo_end_s, h2d_slowdown, idle_step_s, time_steps

RECALLS = np.ones(1, dtype=np.bool_)  # has_recall of a run of one step that recalls (read only by the kernel)
NO_JOBS = np.zeros((1, 1, 4))  # the interruptible jobs of a sequential run (unread)
NO_TIMES = np.zeros((1, 1))  # the sequential times of an interruptible run (unread)
NO_INTERVALS = np.zeros((0, 5))  # no intervals recorded


@dataclass(slots=True)
class StepTiming:
    """What the layer pipeline of one step that recalls reports (seconds)."""

    stall_s: float  # total time the GPU waited on recalls
    link_busy_s: float  # total H2D time of the recalls
    gather_busy_s: float  # total host-gather time of the recalls (not link time)
    layer_stall_s: np.ndarray  # float64 [items] the stall before each work item (layer·groups + group)


@dataclass(slots=True)
class StepsTiming:
    """k decode steps timed in order (:meth:`StepDevices.time_steps`): the first ``steps`` ran; rows past them are
    scratch. Per-step arrays are float64."""

    steps: int
    times_s: np.ndarray  # [k + 1] step boundaries: step i runs from times_s[i] to times_s[i + 1]
    step_s: np.ndarray  # [k] each step's clock advance (times_s[i + 1] = times_s[i] + step_s[i])
    stall_s: np.ndarray  # [k] GPU wait on recalls
    link_busy_s: np.ndarray  # [k] H2D copy time
    gather_busy_s: np.ndarray  # [k] host-gather time
    item_stall_s: np.ndarray  # [k, items] stall before each work item
    link_free_s: float  # the H2D queue's end after the steps
    d2h_free_s: float  # the D2H queue's end after the steps
    d2h_busy_s: float  # D2H seconds queued since the replica started, after the steps
    intervals: list[tuple]  # (kind, item, start_s, end_s, preempted) of the steps, when recorded
    queues_s: np.ndarray  # [k, 3] link_free_s, d2h_free_s and d2h_busy_s after each step


class StepDevices:
    """The devices a replica's decode steps share: the H2D link's queue and the D2H queue.

    Args:
        env: the SimPy environment.
        hardware: the card (D2H bandwidth and coupling); None models no D2H traffic.
        kernels: ``run.kernels``: ``python`` runs the timing kernel as Python, else it is compiled when numba is
            installed (imported at the first step that recalls).
    """

    def __init__(self, env: simpy.Environment, hardware: HardwareSpec | None = None, kernels: str = "auto") -> None:
        self.env = env
        self.fast_kernels = kernels != "python" and importlib.util.find_spec("numba") is not None
        self.link_free_s = 0.0  # when the link finishes the H2D work queued so far
        self.d2h = LinkModel(hardware) if hardware is not None else None
        self.d2h_free_s = 0.0  # when the D2H queue finishes the offload writes queued so far
        self.d2h_busy_s = 0.0  # D2H seconds queued over the run

    def queue_d2h(self, now_s: float, nbytes: float) -> float:
        """Queue ``nbytes`` of offload writes on the D2H link at ``now_s`` (FIFO); return their seconds."""
        if self.d2h is None or nbytes <= 0:
            return 0.0
        seconds = self.d2h.d2h_s(nbytes)
        self.d2h_free_s = fifo_end_s(now_s, self.d2h_free_s, seconds)
        self.d2h_busy_s += seconds
        return seconds

    def queue_h2d(self, now_s: float, seconds: float) -> float:
        """Queue an H2D copy of ``seconds`` on the link at ``now_s``, behind the H2D work queued so far (FIFO: a recall
        queued after it waits for it); while the D2H queue is busy it runs ``1 / (1 − coupling · f)`` times longer
        (f: the share of the copy the D2H queue is busy, :func:`~sim.step.pipeline.h2d_slowdown`). Returns its
        seconds on the link."""
        if seconds <= 0:
            return 0.0
        start = max(now_s, self.link_free_s)
        if self.d2h is not None:
            seconds *= h2d_slowdown(self.d2h_free_s - start, seconds, self.d2h.d2h_coupling)
        self.link_free_s = start + seconds
        return seconds

    def run_forward(self, duration_s: float) -> Generator[simpy.Event, object, None]:
        """Hold the clock ``duration_s`` (a prefill forward, or the scheduler waiting for its synchronous swaps)."""
        yield self.env.timeout(duration_s)

    def time_steps(  # noqa: PLR0913
        self,
        now_s: float,
        compute_s: np.ndarray,
        has_recall: np.ndarray,
        overhead_s: float,
        head_s: float,
        d2h_bytes: float,
        jobs: tuple[np.ndarray, np.ndarray] | None = None,
        lookahead_items: int = 1,
        chunk_bytes: float = 1.0,
        sequential: tuple[np.ndarray, np.ndarray] | None = None,
        next_event_s: float = math.inf,
        stop_recall: float = math.inf,
        record: bool = False,
        host_s: float = 0.0,
        soft_s: float = math.inf,
    ) -> StepsTiming:
        """Time k decode steps from ``now_s`` and the devices' queues, which are read, not changed
        (:func:`sim.step.pipeline.time_steps`, compiled unless ``run.kernels: python`` or numba is missing).

        Args:
            compute_s: float64 [k, items] GPU seconds per work item of each step.
            has_recall: bool [k] the step recalls (timed by the pipeline; else as compute only).
            overhead_s: host overhead before layer 0; head_s: LM head and sampling; d2h_bytes: offload writes each
                step queues at its start.
            jobs: (prefetch, correction) jobs, float64 [k, items, 4] each (``InterruptJobs``'s columns): the
                interruptible pipeline, with ``lookahead_items`` and ``chunk_bytes``.
            sequential: (link seconds, host gather seconds), float64 [k, layers] each: the sequential pipeline.
            next_event_s: stop before the first step that would end at or after it.
            stop_recall: stop before the ``stop_recall``-th step that recalls (the timeline's step).
            record: keep the steps' intervals (``StepsTiming.intervals``).
            host_s: the engine's overlapped host work of each step (seconds; each step lasts at least this long,
                sim/step/pipeline.py ``host_bound_s``).
            soft_s: an event the steps do not see (sim/step/pipeline.py): stop after the first step that ends past it,
                before one that ends exactly at it.

        Raises:
            ValueError: both ``jobs`` and ``sequential`` given.
            RuntimeError: an interruptible item waits for a recall never released (malformed jobs).
        """
        if jobs is not None and sequential is not None:
            raise ValueError("time_steps takes interruptible jobs or the sequential pipeline's times, not both")
        compute = np.ascontiguousarray(compute_s, dtype=np.float64)
        prefetch, correction = (np.ascontiguousarray(p, dtype=np.float64) for p in jobs) if jobs else (NO_JOBS,) * 2
        link_s, gather_s = (
            (np.ascontiguousarray(s, dtype=np.float64) for s in sequential) if sequential else (NO_TIMES,) * 2
        )
        pipeline = 2 if jobs is not None else (1 if sequential is not None else 0)
        d2h = self.d2h
        d2h_s = d2h.d2h_s(d2h_bytes) if d2h is not None and d2h_bytes > 0 else -1.0
        intervals = np.zeros((5 * compute.size + 1, 5)) if record else NO_INTERVALS
        kernel = compiled_time_steps() if self.fast_kernels else time_steps
        j, times, step_s, stall, busy, gather, item_stall, link_free, d2h_free, d2h_busy, rows, queues = kernel(
            float(now_s), compute, np.ascontiguousarray(has_recall, dtype=np.bool_), pipeline, prefetch, correction,
            int(lookahead_items), float(chunk_bytes), link_s, gather_s, float(overhead_s), float(head_s), d2h_s,
            d2h.d2h_coupling if d2h is not None else 0.0, self.link_free_s, self.d2h_free_s, self.d2h_busy_s,
            float(next_event_s), float(stop_recall), intervals, float(host_s), float(soft_s),
        )  # fmt: skip
        kept = [(INTERVAL_KINDS[int(r[0])], int(r[1]), float(r[2]), float(r[3]), bool(r[4])) for r in intervals[:rows]]
        return StepsTiming(
            j, times, step_s, stall, busy, gather, item_stall, link_free, d2h_free, d2h_busy, kept, queues
        )  # fmt: skip


def run_step(
    devices: StepDevices, cost: StepCost, overhead_s: float, intervals: list[tuple] | None = None, host_s: float = 0.0
) -> Generator[simpy.Event, object, StepTiming | None]:
    """Advance the clock through one decode step starting now; use as ``timing = yield from run_step(...)``.

    Args:
        devices: the replica's queues (``link_free_s`` and the D2H queue are read and updated).
        cost: what the step costs (per-item compute; per-layer link and gather times, or interruptible jobs).
        overhead_s: per-step host overhead before layer 0.
        intervals: if a list, receives the step's ``(kind, item, start_s, end_s, preempted)`` intervals.
        host_s: the engine's overlapped host work of the step (it lasts at least this long; sim/step/pipeline.py
            ``host_bound_s``).

    Returns:
        The step's :class:`StepTiming`, or None when the step recalled nothing.
    """
    env = devices.env
    start = env.now
    if cost.recall_s is None and cost.interrupt is None:
        devices.queue_d2h(start, cost.d2h_bytes)
        yield env.timeout(idle_step_s(overhead_s, cost.compute_s, cost.head_s, host_s))
        return None
    compute = np.array(cost.compute_s, dtype=np.float64)[None]
    jobs = sequential = None
    lookahead_items, chunk_bytes = 1, 1.0
    if cost.interrupt is not None:
        p = cost.interrupt
        jobs, lookahead_items, chunk_bytes = (p.prefetch[None], p.correction[None]), p.lookahead_items, p.chunk_bytes
    else:
        gather_s = cost.gather_s if cost.gather_s is not None else np.zeros(len(cost.recall_s))
        sequential = (np.array(cost.recall_s, dtype=np.float64)[None], np.array(gather_s, dtype=np.float64)[None])
    run = devices.time_steps(
        start, compute, RECALLS, overhead_s, cost.head_s, cost.d2h_bytes, jobs, lookahead_items, chunk_bytes,
        sequential, record=intervals is not None, host_s=host_s,
    )  # fmt: skip
    devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s = run.link_free_s, run.d2h_free_s, run.d2h_busy_s
    if intervals is not None:
        intervals.extend(run.intervals)
    yield env.timeout(float(run.step_s[0]))
    return StepTiming(
        float(run.stall_s[0]), float(run.link_busy_s[0]), float(run.gather_busy_s[0]), run.item_stall_s[0]
    )
