"""Per-step views of the simulator's one run record, for tests and the per-step oracles.

sim/ keeps one record of decode steps, ``DecodeRun`` (sim/step/cost.py): the policy's costs, the block growth and the
timing of k ≥ 1 steps over a step axis. The oracles (tests/sim/oracles/) were written for one step at a time and
speak in per-step records; this module holds those records and the adapters that produce them from the one
definition in sim/, so a test compares the two bit for bit:

* :func:`step_cost` — the policy's ``step_costs`` of one step, its draws committed, as a :class:`StepCost`;
* :func:`run_step` — one step's :class:`StepCost` timed by ``StepDevices.time_run`` on SimPy's clock (the devices'
  queues updated), returning its :class:`StepTiming` (None when it recalled nothing);
* :func:`time_steps` — k steps' raw costs timed by ``StepDevices.time_run``, as a :class:`StepsTiming`.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import simpy

from sim.step.cost import DecodeRun
from sim.step.draws import as_draws
from sim.step.pipeline import idle_step_s
from sim.step.timing import StepDevices


@dataclass(slots=True)
class InterruptJobs:
    """Recall jobs of an interruptibly scheduled step, per GPU work item (sim/step/pipeline.py)."""

    prefetch: np.ndarray  # float64 [items, 4]: bytes, link-held seconds, copy seconds, gather seconds per item
    correction: np.ndarray  # float64 [items, 4], the urgent part
    lookahead_items: int
    chunk_bytes: int


@dataclass(slots=True)
class StepCost:
    """What one decode step costs, before the layer pipeline turns it into time."""

    compute_s: list[float]  # per item, GPU time
    recall_s: list[float] | None  # per layer, H2D link time (copy or GPU gather kernel); None: no recall
    gather_s: list[float] | None  # per layer, host gather time (gather-scatter), or None
    head_s: float  # LM head + sampling after the last layer
    recall_bytes: int  # H2D bytes of the whole step
    num_fragments: int  # recalled fragments of the whole step
    num_transfers: int  # H2D copies of the whole step
    attended_tokens: int  # KV tokens read per layer, summed over the batch
    layer_bytes: np.ndarray | None = None  # int64 [num_layers] recall bytes per layer
    layer_fragments: np.ndarray | None = None  # int64 [num_layers]
    interrupt: InterruptJobs | None = None  # set when the step is scheduled interruptibly
    selected_fragments: int = 0  # fragments the recall selected
    d2h_bytes: int = 0  # offload writes queued on the D2H link at step start


@dataclass(slots=True)
class StepTiming:
    """What the layer pipeline of one step that recalls reports (seconds)."""

    stall_s: float
    link_busy_s: float
    gather_busy_s: float
    layer_stall_s: np.ndarray  # float64 [items] the stall before each work item (layer·groups + group)


@dataclass(slots=True)
class StepsTiming:
    """k decode steps timed in order: the first ``steps`` ran; rows past them are scratch."""

    steps: int
    times_s: np.ndarray  # [steps + 1] step boundaries
    step_s: np.ndarray  # [k] each step's clock advance
    stall_s: np.ndarray
    link_busy_s: np.ndarray
    gather_busy_s: np.ndarray
    item_stall_s: np.ndarray  # [k, items]
    link_free_s: float  # the H2D queue's end after the steps
    d2h_free_s: float
    d2h_busy_s: float
    intervals: list[tuple]
    queues_s: np.ndarray  # [k, 3]


def at(run: DecodeRun, t: int) -> StepCost:
    """Step ``t`` of a run's costs as one step's :class:`StepCost` (recall_s / gather_s / interrupt only for a step
    that recalls through the pipeline)."""
    L = run.num_layers
    compute = run.compute_s[t].tolist() if run.compute_s is not None else run.group_layer_s[t].tolist() * L
    if run.recall_bytes is None:
        return StepCost(compute, None, None, run.head_s, 0, 0, 0, int(run.attended_tokens[t]))
    cost = StepCost(
        compute, None, None, run.head_s, 0, 0, 0, int(run.attended_tokens[t]),
        selected_fragments=int(run.selected_fragments[t]), d2h_bytes=run.d2h_bytes,
    )  # fmt: skip
    if not run.recall_bytes[t]:
        return cost
    cost.recall_bytes, cost.num_fragments = int(run.recall_bytes[t]), int(run.num_fragments[t])
    cost.num_transfers = int(run.num_transfers[t])
    cost.layer_bytes, cost.layer_fragments = run.layer_bytes[t], run.layer_fragments[t]
    if run.jobs is not None:
        cost.interrupt = InterruptJobs(run.jobs[0][t], run.jobs[1][t], run.lookahead_items, run.chunk_bytes)
    elif run.sequential is not None:
        cost.recall_s = run.sequential[0][t].tolist()
        cost.gather_s = run.sequential[1][t].tolist() if run.sequential[1][t].any() else None
    return cost


def step_cost(pol, ctx, offloaded, cold, rng, recall_state=None, free_hbm_bytes=0) -> StepCost:
    """One decode step's cost by the policy's one definition (``step_costs`` of k = 1), its draws consumed and the
    offloaded requests' recall state rows written (``ctx`` int64 [n]; ``rng`` a generator or the replica's streams)."""
    if pol.is_recall_free(offloaded):  # (a dense step, or an offload policy's with nothing offloaded)
        attended, layer_s = pol.recall_free_decode(ctx, offloaded, 1)
        L, head_s = pol.compute.num_layers, pol.compute.decode_head_s(len(ctx))
        return StepCost([float(layer_s[0])] * L, None, None, head_s, 0, 0, 0, int(attended[0]))
    draws = as_draws(rng)
    run = pol.step_costs(ctx[None, :], offloaded, cold, draws, recall_state, np.array([free_hbm_bytes]))
    run.steps = 1
    run.commit(recall_state, offloaded, StepDevices(None))
    return at(run, 0)


def commit_recall(rec, steps: int, state) -> None:
    """Commit the first ``steps`` steps of a ``RecallModel.run`` (its RecallRun) as a decode run does
    (``DecodeRun.commit``): its draws consumed, ``state`` (float [n, width] of the run's requests, or None) advanced in
    place."""
    run = DecodeRun(np.zeros((1, 1)), None, 0.0, 0, 1, np.zeros(1, np.int64), recall=rec, steps=steps)
    n = state.shape[0] if state is not None else 0
    run.commit(state, np.ones(n, dtype=bool), StepDevices(None))


def recall_step(model, ctx, cold, rng, groups=None, num_groups=1, state=None, cache_fragments=None):
    """``RecallModel.run`` of one step, committed (draws consumed, ``state`` advanced in place): its RecallRun."""
    cache = None if cache_fragments is None else np.array([cache_fragments], dtype=float)
    rec = model.run(ctx[None, :], cold, as_draws(rng), groups, num_groups, state, cache)
    commit_recall(rec, 1, state)
    return rec


def _run_of(
    compute_s: np.ndarray, has_recall: np.ndarray, head_s: float, d2h_bytes: float, jobs, lookahead_items: int,
    chunk_bytes: float, sequential,
) -> DecodeRun:  # fmt: skip
    compute = np.asarray(compute_s, dtype=np.float64)
    recalls = np.asarray(has_recall, dtype=np.int64)
    return DecodeRun(
        compute[:, :1], compute, head_s, d2h_bytes, compute.shape[1], np.zeros(len(compute), np.int64),
        recall_bytes=recalls, lookahead_items=lookahead_items, chunk_bytes=chunk_bytes, jobs=jobs,
        sequential=sequential,
    )  # fmt: skip


def time_steps(  # noqa: PLR0913
    devices: StepDevices,
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
    """k decode steps of raw costs (float64 [k, items] compute, bool [k] has_recall, the pipeline's jobs or times)
    timed by ``StepDevices.time_run`` from the devices' queues, which are not changed.

    Raises:
        ValueError: both ``jobs`` and ``sequential`` given.
    """
    if jobs is not None and sequential is not None:
        raise ValueError("time_steps takes interruptible jobs or the sequential pipeline's times, not both")
    run = _run_of(compute_s, has_recall, head_s, d2h_bytes, jobs, lookahead_items, chunk_bytes, sequential)
    devices.time_run(run, now_s, overhead_s, host_s, next_event_s, soft_s, stop_recall, record)
    j = run.steps
    queues = run.queues_s
    after = queues[j - 1].tolist() if j else [devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s]
    return StepsTiming(
        j, np.asarray(run.times_s), run.step_s, run.stall_s, run.link_busy_s, run.gather_busy_s, run.item_stall_s,
        *after, run.intervals or [], queues,
    )  # fmt: skip


def run_step(
    devices: StepDevices, cost: StepCost, overhead_s: float, intervals: list[tuple] | None = None, host_s: float = 0.0
) -> Generator[simpy.Event, object, StepTiming | None]:
    """Advance the clock through one decode step of ``cost`` starting now (``timing = yield from run_step(...)``):
    the devices' queues are read and updated; a step that recalls nothing takes its idle time and queues its D2H
    writes. Returns the step's :class:`StepTiming`, or None when it recalled nothing."""
    env = devices.env
    start = env.now
    if cost.recall_s is None and cost.interrupt is None:
        devices.queue_d2h(start, cost.d2h_bytes)
        yield env.timeout(idle_step_s(overhead_s, cost.compute_s, cost.head_s, host_s))
        return None
    jobs = sequential = None
    lookahead_items, chunk_bytes = 1, 1.0
    if cost.interrupt is not None:
        p = cost.interrupt
        jobs, lookahead_items, chunk_bytes = (p.prefetch[None], p.correction[None]), p.lookahead_items, p.chunk_bytes
    else:
        gather_s = cost.gather_s if cost.gather_s is not None else np.zeros(len(cost.recall_s))
        sequential = (np.array(cost.recall_s, dtype=np.float64)[None], np.array(gather_s, dtype=np.float64)[None])
    run = _run_of(
        np.array(cost.compute_s, dtype=np.float64)[None], np.ones(1, bool), cost.head_s, cost.d2h_bytes, jobs,
        lookahead_items, chunk_bytes, sequential,
    )  # fmt: skip
    devices.time_run(run, start, overhead_s, host_s, record=intervals is not None)
    run.commit(None, np.zeros(0, bool), devices)
    if intervals is not None and run.intervals:
        intervals.extend(run.intervals)
    yield env.timeout(float(run.step_s[0]))
    return StepTiming(
        float(run.stall_s[0]), float(run.link_busy_s[0]), float(run.gather_busy_s[0]), run.item_stall_s[0]
    )


def recorded_run(k: int, stall_s=None, attended=None, layer_bytes=None) -> DecodeRun:
    """k taken decode steps as ``Recorder.record_decode_run`` reads them: recall columns zero but ``stall_s`` (float
    [k], default zeros) and, with ``layer_bytes`` (int64 [k, L]), steps that recalled those bytes through the
    sequential pipeline; ``attended`` int64 [k] (default zeros)."""
    zeros = np.zeros(k, np.int64)
    num_layers = 1 if layer_bytes is None else np.asarray(layer_bytes).shape[1]
    run = DecodeRun(
        np.zeros((k, 1)), None, 0.0, 0, num_layers, zeros if attended is None else np.asarray(attended, np.int64),
        recall_bytes=zeros, num_fragments=zeros, num_transfers=zeros, selected_fragments=zeros, steps=k,
    )  # fmt: skip
    run.stall_s = np.zeros(k) if stall_s is None else np.asarray(stall_s, dtype=np.float64)
    run.link_busy_s, run.gather_busy_s = np.zeros(k), np.zeros(k)
    if layer_bytes is not None:
        run.layer_bytes = np.asarray(layer_bytes, dtype=np.int64)
        run.layer_fragments = np.zeros_like(run.layer_bytes)
        run.recall_bytes = run.layer_bytes.sum(axis=1)
        run.item_stall_s = np.zeros(run.layer_bytes.shape)
        run.sequential = (np.zeros(run.layer_bytes.shape), np.zeros(run.layer_bytes.shape))
    return run
