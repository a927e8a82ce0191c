"""Skip-ahead, applied: the replica's methods that run a planned run of decode steps at once.

The planning lives beside the models it reads — sim/serving/decode_run.py (steps that recall nothing) and
sim/serving/offload_run.py (steps that recall) — and this mixin of :class:`~sim.serving.replica.Replica` applies
a plan with one timeout and leaves behind exactly what stepping one decode step at a time leaves: the clock, the
batch, the pools, the admission's feedback, the step rows and the finished requests (tests/sim/test_skip_ahead.py,
tests/sim/test_offload_run.py; docs/design.md §13).
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import simpy

from sim.serving.decode_run import plan_decode_run
from sim.serving.offload_run import plan_offloaded_run


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
        run = plan_decode_run(self.policy, b, self.kv, self.waiting, self.disaggregated, env.now, next_s, arrivals)
        if run is None:
            return self.offload_runs and np.count_nonzero(b.offloaded) > 0 and (yield from self._offloaded_run())
        times_s = run.times_s
        yield env.timeout(float(times_s[-1]) - env.now)
        self.admission.on_decode_run((times_s[1:] - times_s[:-1]).tolist(), run.attended_tokens.tolist())
        self._apply_run(times_s, run.attended_tokens, run.ctx, run.blocks, run.allocated_blocks)
        return True

    def _offloaded_run(self) -> Generator[simpy.Event, object, bool]:
        """A run of decode steps that recall (sim/serving/offload_run.py), applied as :meth:`_decode_run` does."""
        env, b, rec, dev = self.env, self.batch, self.rec, self.devices
        next_s, arrivals = self.next_event_s(), self.arrivals_ahead
        run = plan_offloaded_run(
            self.policy, b, self.kv, self.waiting, self.disaggregated, dev, self.draws, rec, env.now, next_s, arrivals
        )
        if run is None:
            return False
        yield env.timeout(float(run.times_s[-1]) - env.now)
        recall = run.commit(b, dev, self.admission, rec, self.policy.recall_state_width)
        self._apply_run(
            run.times_s, run.costs.attended_tokens[: run.steps], run.ctx, run.blocks, run.allocated_blocks, recall
        )
        return True

    def _apply_run(
        self,
        times_s: np.ndarray,
        attended: np.ndarray,
        ctx: np.ndarray,
        blocks: np.ndarray,
        allocated_blocks: np.ndarray,
        recall: dict[str, np.ndarray] | None = None,
    ) -> None:
        """What a run's k steps leave behind: blocks allocated, the batch advanced, step rows, finished requests."""
        b, kv = self.batch, self.kv
        k = len(attended)
        blocks_used = kv.device.used + allocated_blocks
        allocated = kv.device.allocate(int(allocated_blocks[-1]))
        assert allocated, "skip-ahead allocated more blocks than were free"
        b.ctx, b.blocks = ctx, blocks
        b.generated += k
        b.cold[:] = False
        hbm_bytes = kv.fixed_hbm_bytes + blocks_used * kv.block_bytes
        if self.debug:
            self._check_invariants(int(hbm_bytes[-1]))
        self.rec.d2h_busy_s = self.devices.d2h_busy_s
        self.rec.record_decode_run(
            times_s, len(b), np.count_nonzero(b.offloaded), attended, blocks_used, hbm_bytes, kv.host.used, recall
        )
        self.rec.decode_tokens += len(b) * k
        self._finish_done()
