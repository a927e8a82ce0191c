"""Where a run of decode steps ends: block growth (:func:`grown_blocks`, the one definition of the blocks the next
steps allocate), the steps that fit without evicting, preempting or admitting (:func:`fitting_steps`), the cap a run
is costed to (:func:`step_cap`) and the last cut of its timed steps (:func:`run_end`). The run builder
(sim/serving/decode.py ``Decode._next_run``) takes these for a skip-ahead run of any policy: the cap, the fitting
steps (before costing a run whose costs read the free pool at each step — one that recalls —, after timing a
recall-free run, whose costs do not: the two orders give the same steps, as each bound only shortens the run), the
timing's own bounds and the last cut; a single step (k = 1) is always taken, its blocks allocated before it (evicting
or preempting while the pool is short).

Between two events of other processes (an arrival, a remote prefill finishing, another replica's step, the
horizon), a batch repeats one decision: decode one token for every running request. A skip-ahead run takes such
steps at once and ends before:

* the next event of another process (``next_event_s``, SimPy's ``env.peek()``), except an arrival that only queues
  a request (``arrivals``, colocated prefill, sim/serving/arrivals.py): with requests queued it changes no decision
  in the run (it joins behind the head, which :meth:`Admission.quiet_decisions` holds back), and with none the run
  ends with the step the arrival falls in; likewise an event that reaches the scheduler only at its next decision
  (``soft_s``: a remote prefill, an arrival with remote prefill, ``Replica.follow``). A run never ends exactly at
  such an event: SimPy's order of the two events would depend on when each was scheduled (the run's one timeout at
  its start, a step's at that step's start); the timing stops at the first two (sim/step/pipeline.py ``time_steps``,
  sim/step/timing.py ``StepDevices.time_run``), :func:`run_end` at an arrival;
* the first step whose new blocks do not fit in the free pool (it would evict prefix-cache nodes or preempt: a
  single step does that);
* the first later decision at which a queued request would join (:meth:`Admission.quiet_decisions`);
* any request's finish after its last step (no request finishes inside a run);
* a step ending exactly at an arrival that may cut the run (``ties``, a replica behind a load-aware router).

Exactness: a run's steps are costed by the policy's one definition (``Policy.recall_free_decode`` or
``Policy.step_costs``) over the step axis and timed by the one timing of any k, and the clock advances step by step
in Python floats, so a run lands on the times stepping gives (tests/sim/test_skip_ahead.py,
tests/sim/test_offload_run.py; docs/design.md §13).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request

if TYPE_CHECKING:
    from sim.policies.base import Policy
    from sim.serving.admission import Admission
    from sim.serving.arrivals import ArrivalSchedule

MAX_RUN_STEPS = 4096  # most decode steps one run computes at once (bounds its [steps, batch] arrays)
MAX_RUN_CELLS = 1 << 18  # most (step, request, layer) cells one run that recalls draws at once (~2 MiB an array)
SHORT_RUN_STEPS = 64  # a recall-free run of up to this many steps is timed before its bound is (cheaper than one)


def grown_blocks(policy: Policy, batch: DecodeBatch, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block growth over the batch's next ``steps`` decode steps (a single step's is ``steps=1``): each request's KV
    tokens and device blocks held after each step (int64 [steps, n] each), and the blocks allocated since now after
    each step (int64 [steps], nondecreasing: blocks held never shrink)."""
    b = batch
    # int64 [k, n] KV tokens after each step's token (a single step's without building the step index)
    ctx = (b.ctx + 1)[None, :] if steps == 1 else b.ctx[None, :] + np.arange(1, steps + 1)[:, None]
    held = policy.device_blocks(ctx, b.offloaded)  # int64 [k, n] blocks held in each step
    return ctx, held, (held - b.blocks).sum(axis=1)


def fitting_steps(
    policy: Policy,
    admission: Admission,
    batch: DecodeBatch,
    kv: KvState,
    waiting: deque[Request],
    disaggregated: bool,
    steps: int,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """How many of the next ``steps`` decode steps fit without evicting, preempting or admitting (``admission``: the
    replica's, sim/serving/policy_admission.py ``admission_of``), with their :func:`grown_blocks` (KV tokens, blocks
    held: int64 [steps, n] each; blocks allocated since now: int64 [steps])."""
    b = batch
    ctx, held, need = grown_blocks(policy, b, steps)
    free = kv.device.free
    # the step that would evict or preempt runs as a single step (Replica._grow_or_preempt)
    k = int(np.searchsorted(need, free, side="right")) if need[-1] > free else steps
    # the scheduler decides again before each later step: the run ends where a queued request would join
    free_blocks = free - need[: max(0, k - 1)]
    k = min(k, 1 + admission.quiet_decisions(waiting, b, kv, free_blocks, disaggregated))
    return k, ctx, held, need


def step_cap(policy: Policy, batch: DecodeBatch, now_s: float, bound_s: float, soft_s: float, recall_free: bool) -> int:
    """The most steps a skip-ahead run from ``now_s`` is costed to: until the first request's last step, at most
    :data:`MAX_RUN_STEPS` (and :data:`MAX_RUN_CELLS` cells of a run that recalls), and no more than can end before
    ``bound_s`` (the next event; + 1 for rounding) or the step ``soft_s`` falls in (+ 2). A step lasts at least its
    host overhead, layer compute at the tokens it attends at least (an offloaded request attends at least its sparse
    budget) and LM head, so the cap never cuts a run the bounds allow: a bound too small would only shorten it. (A
    recall-free run of up to :data:`SHORT_RUN_STEPS` steps is costed whole: its timing stops at the bounds, and a cap
    would cost more than the steps it saves.)"""
    b, compute = batch, policy.compute
    n = len(b)
    steps = min(int((b.output - b.generated).min()), MAX_RUN_STEPS)
    if not recall_free:
        steps = min(steps, max(2, MAX_RUN_CELLS // (n * compute.num_layers)))
    if min(bound_s, soft_s) < math.inf and (steps > SHORT_RUN_STEPS or (steps > 2 and not recall_free)):
        ctx0 = b.ctx + 1
        least = int(
            (ctx0 if recall_free else np.where(b.offloaded, np.minimum(ctx0, policy.sparse_tokens), ctx0)).sum()
        )
        first_s = compute.step_overhead_s + compute.num_layers * compute.decode_layer_s(n, least)
        first_s += compute.decode_head_s(n)
        if bound_s < math.inf:
            steps = min(steps, int((bound_s - now_s) / first_s) + 1)
        if soft_s < math.inf:
            steps = min(steps, int((soft_s - now_s) / first_s) + 2)
    return steps


def run_end(
    times_s: list[float] | np.ndarray,
    steps: int,
    now_s: float,
    arrivals: ArrivalSchedule | None,
    ties: ArrivalSchedule | None,
) -> int:
    """How many of a skip-ahead run's ``steps`` timed steps (boundaries ``times_s``, [steps + 1]) it takes: none of
    them may end exactly at an arrival that may cut the run (``ties``: the steps before it), the run never ends
    exactly at an arrival that only queues (``arrivals``), and one timeout of its whole length from ``now_s`` must land
    exactly on its end (SimPy adds the delay to the clock), as the steps' own timeouts do. Fewer than 2: no run."""
    k = steps
    if ties is not None and k >= 2:  # the step ending at an arrival that may cut the run is taken alone
        k = min(k, ties.first_at(times_s[1 : k + 1]))
    while k >= 2 and arrivals is not None and arrivals.at(float(times_s[k])):  # never end exactly at an arrival
        k -= 1
    if k < 2:
        return 0
    end_s = float(times_s[k])
    return k if now_s + (end_s - now_s) == end_s else 0
