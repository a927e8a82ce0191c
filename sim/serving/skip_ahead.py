"""Skip-ahead, applied: the replica's methods that take a skip-ahead run of decode steps when one qualifies.

The skip-ahead runs are computed beside the models they read — sim/serving/decode_run.py (steps that recall
nothing) and sim/serving/offload_run.py (steps that recall) — and this mixin of
:class:`~sim.serving.replica.Replica` waits for one with one timeout, allocates its blocks and applies it with
``Replica._apply_run``, the same code that applies a single decode step (a run of one): the clock, the batch, the
pools, the admission's feedback, the step rows and the finished requests are what stepping leaves
(tests/sim/test_skip_ahead.py, tests/sim/test_offload_run.py; docs/design.md §13).
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import simpy

from sim.serving.decode_run import DecodeRun, next_decode_run
from sim.serving.offload_run import next_offloaded_run


class SkipAhead:
    """Mixin of :class:`~sim.serving.replica.Replica` (uses its clock, batch, pools, admission, devices, recorder,
    draws and ``next_event_s``)."""

    def _decode_run(self) -> Generator[simpy.Event, object, bool]:
        """Skip-ahead: run the next decode steps at once while nothing but the step index changes
        (sim/serving/decode_run.py; with offloaded requests sim/serving/offload_run.py); the clock, step rows,
        admission feedback and request times equal what :meth:`_decode_step` gives step by step. Returns False,
        having done nothing, when no run qualifies."""
        env, b = self.env, self.batch
        if self.chunked is not None or self.swap_s > 0:
            return False
        next_s, arrivals = self.next_event_s(), self.arrivals_ahead
        run = next_decode_run(self.policy, b, self.kv, self.waiting, self.disaggregated, env.now, next_s, arrivals)
        if run is None:
            return self.offload_runs and np.count_nonzero(b.offloaded) > 0 and (yield from self._offloaded_run())
        yield env.timeout(float(run.times_s[-1]) - env.now)
        self._take_blocks(run)
        self._apply_run(run)
        return True

    def _offloaded_run(self) -> Generator[simpy.Event, object, bool]:
        """A skip-ahead run of decode steps that recall (sim/serving/offload_run.py), applied as :meth:`_decode_run`
        applies one, after what it leaves in the recall state and the devices (``OffloadedRun.commit``)."""
        env, b, rec, dev = self.env, self.batch, self.rec, self.devices
        next_s, arrivals = self.next_event_s(), self.arrivals_ahead
        offloaded = next_offloaded_run(
            self.policy, b, self.kv, self.waiting, self.disaggregated, dev, self.draws, rec, env.now, next_s, arrivals
        )
        if offloaded is None:
            return False
        yield env.timeout(float(offloaded.run.times_s[-1]) - env.now)
        offloaded.commit(b, dev)
        self._take_blocks(offloaded.run)
        self._apply_run(offloaded.run)
        return True

    def _take_blocks(self, run: DecodeRun) -> None:
        """Allocate the blocks a skip-ahead run's steps grew by (:func:`~sim.serving.decode_run.fitting_steps` found
        that they fit)."""
        allocated = self.kv.device.allocate(int(run.allocated_blocks[-1]))
        assert allocated, "skip-ahead allocated more blocks than were free"
