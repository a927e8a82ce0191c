"""SGLang-like continuous batching on one GPU replica, as a SimPy process (REFERENCE.md §5.2).

One iteration of :meth:`Replica.run`:

1. **Prefill first.** If a chunked request is in flight or the head of the waiting queue can be admitted,
   run one prefill forward of at most ``chunked_prefill_tokens`` new tokens (FCFS, stopping at the first
   request that does not fit, like SGLang's ``PrefillAdder``). Admission needs the request's device
   blocks plus a reservation for future tokens (remaining output, clipped, × ``new_token_ratio``) of
   every running request; offloaded requests also need host DRAM for their whole KV.
2. **Else decode** the running batch, one token per request: allocate the new tokens' blocks (retracting
   requests with the fewest generated tokens while the pool is short, SGLang ``retract_decode``), ask
   the policy what the step costs, run the layer pipeline (``sim/pipeline.py``), advance every request
   and finish those that are done.
3. **Else sleep** until the next arrival.

With ``serving.prefill: disaggregated`` step 1 changes: arrivals queue for a pool of remote prefill GPUs
(``num_prefill_gpus``, FIFO); a request that finished prefill (its first token sampled there) waits for
the decode GPU, and admission moves it straight into the decode batch with no forward on this GPU. A
retracted request goes back through remote prefill. ``serving.prefill: none`` is the same path with
prefill costing no time (requests arrive with their KV cached; used to validate against the engine).

Token bookkeeping: ``ctx`` counts tokens whose KV is cached. A prefill of N tokens caches N and samples
one token; a decode step caches the last sampled token (ctx + 1), attends ctx + 1 tokens and samples
the next. A retracted request later re-prefills its prompt plus the tokens it had generated.

Hot path: the decode batch is a struct of numpy arrays; per-step work is a handful of vectorised ops
plus an O(num_layers) pipeline recurrence. Requests are synced back from the arrays only when they
leave the batch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np
import simpy

from sim.config import Scenario
from sim.metrics import Recorder
from sim.policies.base import Policy, StepCost
from sim.serving.kv import Pool, device_pool_blocks
from sim.step.interrupt import run_interruptible
from sim.step.pipeline import run_closed_form, run_events

NAN = math.nan
BYPASS_SCAN = 32  # queued requests scanned past an offloaded head that the I/O admission holds back


@dataclass(slots=True)
class Request:
    """One request and its serving state (times in simulation seconds)."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    generated: int = 0  # output tokens sampled so far
    prefill_target: int = 0  # tokens the current (re)prefill must cache
    prefilled: int = 0  # tokens of the current prefill already cached
    offloaded: bool = False
    device_blocks: int = 0  # device-pool blocks held
    host_bytes: int = 0  # host DRAM held (offloaded KV)
    first_token_s: float = NAN
    finish_s: float = NAN
    num_preemptions: int = 0
    unfinished_reason: str = ""
    holds_kv: bool = False  # admitted and holding device blocks / host bytes
    done: simpy.Event | None = None  # set by a closed-loop driver; fires when the request is done


class DecodeBatch:
    """The running decode batch as parallel arrays (struct of arrays) plus the Request objects."""

    def __init__(self) -> None:
        self.reqs: list[Request] = []
        self.ctx = np.zeros(0, dtype=np.int64)  # cached KV tokens
        self.generated = np.zeros(0, dtype=np.int64)
        self.output = np.zeros(0, dtype=np.int64)
        self.blocks = np.zeros(0, dtype=np.int64)  # device blocks held
        self.offloaded = np.zeros(0, dtype=bool)
        self.cold = np.zeros(0, dtype=bool)  # recall buffer empty (first step after prefill)
        self.prompt = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, reqs: list[Request]) -> None:
        """Append requests that just finished prefill (their ``prefill_target`` tokens are cached)."""
        if not reqs:
            return
        self.reqs.extend(reqs)
        self.ctx = np.append(self.ctx, [r.prefill_target for r in reqs])
        self.generated = np.append(self.generated, [r.generated for r in reqs])
        self.output = np.append(self.output, [r.output_tokens for r in reqs])
        self.blocks = np.append(self.blocks, [r.device_blocks for r in reqs])
        self.offloaded = np.append(self.offloaded, [r.offloaded for r in reqs])
        self.cold = np.append(self.cold, np.ones(len(reqs), dtype=bool))
        self.prompt = np.append(self.prompt, [r.prompt_tokens for r in reqs])

    def remove(self, mask: np.ndarray) -> list[Request]:
        """Drop the requests where ``mask`` is True; sync and return them."""
        gone = [self.reqs[i] for i in np.flatnonzero(mask)]
        for i, r in zip(np.flatnonzero(mask), gone):
            r.generated = int(self.generated[i])
            r.device_blocks = int(self.blocks[i])
        keep = ~mask
        self.reqs = [r for r, k in zip(self.reqs, keep) if k]
        for name in ("ctx", "generated", "output", "blocks", "offloaded", "cold", "prompt"):
            setattr(self, name, getattr(self, name)[keep])
        return gone


class Replica:
    """One GPU replica serving a request table with one policy.

    Args:
        env: the SimPy environment.
        scenario: the validated scenario.
        policy: the policy instance (``sim.policies.make_policy(scenario, name)``).
        requests: requests in arrival order, submitted by :meth:`arrivals` (open loop); pass ``[]`` and
            call :meth:`submit` / :meth:`close` to drive the replica from a router or sessions.
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
        requests: list[Request],
        rng: np.random.Generator,
        recorder: Recorder,
        on_finish: Callable[[Request], None] | None = None,
    ) -> None:
        self.env, self.scenario, self.policy, self.rng, self.rec = env, scenario, policy, rng, recorder
        self.requests = requests
        self.on_finish = on_finish or (lambda r: None)
        model, hw, p = scenario.model, scenario.hardware, policy.params
        self.device = Pool(device_pool_blocks(model, hw, p.block_size))
        self.host = Pool(hw.host_dram_bytes)
        self.block_bytes = p.block_size * model.kv_bytes_per_token
        self.fixed_hbm_bytes = model.weight_bytes + hw.reserve_bytes
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.layer_events = scenario.run.layer_model == "events"
        self.debug = scenario.run.debug_checks
        self.link = simpy.Resource(env, capacity=1)  # one H2D DMA queue per GPU (REFERENCE §3.2)
        self.gpu = simpy.Resource(env, capacity=1)  # the compute stream
        self.host_gather = simpy.Resource(env, capacity=1)  # the gather threads, one layer at a time
        self.link_free_s = 0.0
        self.waiting: deque[Request] = deque()
        self.batch = DecodeBatch()
        self.chunked: Request | None = None  # request whose prefill is split across forwards
        self.num_offloaded = 0
        self.new_token_ratio = p.new_token_ratio_init
        self.ratio_decay = (p.new_token_ratio_init - p.new_token_ratio_min) / p.new_token_ratio_decay_steps
        self.arrived = 0
        self.wake: simpy.Event = env.event()
        self.step_id = 0
        self.num_done = 0  # finished or rejected
        self.closed = False  # no more submissions will come
        self.submitted: list[Request] = []  # in submission order
        self.last_attended = 0  # KV tokens read per layer by the last decode step (admission estimate)
        self.policy_sparse_tokens = getattr(policy, "sparse_tokens", 0)
        self.recall_steps = 0  # decode steps that recalled (the timeline records one of them)
        self.disaggregated = scenario.serving.prefill in ("disaggregated", "none")
        self.prefill_free = scenario.serving.prefill == "none"
        self.prefill_gpus = simpy.Resource(env, capacity=scenario.serving.num_prefill_gpus)

    # ---- processes -------------------------------------------------------------------------------
    def arrivals(self) -> Generator[simpy.Event, object, None]:
        """Submit ``requests`` at their arrival times (open loop), then close the replica."""
        for req in self.requests:
            if req.arrival_s > self.env.now:
                yield self.env.timeout(req.arrival_s - self.env.now)
            self.submit(req)
        self.close()

    def submit(self, req: Request) -> None:
        """A request arrives now (from a trace, a router or a closed-loop session).

        Requests that can never run here are rejected at once; the others go to remote prefill
        (disaggregated) or the waiting queue. ``req.done``, if set, fires when it finishes or is rejected.
        """
        self.arrived += 1
        self.submitted.append(req)
        reason = self._never_fits(req)
        if reason:  # reject on arrival: never occupy a prefill GPU for a request that cannot run
            self._reject(req, reason)
            self._wake()
        elif self.prefill_free:
            self._prefilled(req)
        elif self.disaggregated:
            self.env.process(self._remote_prefill(req))
        else:
            self._enqueue(req)

    def close(self) -> None:
        """No more submissions: :meth:`run` returns once every submitted request is done."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def _enqueue(self, req: Request, front: bool = False) -> None:
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)
        if not self.wake.triggered:
            self.wake.succeed()

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
                yield from self._decode_step()
            elif self.closed and self.num_done == self.arrived:
                return
            else:
                self.wake = self.env.event()
                yield self.wake

    # ---- disaggregated prefill -------------------------------------------------------------------
    def _remote_prefill(self, req: Request) -> Generator[simpy.Event, object, None]:
        """Prefill on a remote GPU (FIFO pool), then queue for the decode GPU."""
        target = req.prompt_tokens + req.generated
        with self.prefill_gpus.request() as gpu:
            yield gpu
            yield self.env.timeout(self.policy.compute.prefill_s([(target, 0)], 1))
        self._prefilled(req)

    def _prefilled(self, req: Request) -> None:
        """A remote (or, with ``prefill: none``, free and immediate) prefill finished: first token, then queue."""
        req.generated = min(req.generated + 1, req.output_tokens)
        if math.isnan(req.first_token_s) and req.output_tokens > 0:
            req.first_token_s = self.env.now
        if req.generated >= req.output_tokens:
            self._finish(req)
            self._wake()
        else:
            self._enqueue(req)

    def _admit_prefilled(self) -> list[Request]:
        """Move prefilled requests from the queue into the decode batch while their KV fits (FCFS)."""
        admitted: list[Request] = []
        if not self.waiting:
            return admitted
        for req in self._admit_from_queue(len(self.batch), lambda: True):
            req.prefilled = req.prefill_target
            admitted.append(req)
        return admitted

    def _admit_from_queue(self, running: int, more: Callable[[], bool]) -> Iterator[Request]:
        """FCFS admission over the waiting queue (SGLang ``PrefillAdder``): yield each admitted request.

        Stops at the first request that must wait for memory; one that waits only for the link
        (IO-adaptive admission) lets up to ``BYPASS_SCAN`` requests behind it try (dense ones get in).
        Requests that can never run are rejected on the way. ``more()`` is asked before each request.
        """
        reserved = self._reserved_blocks()
        pos = 0
        while pos < len(self.waiting) and running < self.policy.params.max_running_requests and more():
            req = self.waiting[pos]
            cached = req.prompt_tokens + req.generated - 1 if self.disaggregated else None
            verdict = self._admit(req, reserved, cached)
            if verdict == "wait_io" and pos < BYPASS_SCAN:
                pos += 1  # the link is full, not the pool: let dense requests behind it in
                continue
            if verdict in ("wait", "wait_io"):
                return
            del self.waiting[pos]
            if verdict != "ok":
                self._reject(req, verdict)
                continue
            reserved += self._future_blocks(req)
            running += 1
            yield req

    # ---- prefill ---------------------------------------------------------------------------------
    def _build_prefill(self) -> list[tuple[Request, int]]:
        p = self.policy.params
        budget = p.chunked_prefill_tokens
        chunks: list[tuple[Request, int]] = []
        if self.chunked is not None:
            req = self.chunked
            take = min(req.prefill_target - req.prefilled, budget)
            chunks.append((req, take))
            budget -= take
            if req.prefilled + take < req.prefill_target:
                return chunks
            self.chunked = None
        if not self.waiting or budget <= 0:
            return chunks
        for req in self._admit_from_queue(len(self.batch) + len(chunks), lambda: budget > 0):  # noqa: B023
            take = min(req.prefill_target, budget)
            chunks.append((req, take))
            budget -= take
            if take < req.prefill_target:
                self.chunked = req
                break
        return chunks

    def _future_blocks(self, req: Request) -> float:
        future = min(req.output_tokens - req.generated, self.policy.params.clip_max_new_tokens)
        return self.policy.growth_one(future, req.offloaded) * self.new_token_ratio

    def _reserved_blocks(self) -> float:
        b = self.batch
        if not len(b):
            return 0.0
        future = np.minimum(b.output - b.generated, self.policy.params.clip_max_new_tokens)
        return float(self.policy.growth_blocks(future, b.offloaded).sum()) * self.new_token_ratio

    def _admit(self, req: Request, reserved: float, cached: int | None = None) -> str:
        """'ok' (blocks taken), 'wait', or the reason the request can never be served.

        ``cached`` is the KV tokens the request brings (disaggregated: computed remotely); by default
        the tokens its local prefill will cache (prompt + generated).
        """
        reason = self._never_fits(req)
        if reason:
            return reason
        total_tokens = req.prompt_tokens + req.output_tokens
        offloaded = self._offload_possible(req)
        target = req.prompt_tokens + req.generated if cached is None else cached
        need = self.policy.blocks_one(target, offloaded)
        worst = self.policy.blocks_one(total_tokens, offloaded)
        host_need = total_tokens * self.kv_bytes_per_token if offloaded else 0
        adm = self.policy.admission
        if offloaded and adm is not None:
            # IO-adaptive: a long request runs dense while the pool keeps dense_headroom_frac free after it.
            dense_worst = self.policy.blocks_one(total_tokens, False)
            headroom = self.policy.params.dense_headroom_frac * self.device.capacity
            if dense_worst + headroom <= self.device.free - reserved:
                offloaded, host_need = False, 0
                need = self.policy.blocks_one(target, False)
        req.offloaded = offloaded
        if offloaded and (
            self.num_offloaded >= self.policy.params.max_offloaded_requests or host_need > self.host.free
        ):
            return "wait"
        # The reservation rounds up per block; never ask for more than the request can ever hold.
        if min(need + self._future_blocks(req), worst) > self.device.free - reserved:
            return "wait"
        if offloaded and adm is not None and not self._io_allows(adm):
            return "wait_io"
        self.device.allocate(need)
        if offloaded:
            self.host.allocate(host_need)
            self.num_offloaded += 1
        req.device_blocks, req.host_bytes, req.holds_kv = need, host_need, True
        req.prefill_target, req.prefilled = target, 0
        return "ok"

    def _offload_possible(self, req: Request) -> bool:
        """The policy wants it offloaded and the host can hold its KV (else it runs dense)."""
        total = req.prompt_tokens + req.output_tokens
        return self.policy.wants_offload(req.prompt_tokens) and total * self.kv_bytes_per_token <= self.host.capacity

    def _never_fits(self, req: Request) -> str:
        """Why the request can never be served on this replica ('' if it can); checked on arrival too."""
        total = req.prompt_tokens + req.output_tokens
        if total > self.scenario.model.max_seq_len:
            return "exceeds_max_seq_len"
        if self.policy.blocks_one(total, self._offload_possible(req)) > self.device.capacity:
            return "exceeds_kv_pool"
        return ""

    def _io_allows(self, adm) -> bool:
        """IO-adaptive admission: predicted recall of the next step within φ × predicted layer compute."""
        if self.num_offloaded == 0:
            return True  # always let one in: with nothing offloaded there is no recall to protect
        b = self.batch
        in_batch = int(b.offloaded.sum())
        cold = int((b.offloaded & b.cold).sum()) + (self.num_offloaded - in_batch)
        warm = in_batch - int((b.offloaded & b.cold).sum())
        joining = self.num_offloaded - in_batch + 1
        attended = self.last_attended + joining * self.policy_sparse_tokens
        layer_s = self.policy.compute.decode_layer_s(len(b) + joining, attended)
        return adm.allows(warm, cold, layer_s)

    def _prefill(self, chunks: list[tuple[Request, int]]) -> Generator[simpy.Event, object, None]:
        start = self.env.now
        done = [r for r, take in chunks if r.prefilled + take >= r.prefill_target]
        duration = self.policy.compute.prefill_s([(take, r.prefilled) for r, take in chunks], len(done))
        if self.layer_events:
            with self.gpu.request() as gpu:
                yield gpu
                yield self.env.timeout(duration)
        else:
            yield self.env.timeout(duration)
        for r, take in chunks:
            r.prefilled += take
        now = self.env.now
        joining = []
        for r in done:
            r.generated = min(r.generated + 1, r.output_tokens)
            if math.isnan(r.first_token_s) and r.output_tokens > 0:
                r.first_token_s = now
            if r.generated >= r.output_tokens:
                self._finish(r)
            else:
                joining.append(r)
        self.batch.add(joining)
        tokens = sum(take for _, take in chunks)
        self._record("prefill", start, len(chunks), sum(r.offloaded for r, _ in chunks), tokens, None, 0.0, 0.0)

    # ---- decode ----------------------------------------------------------------------------------
    def _decode_step(self) -> Generator[simpy.Event, object, None]:
        env, b, pol = self.env, self.batch, self.policy
        start = env.now
        self._grow_or_retract()
        if not len(b):
            return
        ctx = b.ctx + 1
        cost = pol.step_cost(ctx, b.offloaded, b.cold, self.rng)
        overhead = pol.compute.step_overhead_s
        stall = busy = 0.0
        if cost.recall_s is None and cost.interrupt is None:
            yield env.timeout(overhead + sum(cost.compute_s) + cost.head_s)
        else:
            self.recall_steps += 1
            record = self.recall_steps in (1, self.scenario.run.timeline_step)
            intervals: list[tuple] | None = [] if record else None
            if cost.interrupt is not None:
                plan = cost.interrupt
                timing = run_interruptible(
                    start + overhead, cost.compute_s, plan.prefetch, plan.correction, plan.lookahead_items,
                    plan.chunk_bytes, self.link_free_s, intervals,
                )  # fmt: skip
                self.link_free_s = timing.link_free_s
                yield env.timeout(timing.end_s + cost.head_s - start)
            elif self.layer_events:
                yield env.timeout(overhead)
                timing = yield env.process(
                    run_events(env, self.link, self.gpu, cost.compute_s, cost.recall_s, self.host_gather, cost.gather_s)
                )
                yield env.timeout(cost.head_s)
            else:
                timing = run_closed_form(
                    start + overhead, cost.compute_s, cost.recall_s, self.link_free_s, cost.gather_s, intervals
                )
                self.link_free_s = timing.link_free_s
                yield env.timeout(timing.end_s + cost.head_s - start)
            stall, busy = timing.stall_s, timing.link_busy_s
            groups = len(timing.layer_stall_s) // len(cost.layer_bytes)
            layer_stall = np.asarray(timing.layer_stall_s).reshape(-1, groups).sum(axis=1)
            self.rec.add_layers(start, cost.layer_bytes, cost.layer_fragments, layer_stall)
            if intervals is not None:
                self.rec.set_timeline(self.step_id, groups, intervals)
        pol.observe(env.now - start, stall, busy)
        self.last_attended = cost.attended_tokens
        b.ctx = ctx
        b.generated += 1
        b.cold[:] = False
        n_off = int(b.offloaded.sum())
        self.rec.link_busy_s += busy
        self._record("decode", start, len(b), n_off, 0, cost, stall, busy)
        self.rec.decode_tokens += len(b)
        self.new_token_ratio = max(self.policy.params.new_token_ratio_min, self.new_token_ratio - self.ratio_decay)
        finished = b.generated >= b.output
        if finished.any():
            for r in b.remove(finished):
                self._finish(r)

    def _grow_or_retract(self) -> None:
        """Allocate the blocks the next token needs; retract requests while the pool is short."""
        b, pol = self.batch, self.policy
        while len(b):
            new_blocks = pol.device_blocks(b.ctx + 1, b.offloaded)
            need = int((new_blocks - b.blocks).sum())
            if self.device.allocate(need):
                b.blocks = new_blocks
                return
            # SGLang retract_decode: fewest generated tokens first, then the longest prompt.
            victim = int(np.lexsort((-b.prompt, b.generated))[0])
            mask = np.zeros(len(b), dtype=bool)
            mask[victim] = True
            (req,) = b.remove(mask)
            self._release(req)
            req.num_preemptions += 1
            if self.prefill_free:
                self._prefilled(req)
            elif self.disaggregated:
                self.env.process(self._remote_prefill(req))
            else:
                self.waiting.appendleft(req)
            self.new_token_ratio = self.policy.params.new_token_ratio_init
            self.rec.num_preemptions += 1

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _release(self, req: Request) -> None:
        if not req.holds_kv:  # e.g. a retracted request finishing in its remote re-prefill
            return
        self.device.release(req.device_blocks)
        req.device_blocks, req.holds_kv = 0, False
        if req.offloaded:
            self.host.release(req.host_bytes)
            self.num_offloaded -= 1
            req.host_bytes = 0

    def _finish(self, req: Request) -> None:
        req.finish_s = self.env.now
        self._release(req)
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

    def _record(
        self,
        phase: str,
        start: float,
        batch_size: int,
        num_offloaded: int,
        prefill_tokens: int,
        cost: StepCost | None,
        stall_s: float,
        link_busy_s: float,
    ) -> None:
        hbm = self.fixed_hbm_bytes + self.device.used * self.block_bytes
        if self.debug:
            self._check_invariants(hbm)
        attended = recall_bytes = fragments = transfers = 0
        if cost is not None:
            attended, recall_bytes = cost.attended_tokens, cost.recall_bytes
            fragments, transfers = cost.num_fragments, cost.num_transfers
        self.rec.steps.append(
            (
                self.step_id, phase, start, self.env.now - start, batch_size, num_offloaded, prefill_tokens,
                attended, recall_bytes, fragments, transfers, stall_s, link_busy_s, self.device.used, hbm,
                self.host.used,
            )
        )  # fmt: skip
        self.step_id += 1

    def _check_invariants(self, hbm_bytes: int) -> None:
        """Expensive sweeps, on with ``run.debug_checks`` (tests turn it on)."""
        held = int(self.batch.blocks.sum()) + (self.chunked.device_blocks if self.chunked else 0)
        assert held == self.device.used, f"device blocks held {held} != pool used {self.device.used}"
        assert hbm_bytes <= self.scenario.hardware.hbm_bytes, f"HBM {hbm_bytes} B over capacity"
        assert 0 <= self.host.used <= self.host.capacity, f"host DRAM {self.host.used} B out of range"
        expected = self.policy.device_blocks(self.batch.ctx, self.batch.offloaded)
        assert np.array_equal(expected, self.batch.blocks), "block counts drifted from the KV tokens"
