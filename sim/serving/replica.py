"""SGLang-like continuous batching on one GPU replica, as a SimPy process.

One iteration of :meth:`Replica.run`:

1. **Prefill first.** If a chunked request is in flight or the head of the waiting queue can be admitted,
   run one prefill forward of at most ``chunked_prefill_tokens`` new tokens (FCFS, stopping at the first
   request that does not fit, like SGLang's ``PrefillAdder``). Who may join is the policy's admission
   object's decision (sim/serving/admission.py: device blocks plus a future-token reservation; host DRAM
   for offloaded requests; IO-adaptive admission also bounds predicted recall).
2. **Else decode** the running batch (sim/serving/decode.py, the :class:`~sim.serving.decode.Decode` mixin): a
   skip-ahead run of steps when one qualifies, else one step, one token per request: allocate the new tokens'
   blocks (preempting requests with the fewest generated tokens while the pool is short, SGLang
   ``retract_decode``, :meth:`Replica._preempt`), build the step with the run builder (its cost from the policy,
   its time from sim/step/timing.py), then apply what it leaves behind: advance every request, record the step and
   finish those that are done.
3. **Else sleep** until the next arrival.

With ``serving.prefill: disaggregated`` step 1 changes: arrivals queue for a pool of remote prefill GPUs
(``num_prefill_gpus``, FIFO); a request that finished prefill (its first token sampled there) waits for
the decode GPU, and admission moves it straight into the decode batch with no forward on this GPU. A
preempted request goes back through remote prefill. ``serving.prefill: none`` is the same path with
prefill costing no time (requests arrive with their KV cached; used to validate against the engine).

Prefill (both modes) is the :class:`~sim.serving.prefill.Prefill` mixin (sim/serving/prefill.py). Recording
(sim/metrics/recorder.py) and invariant checks (``run.debug_checks``) happen after each forward or run;
the replica itself only schedules. Token bookkeeping is in sim/serving/request.py.

Hot path: the decode batch is a struct of numpy arrays; per-step work is a handful of vectorised ops
plus an O(num_layers) pipeline recurrence. Skip-ahead (``run.skip_ahead``, sim/serving/decode.py) takes a
skip-ahead run of decode steps in which nothing but the step index changes at once: no event of another process,
no admission, finish or preemption before its last step (docs/design.md §13; tested equal to stepping).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.config import Scenario
from sim.metrics.recorder import Recorder
from sim.serving.admission import OK
from sim.serving.arrivals import ArrivalSchedule
from sim.serving.decode import Decode, offload_runs_possible
from sim.serving.kv import KvState, device_pool_blocks
from sim.serving.policy_admission import admission_of
from sim.serving.prefill import Prefill
from sim.serving.prefix import PrefixCache
from sim.serving.request import DecodeBatch, Request
from sim.step.draws import RecallDraws
from sim.step.timing import StepDevices

if TYPE_CHECKING:
    from sim.policies.base import Policy


class Replica(Prefill, Decode):
    """One GPU replica serving requests with one policy.

    Args:
        env: the SimPy environment.
        scenario: the validated scenario.
        policy: the policy instance (``sim.policies.make_policy(scenario, name)``), with its admission.
        rng: seeded generator for the policy's random draws.
        recorder: where step and request records go.
        on_finish: called with each finished or rejected request (progress bars).

    Raises:
        CapacityError: if the model does not fit in HBM at all.
    """

    def __init__(
        self,
        env: simpy.Environment,
        scenario: Scenario,
        policy: Policy,
        rng: np.random.Generator,
        recorder: Recorder,
        on_finish: Callable[[Request], None] | None = None,
    ) -> None:
        self.env, self.scenario, self.policy, self.rec = env, scenario, policy, recorder
        self.draws = RecallDraws(rng)  # the recall model's streams, spawned from the replica's generator
        self.admission = admission_of(policy)
        self.on_finish = on_finish or (lambda r: None)
        # one GPU of the replica (sim/step/gpu.py): its shard of the model, its card, its transfers; the replica reads
        # the model and the card only through it
        self.gpu = gpu = policy.gpu
        model, hw, block_size = gpu.model, gpu.hardware, policy.params.block_size
        self.disaggregated = scenario.serving.prefill in ("disaggregated", "none")
        # SGLang's decode side of a PD deployment runs no radix cache by default (decode.py: ChunkCache unless
        # --disaggregation-decode-enable-radix-cache): the prefix cache serves colocated prefill only.
        on = policy.params.prefix_cache and not self.disaggregated
        prefix = PrefixCache(block_size, policy.params.hicache) if on else None
        self.swap = self.disaggregated and policy.params.retract == "swap"
        self.swap_end_s = 0.0  # when the KV copies of retracted and resumed requests end (the next decode step waits)
        block_bytes = block_size * model.kv_bytes_per_token
        self.kv = KvState(
            device_pool_blocks(model, hw, block_size) - -(-policy.reserved_hbm_bytes // block_bytes),
            hw.host_dram_bytes,
            block_bytes,
            model.weight_bytes + hw.reserve_bytes + policy.reserved_hbm_bytes,
            prefix,
        )
        self.kv.clock = lambda: env.now
        self.devices = StepDevices(env, hw, scenario.run.kernels)
        self.debug = scenario.run.debug_checks
        self.skip_ahead = scenario.run.skip_ahead
        # Skip-ahead's bounds. next_event_s: the next event that can change this replica's decisions (any event by
        # default). soft_event_s: the next event whose effects reach the scheduler only at its next decision, so a
        # run may take the step it falls in (none by default). arrivals_ahead: arrivals that only queue a request
        # here (colocated prefill), which a run may pass (sim/serving/decode_run.py); None when arrivals are among
        # next_event_s's events. Drivers whose arrivals are fixed in advance narrow them (:meth:`follow`).
        self.next_event_s: Callable[[], float] = env.peek
        self.soft_event_s: Callable[[], float] = _never
        self.arrivals_ahead: ArrivalSchedule | None = None
        # skip-ahead runs of recalling steps need an offload policy and kernels sim/serving/decode.py covers
        self.offload_runs = offload_runs_possible(policy, self.devices, self.skip_ahead)
        self.waiting: deque[Request] = deque()
        self.batch = DecodeBatch(policy.recall_state_width)
        self.chunked: Request | None = None  # request whose prefill is split across forwards
        self.in_forward: list[Request] = []  # prefill chunks riding in the decode step now (mixed prefill)
        self.arrived = 0
        self.wake: simpy.Event = env.event()
        self.num_done = 0  # finished or rejected
        self.closed = False  # no more submissions will come
        self.submitted: list[Request] = []  # in submission order
        self.prefill_free = scenario.serving.prefill == "none"
        self.prefill_gpus = simpy.Resource(env, capacity=scenario.serving.num_prefill_gpus)
        self.prefills_queued = 0  # remote prefills sent and not yet computing (to start, or waiting for a GPU)
        self.prefill_ends_s: list[float] = []  # when each computing remote prefill ends

    # ---- arrivals --------------------------------------------------------------------------------
    def arrivals(self, requests: list[Request]) -> Generator[simpy.Event, object, None]:
        """Submit ``requests`` (in arrival order) at their arrival times (open loop), then close the replica.
        Routers and closed-loop sessions call :meth:`submit` and :meth:`close` instead.

        This driver, the run's horizon and the replica's own remote prefills are then the only other events in the
        environment (sim/serving/fleet.py ``Fleet.run``), so skip-ahead's hard bound is the horizon alone and the
        arrivals (and remote prefills) are soft ones (:meth:`follow`)."""
        schedule = ArrivalSchedule((r.arrival_s for r in requests), self.env.now)
        horizon_s = self.scenario.run.horizon_s
        self.follow(schedule, math.inf if horizon_s is None else float(horizon_s), requests)
        for i, req in enumerate(requests):
            schedule.next_index = i
            if req.arrival_s > self.env.now:
                yield self.env.timeout(req.arrival_s - self.env.now)
            self.submit(req)
        schedule.next_index = len(requests)
        self.close()

    def follow(
        self, schedule: ArrivalSchedule | None, horizon_s: float, requests: Sequence[Request] | None = None
    ) -> None:
        """Skip-ahead's bounds when this replica's arrivals are fixed in advance (``schedule``: its own, ``requests``
        its requests in the same order; None: behind a load-aware router, whose arrivals cut its runs instead,
        sim/serving/decode.py) and the only other events in the environment are the driver's, the horizon and
        its own remote prefills. The horizon is a hard bound (a run ends before the step it falls in: the simulation
        stops there). The others reach the scheduler only at its next decision (an arrival queues for prefill, a
        prefill queues its request; no step in flight reads what they change), so they are soft bounds: with remote
        prefill, its remote prefills and the first instant its next arrival can reach the scheduler
        (:attr:`soft_event_s`, :func:`_next_feed_s`); colocated, its arrivals (:attr:`arrivals_ahead`, which a run
        passes while requests are queued, sim/serving/decode_run.py)."""
        self.next_event_s = lambda: horizon_s
        if self.disaggregated:
            self.soft_event_s = functools.partial(_next_feed_s, self, schedule, requests)
        else:
            self.arrivals_ahead = schedule

    def submit(self, req: Request) -> None:
        """A request arrives now (from a trace, a router or a closed-loop session).

        Requests that can never run here are rejected at once; the others go to remote prefill
        (disaggregated) or the waiting queue. ``req.done``, if set, fires when it finishes or is rejected.
        """
        self.arrived += 1
        self.submitted.append(req)
        reason = self.admission.never_fits(req, self.kv)
        if reason:  # reject on arrival: never occupy a prefill GPU for a request that cannot run
            self._reject(req, reason)
            self._wake()
        else:
            self._to_prefill(req)

    def close(self) -> None:
        """No more submissions: :meth:`run` returns once every submitted request is done."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def _enqueue(self, req: Request) -> None:
        self.waiting.append(req)
        self._wake()

    # ---- the scheduler loop ----------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, object, None]:
        """The scheduler loop; returns when the replica is closed and every submitted request is done."""
        while True:
            if self.disaggregated:
                self.batch.add(self._admit_prefilled())
                chunks = None
            else:
                chunks = self._build_prefill()
            if chunks:
                yield from self._prefill(chunks)
            elif len(self.batch):
                if not (self.skip_ahead and (yield from self._decode_run())):
                    yield from self._decode_step()
            elif self.closed and self.num_done == self.arrived:
                return
            else:
                self.wake = self.env.event()
                yield self.wake

    def _admitted(self, running: int, more: Callable[[], bool]) -> Generator[Request, None, None]:
        """Requests the admission lets in now, in queue order; those that can never run are rejected."""
        walk = self.admission.select(self.waiting, self.batch, self.kv, running, more, self.disaggregated)
        for req, verdict in walk:
            if verdict == OK:
                yield req
            else:
                self._reject(req, verdict)

    # ---- decode (sim/serving/decode.py) ---------------------------------------------------------
    def _preempt(self) -> None:
        """Preempt one request: SGLang ``retract_decode``'s fewest generated tokens first, then the longest prompt, or
        vLLM's most recently admitted (``preempt_victim``, from the engine card)."""
        b = self.batch
        if self.policy.params.preempt_victim == "newest":
            victim = len(b) - 1  # the batch keeps admission order (DecodeBatch.add appends)
        else:
            victim = int(np.lexsort((-b.prompt, b.generated))[0])
        mask = np.zeros(len(b), dtype=bool)
        mask[victim] = True
        (req,) = b.remove(mask)
        self.kv.release(req)
        req.num_preemptions += 1
        if self.swap:  # KV to host, back at the head of the queue (SGLang PD decode retraction)
            ctx = req.prompt_tokens + req.generated - 1  # its KV on the D2H queue (FIFO), waited for before a step
            self.swap_end_s = max(self.swap_end_s, self.gpu.swap_out(self.devices, self.env.now, ctx))
            req.swapped = True
            self.waiting.appendleft(req)
        elif self.disaggregated:
            self._to_prefill(req)
        else:
            self.waiting.appendleft(req)  # re-prefilled first
        self.admission.on_preempt(b)
        self.rec.num_preemptions += 1

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _finish(self, req: Request) -> None:
        req.finish_s = self.env.now
        self.kv.release(req)
        self._done(req)

    def _reject(self, req: Request, reason: str) -> None:
        req.unfinished_reason = reason
        self._done(req)

    def _done(self, req: Request) -> None:
        self.num_done += 1
        self.rec.requests.append(req)
        self.on_finish(req)
        if req.done is not None:
            req.done.succeed(req)

    def _check_invariants(self, hbm_bytes: int) -> None:
        """Expensive sweeps, on with ``run.debug_checks`` (tests turn it on)."""
        kv = self.kv
        reqs = self.batch.reqs + ([self.chunked] if self.chunked else []) + self.in_forward
        held = int(self.batch.blocks.sum()) + (self.chunked.device_blocks if self.chunked else 0)
        held += sum(r.device_blocks for r in self.in_forward)
        held += (kv.prefix.cached_blocks if kv.prefix else 0) - sum(r.shared_blocks for r in reqs)
        assert held == kv.device.used, f"device blocks held {held} != pool used {kv.device.used}"
        assert hbm_bytes <= self.gpu.hardware.hbm_bytes, f"HBM {hbm_bytes} B over capacity"
        assert 0 <= kv.host.used <= kv.host.capacity, f"host DRAM {kv.host.used} B out of range"
        expected = self.policy.device_blocks(self.batch.ctx, self.batch.offloaded)
        assert np.array_equal(expected, self.batch.blocks), "block counts drifted from the KV tokens"


def _never() -> float:
    return math.inf


def _next_feed_s(
    replica: Replica, schedule: ArrivalSchedule | None, requests: Sequence[Request] | None = None
) -> float:
    """The next event that feeds ``replica``'s queue with remote prefill: one of its remote prefills
    (``Prefill.next_prefill_event_s``) or its next arrival in ``schedule`` (None: not known in advance). An arrival
    only sends its request to the prefill pool: when a prefill GPU is free now and will take it at once
    (``Prefill.remote_prefill_end_s``; ``requests``: the schedule's requests) and that prefill ends before both the
    replica's next prefill event and the arrival after it, the arrival feeds the queue at the end of its prefill;
    else (or with ``prefill: none``, where the arrival queues its request at once) at its arrival. (A run bounded by
    an earlier event could end exactly at that prefill's end, whose timeout is scheduled inside the run, after the
    run's own: SimPy would then order the two unlike stepping, so such a run keeps the arrival as its bound.)"""
    next_s = replica.next_prefill_event_s()
    if schedule is None:
        return next_s
    i, times = schedule.next_index, schedule.times_s
    if i >= len(times):
        return next_s
    arrival_s = float(times[i])
    end_s = None
    if requests is not None and not replica.prefill_free:
        end_s = replica.remote_prefill_end_s(requests[i], arrival_s)
    later_s = float(times[i + 1]) if i + 1 < len(times) else math.inf
    if end_s is None or end_s >= min(next_s, later_s):
        return min(next_s, arrival_s)
    return end_s  # the soft bound: a run never ends exactly at it (sim/serving/decode_run.py)
