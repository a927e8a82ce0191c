"""One decode step on the simulation clock: from a policy's :class:`~sim.step.cost.StepCost` to elapsed time.

Which pipeline times the step follows from the cost (the policy's choice), not from the scheduler:

* nothing recalled — overhead + Σ layer compute + head, one timeout;
* ``cost.interrupt`` set — the interruptible layer-wise schedule (sim/step/interrupt.py);
* otherwise the sequential pipeline with one-layer look-ahead: the closed-form recurrence
  (sim/step/pipeline.py ``run_closed_form``), or SimPy events on real link/GPU/host resources when
  ``run.layer_model: events`` (``run_events``; tested equal to the recurrence).

The link's state carries over between steps (``link_free_s``: queued H2D work a step leaves behind).

D2H (offload writes): copy engines are per direction (docs/sources.md §3.2), so each GPU has a D2H queue
beside the H2D link. It carries the eager per-token backups of offloaded requests (queued at each decode
step's start, ``StepCost.d2h_bytes``) and the prompt KV of requests that run offloaded after a colocated
prefill (queued when their prefill forward ends, :meth:`StepDevices.queue_d2h`). While it is busy, H2D
copies slow down by the card's ``d2h_coupling``: a step whose first ``b`` seconds (of an estimated
``Σ compute``) overlap queued D2H work runs its H2D times ``1 / (1 − coupling · min(1, b / Σ compute))``
longer (sim/step/link.py). For a streamed gather-scatter job only its copy share stretches.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Generator

import numpy as np
import simpy

from sim.config import HardwareSpec
from sim.step.cost import InterruptPlan, StepCost
from sim.step.interrupt import run_interruptible
from sim.step.link import LinkModel
from sim.step.pipeline import StepTiming, run_closed_form, run_events


class StepDevices:
    """The devices a replica's decode steps share: GPU stream, H2D link, D2H queue, host gather threads.

    Args:
        env: the SimPy environment.
        layer_events: time recalling steps with SimPy events (``run.layer_model: events``) instead of the
            closed-form recurrence.
        hardware: the card (D2H bandwidth and coupling); None models no D2H traffic.
    """

    def __init__(
        self, env: simpy.Environment, layer_events: bool, hardware: HardwareSpec | None = None, kernels: str = "auto"
    ) -> None:
        self.env = env
        self.layer_events = layer_events
        # compiled interruptible pipeline (sim/step/kernels.py) unless "python" or numba is missing; numba is
        # imported at the first interruptible step, so runs without one (dense, sequential) never load it
        self.fast_kernels = kernels != "python" and importlib.util.find_spec("numba") is not None
        self._interruptible_fast = None
        self.link = simpy.Resource(env, capacity=1)  # one H2D DMA queue per GPU (copy engines per direction)
        self.gpu = simpy.Resource(env, capacity=1)  # the compute stream
        self.host_gather = simpy.Resource(env, capacity=1)  # the gather threads, one layer at a time
        self.link_free_s = 0.0  # when the link finishes the H2D work queued so far
        self.d2h = LinkModel(hardware) if hardware is not None else None
        self.d2h_free_s = 0.0  # when the D2H queue finishes the offload writes queued so far
        self.d2h_busy_s = 0.0  # D2H seconds queued over the run

    @property
    def interruptible_fast(self):
        """The compiled :func:`sim.step.kernels.interruptible_arrays`, or None (pure-Python reference)."""
        if self._interruptible_fast is None and self.fast_kernels:
            from sim.step.kernels import interruptible_arrays  # imports numba

            self._interruptible_fast = interruptible_arrays
        return self._interruptible_fast

    def queue_d2h(self, now_s: float, nbytes: float) -> float:
        """Queue ``nbytes`` of offload writes on the D2H link at ``now_s`` (FIFO); return their seconds."""
        if self.d2h is None or nbytes <= 0:
            return 0.0
        seconds = self.d2h.d2h_s(nbytes)
        self.d2h_free_s = max(now_s, self.d2h_free_s) + seconds
        self.d2h_busy_s += seconds
        return seconds

    def h2d_slowdown(self, start_s: float, cost: StepCost) -> float:
        """Queue the step's backups on the D2H link; return the factor (≥ 1) its H2D copies stretch by."""
        self.queue_d2h(start_s, cost.d2h_bytes)
        if self.d2h is None:
            return 1.0
        return self.d2h.d2h_slowdown(self.d2h_free_s - start_s, sum(cost.compute_s))

    def run_forward(self, duration_s: float) -> Generator[simpy.Event, object, None]:
        """A forward that only computes (a prefill), holding the GPU stream when resources are modelled."""
        if self.layer_events:
            with self.gpu.request() as gpu:
                yield gpu
                yield self.env.timeout(duration_s)
        else:
            yield self.env.timeout(duration_s)


def run_step(
    devices: StepDevices, cost: StepCost, overhead_s: float, intervals: list[tuple] | None = None
) -> Generator[simpy.Event, object, StepTiming | None]:
    """Advance the clock through one decode step starting now; use as ``timing = yield from run_step(...)``.

    Args:
        devices: the replica's GPU, link and host gather (``link_free_s`` is read and updated).
        cost: what the step costs (per-layer compute, recall, gather; or an interruptible plan).
        overhead_s: per-step host overhead before layer 0.
        intervals: if a list, receives the step's ``(kind, item, start_s, end_s, preempted)`` intervals
            (closed-form and interruptible timing only).

    Returns:
        The step's :class:`StepTiming`, or None when the step recalled nothing.
    """
    env = devices.env
    start = env.now
    slow = devices.h2d_slowdown(start, cost)
    if cost.recall_s is None and cost.interrupt is None:
        yield env.timeout(overhead_s + sum(cost.compute_s) + cost.head_s)
        return None
    recall_s = cost.recall_s if slow == 1.0 or cost.recall_s is None else [r * slow for r in cost.recall_s]
    if cost.interrupt is not None:
        plan = stretched(cost.interrupt, slow)
        if devices.interruptible_fast is not None and intervals is None:
            timing = devices.interruptible_fast(
                start + overhead_s, cost.compute_s, plan.prefetch, plan.correction, plan.lookahead_items,
                plan.chunk_bytes, devices.link_free_s,
            )  # fmt: skip
        else:  # the pure-Python reference (it also records the timeline's intervals)
            timing = run_interruptible(
                start + overhead_s, cost.compute_s, plan.prefetch.tolist(), plan.correction.tolist(),
                plan.lookahead_items, plan.chunk_bytes, devices.link_free_s, intervals,
            )  # fmt: skip
    elif devices.layer_events:
        yield env.timeout(overhead_s)
        timing = yield env.process(
            run_events(env, devices.link, devices.gpu, cost.compute_s, recall_s, devices.host_gather, cost.gather_s)
        )
        yield env.timeout(cost.head_s)
        return timing
    else:
        timing = run_closed_form(
            start + overhead_s, cost.compute_s, recall_s, devices.link_free_s, cost.gather_s, intervals
        )
    devices.link_free_s = timing.link_free_s
    yield env.timeout(timing.end_s + cost.head_s - start)
    return timing


def stretched(plan: InterruptPlan, slow: float) -> InterruptPlan:
    """The plan with each job's copy share ``slow`` times longer (its service grows by the extra copy time);
    jobs with no service are left as they are."""
    if slow == 1.0:
        return plan

    def stretch(jobs: np.ndarray) -> np.ndarray:
        out = jobs.copy()
        extra = np.where(jobs[:, 1] > 0, jobs[:, 2] * (slow - 1.0), 0.0)
        out[:, 1] += extra
        out[:, 2] += extra
        return out

    return InterruptPlan(stretch(plan.prefetch), stretch(plan.correction), plan.lookahead_items, plan.chunk_bytes)
