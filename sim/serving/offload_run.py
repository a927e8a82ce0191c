"""Skip-ahead over offloaded decode steps: runs whose steps recall, timed one after another in one pass.

A batch holding offloaded requests recalls at every step, and each step's recall is random, so no two steps cost
the same; but between two events of other processes its steps still repeat one decision. :func:`plan_offloaded_run`
computes the next k such steps' costs at once (sim/policies/offload_run.py: layer times, recall draws, interruptible
plans as [k, ...] arrays), then times them in order (sim/step/run_kernel.py, compiled) through the same D2H queue,
slowdown and interruptible or sequential layer pipeline that :func:`sim.step.timing.run_step` uses, carrying the
link's state from step to step, and stops before
the first step that would end at or after the next event (or that the timeline records). Nothing is changed until
the replica applies the run (``Replica._offloaded_run``): the draws of steps that did not fit stay in their streams
for the steps that follow. A run also ends where the dense one does (sim/serving/decode_run.py): at a step whose
blocks do not fit, a request's last token, or a decision at which a queued request would join.

Needs the compiled kernels (numba; otherwise every step is stepped) and a policy that
:func:`~sim.policies.offload_run.runs_offloaded` covers (:func:`offload_runs_possible`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.policies.offload_run import OffloadRunCosts, offload_run_costs, runs_offloaded
from sim.serving.decode_run import MAX_RUN_STEPS, fitting_steps, lands_exactly
from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request
from sim.step.draws import RecallDraws
from sim.step.timing import StepDevices

if TYPE_CHECKING:
    from sim.metrics.recorder import Recorder
    from sim.policies.base import Policy
    from sim.serving.admission import Admission
    from sim.serving.arrivals import ArrivalSchedule

MAX_RUN_CELLS = 1 << 18  # most (step, request, layer) cells one offloaded run draws at once (~2 MiB an array)


def offload_runs_possible(policy: Policy, devices: StepDevices, skip_ahead: bool) -> bool:
    """Whether a replica with this policy and devices can ever take an offloaded run: skip-ahead on, an offload
    policy whose configuration :func:`~sim.policies.offload_run.runs_offloaded` covers, the compiled kernels
    installed (``run.kernels`` not ``python``) and the closed-form layer timing (not ``layer_model: events``)."""
    return (
        skip_ahead
        and hasattr(policy, "recall")
        and runs_offloaded(policy)
        and devices.fast_kernels
        and not devices.layer_events
    )


@dataclass(slots=True)
class OffloadedRun:
    """j ≥ 2 offloaded decode steps, timed; applied by the replica."""

    times_s: np.ndarray  # float64 [j + 1] step boundaries
    costs: OffloadRunCosts  # arrays over the planned k ≥ j steps (the first j ran)
    stall_s: np.ndarray  # float64 [j] per step
    link_busy_s: np.ndarray  # float64 [j]
    gather_busy_s: np.ndarray  # float64 [j]
    layer_stall_s: np.ndarray  # float64 [j, L] (zeros for a step that recalled nothing)
    link_free_s: float  # the link's queue end after the run
    d2h_free_s: float  # the D2H queue's end after the run
    d2h_busy_s: float  # D2H seconds queued since the replica started, after the run
    ctx: np.ndarray  # int64 [n] after the run
    blocks: np.ndarray  # int64 [n] after the run
    allocated_blocks: np.ndarray  # int64 [j] since the run began, after each step

    @property
    def steps(self) -> int:
        return len(self.times_s) - 1

    def commit(
        self, batch: DecodeBatch, devices: StepDevices, admission: Admission, recorder: Recorder, state_width: int
    ) -> dict[str, np.ndarray]:
        """What the run's steps leave in the recall state, the devices, the admission and the recorder's totals and
        per-layer records, as stepping leaves them; returns the step table's recall columns (int64 / float64 [j])
        for ``Recorder.record_decode_run``. The batch's tokens, blocks and step rows are the replica's part."""
        k, times_s, costs, rec = self.steps, self.times_s, self.costs, recorder
        state = batch.recall_state[batch.offloaded] if state_width else None
        costs.recall.commit(k, state)
        if state is not None:
            batch.recall_state[batch.offloaded] = state
        devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s = self.link_free_s, self.d2h_free_s, self.d2h_busy_s
        busy, gather = self.link_busy_s.tolist(), self.gather_busy_s.tolist()
        steps_s = (times_s[1:] - times_s[:-1]).tolist()
        admission.on_decode_run(steps_s, costs.attended_tokens[:k].tolist(), self.stall_s.tolist(), busy)
        for link_s, gather_s in zip(busy, gather, strict=True):  # the totals add step by step, as stepping does
            rec.link_busy_s += link_s
            rec.gather_busy_s += gather_s
        recalled = np.flatnonzero(costs.has_recall[:k])
        rec.recall_steps += len(recalled)
        rec.add_layers_run(
            times_s[recalled], times_s[recalled + 1], costs.layer_bytes[recalled], costs.layer_fragments[recalled],
            self.layer_stall_s[recalled],
        )  # fmt: skip
        return {
            "recall_bytes": costs.recall_bytes[:k], "num_fragments": costs.num_fragments[:k],
            "num_transfers": costs.num_transfers[:k], "selected_fragments": costs.selected_fragments[:k],
            "stall_s": self.stall_s, "link_busy_s": self.link_busy_s, "gather_busy_s": self.gather_busy_s,
        }  # fmt: skip


def plan_offloaded_run(
    policy: Policy,
    batch: DecodeBatch,
    kv: KvState,
    waiting: deque[Request],
    disaggregated: bool,
    devices: StepDevices,
    draws: RecallDraws,
    recorder: Recorder,
    now_s: float,
    next_event_s: float,
    arrivals: ArrivalSchedule | None = None,
) -> OffloadedRun | None:
    """The next run of offloaded decode steps from ``now_s`` (module docstring), or None when fewer than two fit.
    The caller has checked :func:`offload_runs_possible` for its configuration and that the batch holds an offloaded
    request.

    Args:
        policy: the replica's policy; batch, kv, waiting: the replica's state (not modified).
        disaggregated: requests bring their KV from remote prefill (the admission's rule for queued requests).
        devices: the replica's link and D2H state (read, not modified).
        draws: the replica's streams (peeked, not consumed).
        recorder: read for the recalling steps so far (the timeline's step is stepped, to record its intervals).
        now_s: the clock; next_event_s: the next event of any other process (``math.inf`` if none).
        arrivals: the arrivals that only queue a request (None if arrivals are among ``next_event_s``'s events): with
            none queued the next one bounds the run (with a queue, arrivals join behind its held-back head, as in
            sim/serving/decode_run.py), and the run never ends exactly at one.
    """
    b, pol = batch, policy
    if arrivals is not None and not waiting:
        next_event_s = min(next_event_s, arrivals.next_s())
    if next_event_s <= now_s:
        return None
    num_layers = pol.num_layers
    cells = len(b) * num_layers
    steps = min(int((b.output - b.generated).min()), MAX_RUN_STEPS, max(2, MAX_RUN_CELLS // cells))
    compute = pol.compute
    overhead_s, head_s = compute.step_overhead_s, compute.decode_head_s(len(b))
    if next_event_s < math.inf:  # a step takes at least its compute; offloaded requests attend at least the budget
        ctx0 = b.ctx + 1
        least = int(np.where(b.offloaded, np.minimum(ctx0, pol.sparse_tokens), ctx0).sum())
        first_s = overhead_s + num_layers * compute.decode_layer_s(len(b), least) + head_s
        steps = min(steps, int((next_event_s - now_s) / first_s) + 1)
    if steps < 2:
        return None
    k, ctx, held, need = fitting_steps(pol, b, kv, waiting, disaggregated, steps)
    if k < 2:
        return None
    ctx, held, need = ctx[:k], held[:k], need[:k]
    free_hbm_bytes = (kv.device.free - need) * kv.block_bytes
    costs = offload_run_costs(pol, ctx, b.offloaded, b.cold, draws, b.recall_state, free_hbm_bytes)
    from sim.step.run_kernel import time_run  # imports numba (loaded already by interruptible_fast)

    d2h = devices.d2h
    queues = d2h is not None and costs.d2h_bytes > 0
    d2h_s = d2h.d2h_s(costs.d2h_bytes) if queues else -1.0
    coupling = d2h.d2h_coupling if d2h is not None else 0.0
    seen, timeline_step = recorder.recall_steps, recorder.timeline_step
    stop_recall = 1 if seen == 0 else (timeline_step - seen if seen < timeline_step else math.inf)
    bound_s = next_event_s
    while True:
        j, times, stall, busy, gather, layer_stall, *state = time_run(
            now_s, costs.layer_s, num_layers, costs.has_recall, costs.plan, costs.lookahead_items, costs.chunk_bytes,
            overhead_s, head_s, (d2h_s, coupling, d2h is not None),
            (devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s), bound_s, stop_recall, costs.sequential,
        )  # fmt: skip
        if j < 2 or arrivals is None or not arrivals.at(float(times[j])):
            break
        bound_s = float(times[j])  # never end exactly at an arrival: time the run again, ending a step earlier
    if j < 2 or not lands_exactly(now_s, float(times[j])):
        return None
    return OffloadedRun(
        times[: j + 1], costs, stall[:j], busy[:j], gather[:j], layer_stall[:j], *state,
        ctx[j - 1].copy(), held[j - 1].copy(), need[:j],
    )  # fmt: skip


def preload_kernels() -> None:
    """Load the compiled kernels offloaded runs use (numba's import and its cached machine code, ~0.4 s once per
    process) by calling each on a tiny input, so a simulation that will offload pays it before its event loop
    rather than at its first offloaded step (``Fleet.preload_kernels``). Changes no state of any simulation."""
    from sim.step.kernels import interruptible_arrays
    from sim.step.recall_run import _drift
    from sim.step.run_kernel import time_run

    jobs = np.zeros((1, 4))
    interruptible_arrays(0.0, np.ones(1), jobs, jobs, 1, 1.0, 0.0)
    z = np.zeros((1, 1))
    z.flags.writeable = False  # the streams' views are read-only: load that signature
    _drift(np.zeros(1), np.zeros(1), z, np.zeros((1, 1)), np.zeros((1, 1)), 0.5, 0.5, 0.0, False)
    plans = np.zeros((1, 1, 4))
    time_run(0.0, np.ones(1), 1, np.ones(1, dtype=bool), (plans, plans), 1, 1.0, 0.0, 0.0, (-1.0, 0.0, False),
             (0.0, 0.0, 0.0), 1.0)  # fmt: skip
    time_run(0.0, np.ones(1), 1, np.ones(1, dtype=bool), None, 1, 1.0, 0.0, 0.0, (-1.0, 0.0, False),
             (0.0, 0.0, 0.0), 1.0, sequential=(np.zeros((1, 1)), np.zeros((1, 1))))  # fmt: skip
