"""Decode steps on the simulation clock: from what steps cost to when each ends, through the replica's devices.

:meth:`StepDevices.time_run` times a run of k ≥ 1 decode steps (sim/step/cost.py ``DecodeRun``; a single step is a
run of one) from the devices' queues: a run that recalls by :func:`sim.step.pipeline.time_steps` (the pipeline follows
from the costs: interruptible jobs, else the sequential pipeline's times), a recall-free run step by step in Python
(overhead + Σ compute + head, at least the engine's overlapped host work, :func:`~sim.step.pipeline.idle_step_s`;
it never loads numba). The link's queued H2D work (``link_free_s``) carries over between steps and runs.

D2H (docs/design.md §8; copy engines are per direction, docs/sources.md §3.2): one D2H queue per GPU carries the
eager per-token backups (``DecodeRun.d2h_bytes``, queued at each decode step's start) and the prompt KV of requests
offloaded after a colocated prefill (:meth:`StepDevices.queue_d2h`); while it is busy H2D copies slow down by the
card's ``d2h_coupling`` (sim/step/pipeline.py ``h2d_slowdown``; a streamed job's copy share only).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Generator

import numpy as np
import simpy

from sim.config import HardwareSpec
from sim.step.cost import DecodeRun
from sim.step.link import LinkModel
from sim.step.pipeline import INTERVAL_KINDS, compiled_time_steps, fifo_end_s, h2d_slowdown, idle_step_s, time_steps

NO_JOBS = np.zeros((1, 1, 4))  # the interruptible jobs of a sequential run (unread)
NO_TIMES = np.zeros((1, 1))  # the sequential times of an interruptible run (unread)
NO_INTERVALS = np.zeros((0, 5))  # no intervals recorded


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
        self.kernel = None  # the timing kernel, loaded at the first run that recalls (:meth:`_load_kernel`)

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

    def time_run(
        self,
        run: DecodeRun,
        now_s: float,
        overhead_s: float,
        host_s: float = 0.0,
        next_event_s: float = math.inf,
        soft_s: float = math.inf,
        stop_recall: float = math.inf,
        record: bool = False,
    ) -> None:
        """Time the k steps of ``run`` from ``now_s`` and the devices' queues, which are read, not changed (the run's
        :meth:`~sim.step.cost.DecodeRun.commit` moves them); fills the run's times. A recall-free run (no recall
        columns) is timed here step by step (:func:`~sim.step.pipeline.idle_step_s`, in Python floats: a scalar
        branch, never loading numba); any other by :func:`sim.step.pipeline.time_steps`, compiled unless
        ``run.kernels: python`` or numba is missing.

        Args:
            run: the steps' costs (sim/step/cost.py).
            overhead_s: host overhead before layer 0 of each step; host_s: the engine's overlapped host work of each
                step (each step lasts at least this long, sim/step/pipeline.py ``host_bound_s``).
            next_event_s: stop before the first step that would end at or after it.
            soft_s: an event the steps do not see: stop after the first step that ends past it, before one that ends
                exactly at it.
            stop_recall: stop before the ``stop_recall``-th step that recalls (the timeline's step).
            record: keep the steps' intervals (``run.intervals``).

        Raises:
            RuntimeError: an interruptible item waits for a recall never released (malformed jobs).
        """
        L = run.num_layers
        if run.recall_bytes is None:  # recall-free: overhead + Σ layers + head, at least the host work
            head_s, times, layer_s = run.head_s, [now_s], run.group_layer_s[:, 0].tolist()
            for x in layer_s:
                end_s = times[-1] + idle_step_s(overhead_s, [x] * L, head_s, host_s)
                if end_s >= next_event_s or end_s == soft_s:
                    break
                times.append(end_s)
                if end_s > soft_s:  # the step the soft event fell in
                    break
            run.steps, run.times_s = len(times) - 1, times
            # the first step's clock advance (a single step's timeout; a run waits for its end)
            run.step_s = [idle_step_s(overhead_s, [layer_s[0]] * L, head_s, host_s)] if run.steps else []
            return
        compute = run.compute_s if run.compute_s is not None else np.tile(run.group_layer_s, (1, L))
        jobs, sequential = run.jobs, run.sequential
        prefetch, correction = jobs or (NO_JOBS, NO_JOBS)
        prefetch, correction = np.ascontiguousarray(prefetch), np.ascontiguousarray(correction)
        link_s, gather_s = sequential or (NO_TIMES, NO_TIMES)
        link_s, gather_s = np.ascontiguousarray(link_s), np.ascontiguousarray(gather_s)
        d2h = self.d2h
        d2h_s = d2h.d2h_s(run.d2h_bytes) if d2h is not None and run.d2h_bytes > 0 else -1.0
        intervals = np.zeros((5 * compute.size + 1, 5)) if record else NO_INTERVALS
        kernel = self.kernel or self._load_kernel()
        (
            run.steps, times, run.step_s, run.stall_s, run.link_busy_s, run.gather_busy_s, run.item_stall_s, _, _, _,
            rows, run.queues_s,
        ) = kernel(
            float(now_s), np.ascontiguousarray(compute), run.recall_bytes > 0,
            2 if jobs is not None else (1 if sequential is not None else 0), prefetch, correction,
            int(run.lookahead_items), float(run.chunk_bytes), link_s, gather_s, float(overhead_s), float(run.head_s),
            d2h_s, d2h.d2h_coupling if d2h is not None else 0.0, self.link_free_s, self.d2h_free_s, self.d2h_busy_s,
            float(next_event_s), float(stop_recall), intervals, float(host_s), float(soft_s),
        )  # fmt: skip
        run.times_s = times[: run.steps + 1].tolist()
        if rows:
            run.intervals = [
                (INTERVAL_KINDS[int(r[0])], int(r[1]), float(r[2]), float(r[3]), bool(r[4])) for r in intervals[:rows]
            ]

    def _load_kernel(self):
        """The timing kernel: compiled (sim/step/pipeline.py ``compiled_time_steps``) with ``fast_kernels``, else
        the same source as Python; loaded at the first run that recalls."""
        self.kernel = compiled_time_steps() if self.fast_kernels else time_steps
        return self.kernel


def preload_kernels(kernels: str = "auto") -> None:
    """Load the compiled kernels a run that recalls uses (numba's import and its cached machine code, ~0.4 s once per
    process) by calling each on a tiny input, so a simulation that will offload pays it before its event loop rather
    than at its first offloaded step (``Fleet.preload_kernels``). Changes no state of any simulation."""
    from sim.step.drift import drift_kernel, fast_drift

    devices = StepDevices(None, None, kernels)
    one, recalls = np.ones((1, 1)), np.ones(1, dtype=np.int64)
    for jobs, sequential in (((np.zeros((1, 1, 4)),) * 2, None), (None, (one, one))):
        run = DecodeRun(one, None, 0.0, 0, 1, recalls, recall_bytes=recalls, jobs=jobs, sequential=sequential)
        devices.time_run(run, 0.0, 0.0)
    z = np.zeros((1, 1))
    z.flags.writeable = False  # the streams' views are read-only: load that signature
    drift_kernel(fast_drift(kernels))(
        np.zeros(1), np.zeros(1), z, np.zeros((1, 1)), np.zeros((1, 1)), 0.5, 0.5, 0.0, False
    )
