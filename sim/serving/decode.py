"""The replica's decode: one decision's decode steps, built by one run builder and applied by one applier.

A mixin of :class:`~sim.serving.replica.Replica`. :meth:`Decode._next_run` builds a run of up to ``k_max`` decode
steps for any policy — its block growth and where it ends (sim/serving/decode_run.py), its costs (the policy's
``recall_free_decode`` or ``step_costs``) and its times (sim/step/timing.py ``StepDevices.time_run``), all in one
record (sim/step/cost.py ``DecodeRun``). A single step (:meth:`Decode._decode_step`) is ``k_max = 1``: its blocks
are allocated first (evicting or preempting while the pool is short) and it is always taken. A skip-ahead run
(:meth:`Decode._decode_run`, ``run.skip_ahead``) is ``k_max`` > 1: taken with one timeout when at least two steps
qualify, its blocks allocated after. Both are applied by :meth:`Decode._apply_run`: the clock, the batch, the pools,
the admission's feedback, the step rows and the finished requests are what stepping leaves
(tests/sim/test_skip_ahead.py, tests/sim/test_offload_run.py; docs/design.md §13).

Read this file after sim/serving/replica.py's scheduler loop (``Replica.run``): it is the decode step.

Runs cut by arrivals (:attr:`cut_runs`, a replica behind a load-aware router, sim/serving/cluster.py): the router's
choice at an arrival reads each replica's outstanding tokens (and prefix cache), which change only at arrivals and at
finishes, and no request finishes inside a run (a run ends at the first finish), so a replica's run need not end at
arrivals routed elsewhere. It is computed up to its own events (its remote prefills, the horizon) and waited for as
usual; an arrival routed here while it is in progress (:meth:`Decode.cut_run`) cuts it at the first of its step
boundaries after the first instant the arrival can reach the scheduler — where stepping first decides with it seen
— and the replica applies that prefix of the run (``cut_run``, ``OffloadedRun.cut``). Colocated (or with free
prefill) that instant is the arrival: the request queues here. With remote prefill the arrival only sends the
request to the prefill pool, and nothing this replica's steps read changes until its prefill ends: if a prefill GPU
is free the prefill ends at a time known now (the seconds ``_remote_prefill`` adds), and the run is cut at the first
boundary after that (a later arrival with a shorter prefill may cut it again, shorter); if every GPU is taken, the
prefill starts when one of them ends, an event the run already ends by (a soft bound at its start, or a cut), so
nothing is cut. Where a boundary equals the prefill's end, or a prefill sent at this instant has not taken its GPU
yet, the cut falls at the first boundary after the arrival, as colocated. No step of such a run ends exactly at an
arrival of the fleet (the ``ties`` of ``next_decode_run``), so a cut never has to order two events of one instant.
With colocated prefill and requests queued at its start a run is not cut: an arrival joins behind the held-back
head, as with the arrivals' soft bound (sim/serving/decode_run.py).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Generator

import numpy as np
import simpy

from sim.serving import decode_run
from sim.serving.arrivals import timeout_at
from sim.serving.request import Request
from sim.step.cost import DecodeRun


def offload_runs_possible(policy, devices, skip_ahead: bool) -> bool:
    """Whether a replica with this policy and devices can ever take a skip-ahead run of steps that recall: skip-ahead
    on, an offload policy whose configuration :meth:`~sim.policies.offload.OffloadServing.runs_offloaded` covers, the
    compiled kernels installed (``run.kernels`` not ``python``)."""
    return skip_ahead and hasattr(policy, "recall") and policy.runs_offloaded() and devices.fast_kernels


class Decode:
    """Mixin of :class:`~sim.serving.replica.Replica` (uses its clock, batch, pools, admission, devices, recorder,
    draws, skip-ahead bounds and ``_preempt``; sets :attr:`cut_runs` and :attr:`ties` behind a load-aware router)."""

    cut_runs = False  # an arrival routed here cuts the run in progress (module docstring)
    ties = None  # ArrivalSchedule | None: arrivals no step of a run may end exactly at (runs that may be cut)
    _run_times_s: list[float] | None = None  # the step boundaries of the run in progress that an arrival may cut
    _run_end = 0  # the boundary of ``_run_times_s`` the run in progress ends at (an arrival may move it earlier)
    _run_process: simpy.Process | None = None

    # ---- one run builder -------------------------------------------------------------------------
    def _next_run(self, k_max: int, extra_s: float = 0.0, grown: tuple | None = None) -> DecodeRun | None:
        """The next decode steps from now as one record, timed (nothing applied: undrawn draws stay in their streams,
        the devices' queues as they are until :meth:`DecodeRun.commit`).

        Args:
            k_max: 1 for a single step, which is always taken: ``grown`` is its block growth
                (:meth:`_decode_step`, allocated already), ``extra_s`` GPU seconds of prefill chunks riding in it
                (``serving.mixed_prefill``), added to its host overhead before layer 0. More: a skip-ahead run of up to
                that many steps, bounded as sim/serving/decode_run.py says; None when fewer than two qualify.
        """
        b, pol, kv = self.batch, self.policy, self.kv
        now_s, n, rec = self.env.now, len(b), self.rec
        recall_free = pol.is_recall_free(b.offloaded)
        next_s = soft_s = stop_recall = math.inf
        arrivals = None
        if k_max == 1:
            ctx, held, need = grown
            k = 1
            record = rec.recall_steps + 1 in (1, rec.timeline_step)  # the step the timeline keeps, if it recalls
        else:
            if not (recall_free or (self.offload_runs and np.count_nonzero(b.offloaded))):
                return None
            next_s, soft_s, arrivals = self.next_event_s(), self.soft_event_s(), self.arrivals_ahead
            if arrivals is not None and not self.waiting:  # (with a queue, arrivals join behind its held-back head)
                soft_s = min(soft_s, arrivals.next_s())
            if next_s <= now_s:
                return None
            k = decode_run.step_cap(pol, b, now_s, next_s, soft_s, recall_free)
            if k < 2:
                return None
            if not recall_free:  # its costs read the free pool at each step: its blocks are fitted first
                k, ctx, held, need = decode_run.fitting_steps(
                    pol, self.admission, b, kv, self.waiting, self.disaggregated, k
                )  # fmt: skip
                if k < 2:
                    return None
                ctx, held, need = ctx[:k], held[:k], need[:k]
            record = False
            seen = rec.recall_steps  # stop before the step the timeline keeps (it is stepped, to record it)
            stop_recall = 1 if seen == 0 else (rec.timeline_step - seen if seen < rec.timeline_step else math.inf)
        compute = pol.compute
        if recall_free:
            attended, layer_s = pol.recall_free_decode(b.ctx + 1, b.offloaded, k)
            run = DecodeRun(layer_s[:, None], None, compute.decode_head_s(n), 0, compute.num_layers, attended)
        else:  # (a single step's blocks are allocated already, a run's not yet)
            free_blocks = np.array([kv.device.free]) if k_max == 1 else kv.device.free - need
            free_hbm_bytes = free_blocks * kv.block_bytes
            run = pol.step_costs(ctx, b.offloaded, b.cold, self.draws, b.recall_state, free_hbm_bytes)
        overhead_s, host_s = compute.step_overhead_s + extra_s, compute.overlapped_host_s(n)
        self.devices.time_run(run, now_s, overhead_s, host_s, next_s, soft_s, stop_recall, record)
        if k_max > 1:
            if recall_free:  # its costs do not read the pool: its blocks are fitted to the steps timed
                if run.steps < 2:
                    return None
                k, ctx, held, need = decode_run.fitting_steps(
                    pol, self.admission, b, kv, self.waiting, self.disaggregated, run.steps
                )  # fmt: skip
                run.steps = min(run.steps, k)
            run.steps = decode_run.run_end(run.times_s, run.steps, now_s, arrivals, self.ties)
            if run.steps < 2:
                return None
            del run.times_s[run.steps + 1 :]
        run.ctx, run.held, run.allocated = ctx, held, need
        return run

    # ---- a single step ---------------------------------------------------------------------------
    def _decode_step(self, extra_s: float = 0.0) -> Generator[simpy.Event, object, None]:
        """One decode step, stepped: its blocks — allocated now, preempting requests while the pool is short
        (unreferenced prefix-cache nodes are evicted before anyone is preempted) —, then the run of one step
        (:meth:`_next_run`) and what it leaves behind (:meth:`_apply_run`). ``extra_s``: GPU seconds of prefill chunks
        riding in the step (``serving.mixed_prefill``)."""
        b, kv = self.batch, self.kv
        while True:  # the step's block growth (grown_blocks of one step, over the requests left)
            grown = decode_run.grown_blocks(self.policy, b, 1)
            blocks = int(grown[2][0])
            if not len(b) or kv.device.allocate(blocks) or (kv.make_room(blocks) and kv.device.allocate(blocks)):
                b.blocks = grown[1][0]
                break
            self._preempt()
        if self.swap_end_s > self.env.now:  # retraction offloads and resume loads block the scheduler until they end
            yield from self.devices.run_forward(self.swap_end_s - self.env.now)
        if not len(b):
            return
        run = self._next_run(1, extra_s, grown)
        run.commit(b.recall_state, b.offloaded, self.devices)
        yield self.env.timeout(float(run.step_s[0]))
        self._apply_run(run)

    # ---- a skip-ahead run ------------------------------------------------------------------------
    def _decode_run(self) -> Generator[simpy.Event, object, bool]:
        """Skip-ahead: run the next decode steps at once while nothing but the step index changes (:meth:`_next_run`
        with ``k_max`` > 1); the clock, step rows, admission feedback and request times equal what
        :meth:`_decode_step` gives step by step. Returns False, having done nothing, when no run qualifies."""
        if self.chunked is not None or self.swap_end_s > self.env.now:
            return False
        run = self._next_run(decode_run.MAX_RUN_STEPS)
        if run is None:
            return False
        run.steps = yield from self._wait_run(run.times_s)
        del run.times_s[run.steps + 1 :]  # (an arrival may have cut it)
        if run.recall_bytes is not None:  # (a recall-free run leaves no draws, state or queues)
            run.commit(self.batch.recall_state, self.batch.offloaded, self.devices)
        allocated = self.kv.device.allocate(int(run.allocated[run.steps - 1]))
        assert allocated, "skip-ahead allocated more blocks than were free"
        self._apply_run(run)
        return True

    def _wait_run(self, times_s: list[float]) -> Generator[simpy.Event, object, int]:
        """Wait until a run with step boundaries ``times_s`` ends; returns the steps taken, fewer when an arrival
        cut it (:meth:`cut_run`, which may cut it again, shorter)."""
        env = self.env
        if not (self.cut_runs and (self.disaggregated or not self.waiting)):
            yield env.timeout(times_s[-1] - env.now)
            return len(times_s) - 1
        self._run_times_s, self._run_process, self._run_end = times_s, env.active_process, len(times_s) - 1
        wait = env.timeout(times_s[-1] - env.now)
        while True:
            try:
                yield wait
                break
            except simpy.Interrupt:  # (the timeout waited for stays queued and fires later with nobody waiting on it)
                wait = timeout_at(env, times_s[self._run_end])
        self._run_times_s = None
        return self._run_end

    def cut_run(self, req: Request) -> None:
        """``req`` is routed here now: cut the run in progress (when it may be cut) at the first of its step
        boundaries after the first instant the arrival can reach the scheduler; the replica resumes there
        (:meth:`_wait_run`). Call before :meth:`Replica.submit`. With remote prefill that instant is the end of the
        request's prefill when it starts now (an arrival only queues for a prefill GPU; ties and prefills that may
        wait for a GPU cut at the first boundary after now); colocated or with free prefill, it is now."""
        times = self._run_times_s
        if times is None:
            return
        at_s = self.env.now
        if self.disaggregated and not self.prefill_free:
            gpus = self.prefill_gpus
            if gpus.count >= gpus.capacity:  # it starts when a prefill ends: an event the run already ends by
                return
            end_s = self.remote_prefill_end_s(req, at_s)
            if end_s is not None:
                i = bisect_left(times, end_s)
                if i == len(times) or times[i] != end_s:  # (a boundary exactly at it: cut after the arrival)
                    at_s = end_s
        end = bisect_right(times, at_s)  # times[end]: the first boundary after at_s
        if end >= self._run_end:
            return  # the run ends there or before anyway
        self._run_end = end
        self._run_process.interrupt()

    # ---- what k >= 1 steps leave behind ----------------------------------------------------------
    def _apply_run(self, run: DecodeRun) -> None:
        """What the ``run.steps`` decode steps taken leave behind (a single step is a run of one), whose blocks are
        allocated already (a step's at its start, a run's before this) and whose recall state and queues are
        committed (:meth:`DecodeRun.commit`): the admission's feedback, the recorder's totals, per-layer records and
        step rows, the batch advanced, and the requests that finished."""
        b, kv, rec = self.batch, self.kv, self.rec
        k = run.steps
        times_s = run.times_s  # [k + 1]
        steps_s = [times_s[1] - times_s[0]] if k == 1 else [end - start for start, end in zip(times_s, times_s[1:])]
        attended = run.attended_tokens[:k]
        if run.recall_bytes is None:
            self.admission.on_decode_run(steps_s, attended)
        else:
            self.admission.on_decode_run(steps_s, attended, run.stall_s[:k], run.link_busy_s[:k])
        allocated = run.allocated[:k]
        blocks_used = allocated + (kv.device.used - int(allocated[-1]))  # after each step
        hbm_bytes = (kv.fixed_hbm_bytes + blocks_used * kv.block_bytes).tolist()
        b.ctx, b.blocks = run.ctx[k - 1].copy(), run.held[k - 1].copy()
        b.generated += k
        b.cold[:] = False
        if self.debug:
            self._check_invariants(hbm_bytes[-1])
        rec.d2h_busy_s, rec.d2h_free_s = self.devices.d2h_busy_s, self.devices.d2h_free_s
        num_offloaded = int(np.count_nonzero(b.offloaded))
        rec.record_decode_run(
            run, times_s, steps_s, len(b), num_offloaded, blocks_used.tolist(), hbm_bytes, kv.host.used
        )  # fmt: skip
        rec.decode_tokens += len(b) * k
        finished = b.generated >= b.output
        if np.count_nonzero(finished):
            for r in b.remove(finished):
                self._finish(r)
