"""Skip-ahead, applied: the replica's methods that take a skip-ahead run of decode steps when one qualifies.

The skip-ahead runs are computed beside the models they read — sim/serving/decode_run.py (steps that recall
nothing) and sim/serving/offload_run.py (steps that recall) — and this mixin of
:class:`~sim.serving.replica.Replica` waits for one with one timeout, allocates its blocks and applies it with
``Replica._apply_run``, the same code that applies a single decode step (a run of one): the clock, the batch, the
pools, the admission's feedback, the step rows and the finished requests are what stepping leaves
(tests/sim/test_skip_ahead.py, tests/sim/test_offload_run.py; docs/design.md §13).

Runs cut by arrivals (:attr:`cut_runs`, a replica behind a load-aware router, sim/serving/cluster.py): the router's
choice at an arrival reads each replica's outstanding tokens (and prefix cache), which change only at arrivals and at
finishes, and no request finishes inside a run (a run ends at the first finish), so a replica's run need not end at
arrivals routed elsewhere. It is computed up to its own events (its remote prefills, the horizon) and waited for as
usual; an arrival routed here while it is in progress (:meth:`SkipAhead.cut_run`) cuts it at the first of its step
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

from bisect import bisect_left, bisect_right
from collections.abc import Generator

import numpy as np
import simpy

from sim.serving.arrivals import timeout_at
from sim.serving.decode_run import DecodeRun, cut_run, next_decode_run
from sim.serving.offload_run import next_offloaded_run
from sim.serving.request import Request


class SkipAhead:
    """Mixin of :class:`~sim.serving.replica.Replica` (uses its clock, batch, pools, admission, devices, recorder,
    draws and ``next_event_s``; sets :attr:`cut_runs` and :attr:`ties` behind a load-aware router)."""

    cut_runs = False  # an arrival routed here cuts the run in progress (module docstring)
    ties = None  # ArrivalSchedule | None: arrivals no step of a run may end exactly at (runs that may be cut)
    _run_times_s: list[float] | None = None  # the step boundaries of the run in progress that an arrival may cut
    _run_end = 0  # the boundary of ``_run_times_s`` the run in progress ends at (an arrival may move it earlier)
    _run_process: simpy.Process | None = None

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

    def _decode_run(self) -> Generator[simpy.Event, object, bool]:
        """Skip-ahead: run the next decode steps at once while nothing but the step index changes
        (sim/serving/decode_run.py; with offloaded requests sim/serving/offload_run.py); the clock, step rows,
        admission feedback and request times equal what :meth:`_decode_step` gives step by step. Returns False,
        having done nothing, when no run qualifies."""
        env, b = self.env, self.batch
        if self.chunked is not None or self.swap_end_s > env.now:
            return False
        next_s, arrivals = self.next_event_s(), self.arrivals_ahead
        soft_s = self.soft_event_s()
        run = next_decode_run(
            self.policy, b, self.kv, self.waiting, self.disaggregated, env.now, next_s, arrivals, self.ties, soft_s
        )
        if run is None:
            offloaded = self.offload_runs and np.count_nonzero(b.offloaded) > 0
            return offloaded and (yield from self._offloaded_run(next_s, soft_s))
        steps = yield from self._wait_run(run.times_s)
        run = cut_run(run, steps, self.policy, b)
        self._take_blocks(run)
        self._apply_run(run)
        return True

    def _offloaded_run(self, next_s: float, soft_s: float) -> Generator[simpy.Event, object, bool]:
        """A skip-ahead run of decode steps that recall (sim/serving/offload_run.py) up to the bounds ``next_s``
        and ``soft_s`` :meth:`_decode_run` read, applied as it applies one, after what it leaves in the recall state
        and the devices (``OffloadedRun.commit``)."""
        env, b, rec, dev = self.env, self.batch, self.rec, self.devices
        offloaded = next_offloaded_run(
            self.policy, b, self.kv, self.waiting, self.disaggregated, dev, self.draws, rec, env.now, next_s,
            self.arrivals_ahead, self.ties, soft_s,
        )  # fmt: skip
        if offloaded is None:
            return False
        steps = yield from self._wait_run(offloaded.run.times_s)
        offloaded = offloaded.cut(steps, self.policy, b)
        offloaded.commit(b, dev)
        self._take_blocks(offloaded.run)
        self._apply_run(offloaded.run)
        return True

    def _take_blocks(self, run: DecodeRun) -> None:
        """Allocate the blocks a skip-ahead run's steps grew by (:func:`~sim.serving.decode_run.fitting_steps` found
        that they fit)."""
        allocated = self.kv.device.allocate(int(run.allocated_blocks[-1]))
        assert allocated, "skip-ahead allocated more blocks than were free"
