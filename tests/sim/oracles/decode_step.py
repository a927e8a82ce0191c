"""The decode step's per-step reference: one decode step written for one step, as sim/serving/replica.py stepped it
before a step became a run of one — its block growth (allocate the next token's blocks, preempting while the pool is
short), what it leaves behind (batch, admission feedback, recorder totals, per-layer records) and its step row
(the previous ``Recorder.record_step``, appending one row to the recorder's column arrays).

sim/ defines these once over a step axis (``grown_blocks``, ``Decode._apply_run``, ``Recorder.record_decode_run``;
a single step is a run of one). tests/sim/test_decode_step.py runs whole simulations with this step in place
of ``Replica._decode_step`` and checks every table equal, bit for bit."""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import simpy

from sim.metrics.recorder import Recorder
from sim.serving.replica import Replica
from tests.sim.oracles.steps import StepCost, run_step, step_cost


def decode_step(self: Replica) -> Generator[simpy.Event, object, None]:
    """``Replica._decode_step`` written for one step (use as a replacement method)."""
    env, b, pol, rec = self.env, self.batch, self.policy, self.rec
    start = env.now
    _grow_or_preempt(self)
    if self.swap_end_s > env.now:  # the swaps' copies end (sim/step/gpu.py: on the D2H queue and the link)
        yield from self.devices.run_forward(self.swap_end_s - env.now)
    if not len(b):
        return
    ctx = b.ctx + 1
    free_hbm_bytes = self.kv.device.free * self.kv.block_bytes
    cost = step_cost(pol, ctx, b.offloaded, b.cold, self.draws, b.recall_state, free_hbm_bytes)
    recalls = cost.recall_s is not None or cost.interrupt is not None
    intervals = [] if recalls and rec.recall_steps + 1 in (1, rec.timeline_step) else None
    host_s = pol.compute.overlapped_host_s(len(b))
    timing = yield from run_step(self.devices, cost, pol.compute.step_overhead_s, intervals, host_s)
    stall = busy = gather = 0.0
    if timing is not None:
        rec.recall_steps += 1
        stall, busy, gather = timing.stall_s, timing.link_busy_s, timing.gather_busy_s
        groups = len(timing.layer_stall_s) // len(cost.layer_bytes)
        layer_stall = np.asarray(timing.layer_stall_s).reshape(-1, groups).sum(axis=1)
        _add_layers(rec, start, cost.layer_bytes, cost.layer_fragments, layer_stall, env.now)
        if intervals is not None:
            rec.set_timeline(rec.next_step_id, groups, intervals)
    self.admission.on_decode_run([env.now - start], [cost.attended_tokens], [stall], [busy])
    b.ctx = ctx
    b.generated += 1
    b.cold[:] = False
    rec.link_busy_s += busy
    rec.gather_busy_s += gather
    kv = self.kv
    hbm = kv.hbm_used_bytes
    if self.debug:
        self._check_invariants(hbm)
    rec.d2h_busy_s = self.devices.d2h_busy_s
    state = (kv.device.used, hbm, kv.host.used)
    _record_step(rec, start, env.now, len(b), int(np.count_nonzero(b.offloaded)), cost, stall, busy, state, gather)
    rec.decode_tokens += len(b)
    finished = b.generated >= b.output
    if np.count_nonzero(finished):
        for r in b.remove(finished):
            self._finish(r)


def _grow_or_preempt(self: Replica) -> None:
    """Allocate the blocks the next token needs; preempt (``Replica._preempt``) while the pool is short."""
    b, pol = self.batch, self.policy
    while len(b):
        new_blocks = pol.device_blocks(b.ctx + 1, b.offloaded)
        need = int((new_blocks - b.blocks).sum())
        if self.kv.device.allocate(need) or (self.kv.make_room(need) and self.kv.device.allocate(need)):
            b.blocks = new_blocks
            return
        self._preempt()


def _add_layers(rec: Recorder, time_s: float, nbytes, fragments, stall_s, end_s: float) -> None:
    """One step's per-layer recall and stall, spread over the time bins it spans by overlap."""
    if not rec.keep_steps:
        return
    rec.layer_bytes += nbytes
    rec.layer_fragments += fragments
    rec.layer_stall_s += stall_s
    bin_s = rec.layer_bin_s
    end_s = max(end_s, time_s)
    first, last = int(time_s // bin_s), int(end_s // bin_s)
    if end_s > time_s and last > first and end_s == last * bin_s:
        last -= 1
    for key in range(first, last + 1):
        overlap_s = min(end_s, (key + 1) * bin_s) - max(time_s, key * bin_s)
        share = 1.0 if first == last else overlap_s / (end_s - time_s)
        acc = rec.binned_bytes.setdefault(key, np.zeros(rec.num_layers))
        acc += nbytes * share


def _record_step(
    rec: Recorder, start_s: float, end_s: float, batch_size: int, num_offloaded: int, cost: StepCost, stall_s: float,
    link_busy_s: float, kv_state: tuple[int, int, int], gather_busy_s: float,
) -> None:  # fmt: skip
    """One decode row and the totals, as the previous ``Recorder.record_step`` appended them."""
    blocks_used, hbm_bytes, host_bytes = kv_state
    duration_s = end_s - start_s
    t = rec.totals
    t.num_steps += 1
    t.decode_steps += 1
    t.decode_time_s += duration_s
    t.decode_stall_s += stall_s
    t.decode_recall_bytes += cost.recall_bytes
    t.decode_fragments += cost.num_fragments
    t.decode_selected_fragments += cost.selected_fragments
    t.decode_batch_sum += batch_size
    t.peak_kv_used_blocks = max(t.peak_kv_used_blocks, blocks_used)
    if not rec.keep_steps:
        return
    values = (
        1, start_s, duration_s, batch_size, num_offloaded, 0, cost.attended_tokens, cost.recall_bytes,
        cost.num_fragments, cost.num_transfers, stall_s, link_busy_s, gather_busy_s, blocks_used, hbm_bytes,
        host_bytes, cost.selected_fragments,
    )  # fmt: skip
    for append, value in zip(rec._appends, values, strict=True):  # the rows recorded one by one (column arrays)
        append(value)
