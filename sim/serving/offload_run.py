"""Skip-ahead runs of decode steps that recall: the next steps of a batch holding offloaded requests, timed one after
another in one pass (docs/design.md §13, "Skip-ahead over offloaded steps").

:func:`next_offloaded_run` computes the next k steps' costs at once (``OffloadServing.step_costs``), times them with
the function that times a single step (``StepDevices.time_steps``), carrying the link's state from step to step, and
stops before the first step that would end at or after the next event (or that the timeline records), or where a
recall-free run (sim/serving/decode_run.py) would stop. Nothing changes until the replica applies the run
(``SkipAhead._offloaded_run``): undrawn steps' draws stay in their streams. Needs the compiled kernels (numba) and a
policy that :meth:`~sim.policies.offload.OffloadServing.runs_offloaded` covers (:func:`offload_runs_possible`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.serving.decode_run import MAX_RUN_STEPS, DecodeRun, fitting_steps, grown_blocks, lands_exactly
from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request
from sim.step.cost import StepCosts
from sim.step.draws import RecallDraws
from sim.step.timing import StepDevices, StepsTiming

if TYPE_CHECKING:
    from sim.metrics.recorder import Recorder
    from sim.policies.base import Policy
    from sim.serving.arrivals import ArrivalSchedule

RECALL_COUNTS = ("recall_bytes", "num_fragments", "num_transfers", "selected_fragments")  # StepCosts' [k]
MAX_RUN_CELLS = 1 << 18  # most (step, request, layer) cells one offloaded run draws at once (~2 MiB an array)


def offload_runs_possible(policy: Policy, devices: StepDevices, skip_ahead: bool) -> bool:
    """Whether a replica with this policy and devices can ever take an offloaded run: skip-ahead on, an offload
    policy whose configuration :meth:`~sim.policies.offload.OffloadServing.runs_offloaded` covers, the compiled kernels
    installed (``run.kernels`` not ``python``)."""
    return skip_ahead and hasattr(policy, "recall") and policy.runs_offloaded() and devices.fast_kernels


@dataclass(slots=True)
class OffloadedRun:
    """j ≥ 2 decode steps that recall, timed: the steps (what they leave on the batch, pools, admission and
    recorder, applied by ``Replica._apply_run`` as a single step's are) and what they leave in the recall state and
    the devices (:meth:`commit`, which a single step's ``Policy.step_cost`` and ``run_step`` leave themselves)."""

    run: DecodeRun  # the j steps, with their recall columns and per-layer records
    costs: StepCosts  # arrays over the k ≥ j steps costed (the first j ran)
    timed: StepsTiming  # the steps timed (at least the j; each step's timing does not depend on the later ones)

    def cut(self, steps: int, policy: Policy, batch: DecodeBatch) -> OffloadedRun:
        """The run's first ``steps`` (1 <= steps <= its steps), for ``batch`` (its recall state not changed since):
        what stepping leaves after those steps (a run cut by an arrival, ``SkipAhead._wait_run``)."""
        if steps == self.run.steps:
            return self
        ctx, held, need = grown_blocks(policy, batch, steps)
        return _offloaded(self.costs, self.timed, steps, ctx[-1].copy(), held[-1].copy(), need.tolist())

    def commit(self, batch: DecodeBatch, devices: StepDevices) -> None:
        """What the run's steps leave in the batch's recall state (their draws consumed, as a single step's
        ``step_cost`` commits its own) and the devices' queues (as the timing left them after its last step)."""
        steps = self.run.steps
        self.costs.commit(steps, batch.recall_state, batch.offloaded)
        devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s = self.timed.queues_s[steps - 1].tolist()


def next_offloaded_run(
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
    ties: ArrivalSchedule | None = None,
    soft_s: float = math.inf,
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
            none queued the next one is a soft bound (``soft_s``; with a queue, arrivals join behind its held-back
            head, as in sim/serving/decode_run.py), and the run never ends exactly at one.
        ties: arrivals that may cut the run (as in sim/serving/decode_run.py): no step ends exactly at one.
        soft_s: the next event that reaches the scheduler only at its next decision (as in sim/serving/decode_run.py):
            the run ends with the step it falls in.
    """
    b, pol = batch, policy
    if arrivals is not None and not waiting:
        soft_s = min(soft_s, arrivals.next_s())
    if next_event_s <= now_s:
        return None
    num_layers = pol.num_layers
    cells = len(b) * num_layers
    steps = min(int((b.output - b.generated).min()), MAX_RUN_STEPS, max(2, MAX_RUN_CELLS // cells))
    compute = pol.compute
    overhead_s, head_s = compute.step_overhead_s, compute.decode_head_s(len(b))
    host_s = compute.overlapped_host_s(len(b))  # each step lasts at least this long (pipeline.host_bound_s)
    if min(next_event_s, soft_s) < math.inf:  # a step takes at least its compute; offloaded requests attend at
        ctx0 = b.ctx + 1  # least the budget (+ 1 for rounding; + 1 more: the step a soft event falls in)
        least = int(np.where(b.offloaded, np.minimum(ctx0, pol.sparse_tokens), ctx0).sum())
        first_s = overhead_s + num_layers * compute.decode_layer_s(len(b), least) + head_s
        if next_event_s < math.inf:
            steps = min(steps, int((next_event_s - now_s) / first_s) + 1)
        if soft_s < math.inf:
            steps = min(steps, int((soft_s - now_s) / first_s) + 2)
    if steps < 2:
        return None
    k, ctx, held, need = fitting_steps(pol, b, kv, waiting, disaggregated, steps)
    if k < 2:
        return None
    ctx, held, need = ctx[:k], held[:k], need[:k]
    free_hbm_bytes = (kv.device.free - need) * kv.block_bytes
    costs = pol.step_costs(ctx, b.offloaded, b.cold, draws, b.recall_state, free_hbm_bytes)
    compute_s = costs.compute_s if costs.compute_s is not None else np.tile(costs.group_layer_s, (1, num_layers))
    seen, timeline_step = recorder.recall_steps, recorder.timeline_step
    stop_recall = 1 if seen == 0 else (timeline_step - seen if seen < timeline_step else math.inf)
    timed = devices.time_steps(
        now_s, compute_s, costs.has_recall, overhead_s, head_s, costs.d2h_bytes, costs.jobs, costs.lookahead_items,
        costs.chunk_bytes, costs.sequential, next_event_s, stop_recall, host_s=host_s, soft_s=soft_s,
    )  # fmt: skip
    j, times = timed.steps, timed.times_s  # (a step's timing does not depend on later ones: the first i are a run)
    if ties is not None and j >= 2:  # a step ends exactly at an arrival that may cut the run: end before that step
        j = ties.first_at(times[1 : j + 1])
    while j >= 2 and arrivals is not None and arrivals.at(float(times[j])):  # never end exactly at an arrival
        j -= 1
    if j < 2 or not lands_exactly(now_s, float(times[j])):
        return None
    return _offloaded(costs, timed, j, ctx[j - 1].copy(), held[j - 1].copy(), need[:j].tolist())


def _offloaded(
    costs: StepCosts, timed: StepsTiming, j: int, ctx: np.ndarray, held: np.ndarray, need: list[int]
) -> OffloadedRun:
    """The :class:`OffloadedRun` of the first ``j`` costed steps (``timed``: ``StepsTiming`` of at least j
    steps)."""
    times = timed.times_s
    steps = np.flatnonzero(costs.recall_bytes[:j] > 0)  # the steps that recalled (has_recall of the first j)
    recalled = steps.tolist()
    recall = {name: getattr(costs, name)[:j].tolist() for name in RECALL_COUNTS}
    recall.update(
        stall_s=timed.stall_s[:j].tolist(), link_busy_s=timed.link_busy_s[:j].tolist(),
        gather_busy_s=timed.gather_busy_s[:j].tolist(),
    )  # fmt: skip
    run = DecodeRun(
        times[: j + 1].tolist(), costs.attended_tokens[:j].tolist(), ctx, held, need, recall, recalled,
        *(np.take(x, steps, axis=0) for x in (costs.layer_bytes, costs.layer_fragments, timed.item_stall_s)),
    )  # fmt: skip
    return OffloadedRun(run, costs, timed)


def preload_kernels() -> None:
    """Load the compiled kernels offloaded runs use (numba's import and its cached machine code, ~0.4 s once per
    process) by calling each on a tiny input, so a simulation that will offload pays it before its event loop
    rather than at its first offloaded step (``Fleet.preload_kernels``). Changes no state of any simulation."""
    from sim.step.drift import drift_steps

    one = np.ones((1, 1))
    devices = StepDevices(None)  # no D2H queue, nothing simulated
    devices.time_steps(0.0, one, np.ones(1, dtype=bool), 0.0, 0.0, 0, (np.zeros((1, 1, 4)),) * 2)
    devices.time_steps(0.0, one, np.ones(1, dtype=bool), 0.0, 0.0, 0, sequential=(one, one))
    z = np.zeros((1, 1))
    z.flags.writeable = False  # the streams' views are read-only: load that signature
    drift_steps(np.zeros(1), np.zeros(1), z, np.zeros((1, 1)), np.zeros((1, 1)), 0.5, 0.5, 0.0, False)
