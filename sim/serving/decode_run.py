"""Runs of decode steps: k ≥ 1 consecutive decode steps of one batch over a step axis (:class:`DecodeRun`; a single
step is a run of one), their block growth (:func:`grown_blocks`), and the skip-ahead run of steps that recall nothing.

A run's outcome — step boundaries, tokens attended, KV tokens and blocks held, recall columns and per-layer records —
is what ``Replica._apply_run`` applies (sim/serving/replica.py), for a single step (``Replica._decode_step``) and a
skip-ahead run (k ≥ 2, sim/serving/skip_ahead.py) alike. Block growth is the one definition of the blocks the next
steps allocate: a single step allocates its step's (evicting or preempting while the pool is short), a skip-ahead
run ends before the first step whose blocks do not fit (:func:`fitting_steps`).

Between two events of other processes (an arrival, a remote prefill finishing, another replica's step, the
horizon), a batch whose steps recall nothing repeats one decision: decode one token for every running request.
:func:`next_decode_run` computes such a skip-ahead run at once and the replica (sim/serving/skip_ahead.py
``SkipAhead._decode_run``) applies it with one timeout. A skip-ahead run ends before:

* the next event of another process (``next_event_s``, SimPy's ``env.peek()``), except an arrival that only queues
  a request (``arrivals``, colocated prefill, sim/serving/arrivals.py): with requests queued it changes no decision
  in the run (it joins behind the head, which :meth:`Admission.quiet_decisions` holds back), and with none the run
  ends with the step the arrival falls in; likewise an event that reaches the scheduler only at its next decision
  (``soft_s``: a remote prefill, an arrival with remote prefill, ``Replica.follow``). A run never ends exactly at
  such an event: SimPy's order of the two events would depend on when each was scheduled (the run's one timeout at
  its start, a step's at that step's start);
* the first step whose new blocks do not fit in the free pool (it would evict prefix-cache nodes or preempt: a
  single step does that);
* the first later decision at which a queued request would join (:meth:`Admission.quiet_decisions`);
* any request's finish after its last step (no request finishes inside a run).

The policy must say its steps recall nothing and draw nothing (:meth:`Policy.is_recall_free`); skip-ahead runs of
steps that recall come from sim/serving/offload_run.py, which shares :func:`fitting_steps` and
:func:`lands_exactly`. Exactness: layer times come from ``ComputeModel.decode_layer_s`` over the step axis (the
formula a single step uses), each step's length is :func:`sim.step.pipeline.idle_step_s` (the one a single step
takes), and the
clock advances step by step in Python floats, so a run lands on the times stepping gives
(tests/sim/test_skip_ahead.py; docs/design.md §13).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.serving.kv import KvState
from sim.serving.policy_admission import admission_of
from sim.serving.request import DecodeBatch, Request
from sim.step.pipeline import idle_step_s

if TYPE_CHECKING:
    from sim.policies.base import Policy
    from sim.serving.arrivals import ArrivalSchedule

MAX_RUN_STEPS = 4096  # most decode steps one run computes at once (bounds its [steps, batch] arrays)
SHORT_RUN_STEPS = 64  # up to this many steps are computed before the next event bounds them (cheaper than a bound)


@dataclass(slots=True)
class DecodeRun:
    """k ≥ 1 decode steps, timed: what they leave behind on the batch, the pools, the admission and the recorder
    (``Replica._apply_run``). A skip-ahead run has k ≥ 2; a single step is a run of one (``Replica._decode_step``)."""

    # The step axis, as lists (a run of one is cheap to build and apply): the step boundaries in seconds (step i runs
    # from times_s[i] to times_s[i + 1]; [k + 1]), the KV tokens read per layer in each step summed over the batch,
    # and the blocks allocated since the run began, after each step ([k] each).
    times_s: list[float]
    attended_tokens: list[int]
    ctx: np.ndarray  # int64 [n] each request's cached tokens after the run
    blocks: np.ndarray  # int64 [n] device blocks each request holds after the run
    allocated_blocks: list[int]
    # The step table's recall columns (RECALL_COLUMNS of sim/metrics/recorder.py; [k] ints or floats each), or
    # None: the steps recalled nothing (all zero).
    recall: dict[str, list] | None = None
    recalled: list[int] | None = None  # [m] the steps that recalled (per-layer records), None: none did
    layer_bytes: np.ndarray | None = None  # int64 [m, num_layers] recall bytes of each recalling step's layers
    layer_fragments: np.ndarray | None = None  # int64 [m, num_layers]
    layer_stall_s: np.ndarray | None = None  # float64 [m, num_layers]

    @property
    def steps(self) -> int:
        return len(self.attended_tokens)


def next_decode_run(
    policy: Policy,
    batch: DecodeBatch,
    kv: KvState,
    waiting: deque[Request],
    disaggregated: bool,
    now_s: float,
    next_event_s: float,
    arrivals: ArrivalSchedule | None = None,
    ties: ArrivalSchedule | None = None,
    soft_s: float = math.inf,
) -> DecodeRun | None:
    """The longest skip-ahead run of decode steps from ``now_s`` (module docstring), or None when fewer than two steps
    qualify.

    Args:
        policy: the replica's policy (recall-free steps, layer times, blocks held, admission).
        batch: the running batch (not modified).
        kv: the replica's KV pools (not modified).
        waiting: the queue (not modified); its head may join at a later decision.
        disaggregated: requests bring their KV from remote prefill (the admission's rule for queued requests).
        now_s: the clock; next_event_s: the next event of any other process (``math.inf`` if none);
        arrivals: the arrivals that only queue a request (None if arrivals are among ``next_event_s``'s events).
        ties: arrivals that may cut the run (a replica behind a load-aware router, sim/serving/cluster.py): no step of
            the run ends exactly at one of them, so a cut (:func:`cut_run`) never has to order a step's end and an
            arrival at the same instant.
        soft_s: the next event that reaches the scheduler only at its next decision (``Replica.follow``): the run
            ends with the step it falls in, as with an arrival of ``arrivals``.
    """
    b = batch
    if not policy.is_recall_free(b.offloaded):
        return None
    steps = min(int((b.output - b.generated).min()), MAX_RUN_STEPS)
    if steps < 2 or next_event_s <= now_s:
        return None
    compute = policy.compute
    overhead_s, head_s, num_layers = compute.step_overhead_s, compute.decode_head_s(len(b)), compute.num_layers
    host_s = compute.overlapped_host_s(len(b))  # each step lasts at least this long (pipeline.host_bound_s)
    # Steps only get longer (more tokens attended), so at most (next event − now) / (first step's length) fit
    # before the event (+ 1 for rounding; a bound that is too small only shortens the run, never changes it).
    # with a queue, arrivals join behind its held-back head
    arrival_s = arrivals.next_s() if arrivals is not None and not waiting else math.inf
    soft_s = min(soft_s, arrival_s)  # the run ends with the step it falls in
    bound_s = min(next_event_s, soft_s)
    if steps > SHORT_RUN_STEPS and bound_s < math.inf:  # bound a long run before computing its steps
        first_s = overhead_s + num_layers * compute.decode_layer_s(len(b), int(b.ctx.sum()) + len(b)) + head_s
        steps = min(steps, int((bound_s - now_s) / first_s) + 2)
    attended, layer_s = policy.recall_free_decode(b.ctx + 1, b.offloaded, steps)
    first_s = overhead_s + num_layers * float(layer_s[0]) + head_s
    if next_event_s < math.inf:
        steps = min(steps, int((next_event_s - now_s) / first_s) + 1)
    if soft_s < math.inf:  # (+ 1 more: the step the soft event falls in)
        steps = min(steps, int((soft_s - now_s) / first_s) + 2)
    times = [now_s]
    for x in layer_s[:steps].tolist():  # the clock as run_step advances it: start + (overhead + Σ layers + head)
        end_s = times[-1] + idle_step_s(overhead_s, [x] * num_layers, head_s, host_s)
        if end_s >= next_event_s or end_s == soft_s:
            break
        times.append(end_s)
        if end_s > soft_s:  # the step the soft event fell in: the scheduler sees it at the decision after that step
            break
    k = len(times) - 1
    if k < 2:
        return None
    if ties is not None:  # the step ending at an arrival that may cut the run is taken alone
        k = min(k, ties.first_at(times[1 : k + 1]))
        if k < 2:
            return None
    k, ctx, held, need = fitting_steps(policy, b, kv, waiting, disaggregated, k)
    while k >= 2 and arrivals is not None and arrivals.at(times[k]):  # never end exactly at an arrival
        k -= 1
    if k < 2 or not lands_exactly(now_s, times[k]):
        return None
    return DecodeRun(times[: k + 1], attended[:k].tolist(), ctx[k - 1].copy(), held[k - 1].copy(), need[:k].tolist())


def cut_run(run: DecodeRun, steps: int, policy: Policy, batch: DecodeBatch) -> DecodeRun:
    """The first ``steps`` (1 <= steps <= ``run.steps``) of a recall-free skip-ahead run computed for ``batch`` (not
    changed since): what stepping leaves after those steps (a run cut by an arrival, ``SkipAhead._wait_run``)."""
    if steps == run.steps:
        return run
    ctx, held, need = grown_blocks(policy, batch, steps)
    return DecodeRun(
        run.times_s[: steps + 1], run.attended_tokens[:steps], ctx[-1].copy(), held[-1].copy(), need.tolist()
    )


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
    policy: Policy, batch: DecodeBatch, kv: KvState, waiting: deque[Request], disaggregated: bool, steps: int
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """How many of the next ``steps`` decode steps fit without evicting, preempting or admitting, with their
    :func:`grown_blocks` (KV tokens, blocks held: int64 [steps, n] each; blocks allocated since now: int64 [steps])."""
    b = batch
    ctx, held, need = grown_blocks(policy, b, steps)
    free = kv.device.free
    # the step that would evict or preempt runs as a single step (Replica._grow_or_preempt)
    k = int(np.searchsorted(need, free, side="right")) if need[-1] > free else steps
    # the scheduler decides again before each later step: the run ends where a queued request would join
    free_blocks = free - need[: max(0, k - 1)]
    k = min(k, 1 + admission_of(policy).quiet_decisions(waiting, b, kv, free_blocks, disaggregated))
    return k, ctx, held, need


def lands_exactly(now_s: float, end_s: float) -> bool:
    """Whether one timeout of ``end_s − now_s`` from ``now_s`` lands exactly on ``end_s`` (SimPy adds the delay to
    the clock), as the steps' own timeouts did."""
    return now_s + (end_s - now_s) == end_s
