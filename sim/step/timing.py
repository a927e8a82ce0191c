"""One decode step on the simulation clock: from a policy's :class:`~sim.step.cost.StepCost` to elapsed time.

Which pipeline times the step follows from the cost (the policy's choice), not from the scheduler:

* nothing recalled — overhead + Σ layer compute + head, one timeout;
* ``cost.interrupt`` set — the interruptible layer-wise schedule (sim/step/interrupt.py);
* otherwise the sequential pipeline with one-layer look-ahead: the closed-form recurrence
  (sim/step/pipeline.py ``run_closed_form``), or SimPy events on real link/GPU/host resources when
  ``run.layer_model: events`` (``run_events``; tested equal to the recurrence).

The link's state carries over between steps (``link_free_s``: queued H2D work a step leaves behind).
"""

from __future__ import annotations

from collections.abc import Generator

import simpy

from sim.step.cost import StepCost
from sim.step.interrupt import run_interruptible
from sim.step.pipeline import StepTiming, run_closed_form, run_events


class StepDevices:
    """The devices a replica's decode steps share: GPU stream, H2D link, host gather threads.

    Args:
        env: the SimPy environment.
        layer_events: time recalling steps with SimPy events (``run.layer_model: events``) instead of the
            closed-form recurrence.
    """

    def __init__(self, env: simpy.Environment, layer_events: bool) -> None:
        self.env = env
        self.layer_events = layer_events
        self.link = simpy.Resource(env, capacity=1)  # one H2D DMA queue per GPU (copy engines per direction)
        self.gpu = simpy.Resource(env, capacity=1)  # the compute stream
        self.host_gather = simpy.Resource(env, capacity=1)  # the gather threads, one layer at a time
        self.link_free_s = 0.0  # when the link finishes the H2D work queued so far

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
    if cost.recall_s is None and cost.interrupt is None:
        yield env.timeout(overhead_s + sum(cost.compute_s) + cost.head_s)
        return None
    if cost.interrupt is not None:
        plan = cost.interrupt
        timing = run_interruptible(
            start + overhead_s, cost.compute_s, plan.prefetch, plan.correction, plan.lookahead_items,
            plan.chunk_bytes, devices.link_free_s, intervals,
        )  # fmt: skip
    elif devices.layer_events:
        yield env.timeout(overhead_s)
        timing = yield env.process(
            run_events(
                env, devices.link, devices.gpu, cost.compute_s, cost.recall_s, devices.host_gather, cost.gather_s
            )
        )
        yield env.timeout(cost.head_s)
        return timing
    else:
        timing = run_closed_form(
            start + overhead_s, cost.compute_s, cost.recall_s, devices.link_free_s, cost.gather_s, intervals
        )
    devices.link_free_s = timing.link_free_s
    yield env.timeout(timing.end_s + cost.head_s - start)
    return timing
