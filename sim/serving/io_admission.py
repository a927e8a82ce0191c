"""IO-adaptive offloading admission (docs/design.md mechanism 4, as we read it): the recall budget that bounds
which offloaded requests join, adapted by AIMD on the measured stall, on top of the memory-only rule of
sim/serving/admission.py (whose module docstring describes both rules)."""

from __future__ import annotations

from collections import deque

import numpy as np

from sim.serving.admission import Admission, AdmissionParams
from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request

PHI_MIN, PHI_MAX = 0.25, 3.0
PHI_DECREASE, PHI_INCREASE = 0.8, 0.05
LINK_IDLE_BUSY_FRAC = 0.8
AIMD_LOOP_STEPS = 16  # runs of fewer steps test their steps on Python floats (numpy's call cost dominates there)


class RecallBudget:
    """The IO-adaptive bound: predicted per-layer recall of the next step ≤ φ × predicted per-layer compute::

        n_warm · r_warm + (n_cold + 1) · r_cold  ≤  φ · c(batch + 1, attended + new)

    ``r_warm`` / ``r_cold`` are one request's expected per-layer link times (sim/step/recall.py
    ``expected_layer_fragments``: a cold request recalls its whole selection), ``c`` the layer compute time.
    φ = 1 + slack adapts to each decode step (AIMD): if the step's stall exceeded ``stall_target_frac`` of
    its time, φ ← 0.8·φ; if the stall stayed under half the target and the link was busy less than 80 % of
    the step, φ ← φ + 0.05. φ stays within [0.25, 3].

    Args:
        slack: initial slack (φ = 1 + slack).
        stall_target_frac: stall share of a step above which φ shrinks.
        warm_layer_s: expected per-layer link seconds of one warm offloaded request.
        cold_layer_s: the same for a request whose recall buffer is empty.
    """

    def __init__(self, slack: float, stall_target_frac: float, warm_layer_s: float, cold_layer_s: float) -> None:
        self.phi = min(PHI_MAX, max(PHI_MIN, 1.0 + slack))
        self.stall_target = stall_target_frac
        self.warm_s, self.cold_s = warm_layer_s, cold_layer_s

    def predicted_recall_s(self, num_warm: int, num_cold: int) -> float:
        """Predicted per-layer link seconds of the next step."""
        return num_warm * self.warm_s + num_cold * self.cold_s

    def allows(self, num_warm: int, num_cold: int, layer_compute_s: float) -> bool:
        """Whether one more (cold) offloaded request keeps the prediction within φ × compute."""
        return self.predicted_recall_s(num_warm, num_cold + 1) <= self.phi * layer_compute_s

    def observe(
        self, steps_s: list[float], stalls_s: list[float] | None = None, link_busy_s: list[float] | None = None
    ) -> None:
        """AIMD update of φ after each of k ≥ 1 decode steps in order, from its measured stall and link use (seconds,
        per step); None: no stall, the link idle."""
        if stalls_s is None or link_busy_s is None:
            if self.phi == PHI_MAX and self.stall_target > 0:  # steps of positive length that neither stall nor
                return  # use the link only raise φ, which is at its cap already (the usual dense run)
            stalls_s = link_busy_s = [0.0] * len(steps_s)
        k = len(steps_s)
        if len(stalls_s) != k or len(link_busy_s) != k:
            raise ValueError(f"AIMD: {k} steps, {len(stalls_s)} stalls, {len(link_busy_s)} link busy times")
        # The k steps' moves of φ in order, one per step that moves it: True shrinks, False grows (:func:`_step_moves`,
        # on Python floats for runs of fewer than AIMD_LOOP_STEPS steps, else on arrays).
        if k < AIMD_LOOP_STEPS:
            shrinks = []
            for i in range(k):
                step = (float(steps_s[i]), float(stalls_s[i]), float(link_busy_s[i]))
                shrink, grow = _step_moves(self.stall_target, *step)
                if shrink or grow:
                    shrinks.append(shrink)
        else:
            arrays = (np.asarray(x, dtype=np.float64) for x in (steps_s, stalls_s, link_busy_s))
            shrink, grow = _step_moves(self.stall_target, *arrays)
            shrinks = shrink[shrink | grow].tolist()
        self.phi = _aimd(self.phi, shrinks)


def _step_moves(
    stall_target: float, step_s: float | np.ndarray, stall_s: float | np.ndarray, link_busy_s: float | np.ndarray
) -> tuple[bool | np.ndarray, bool | np.ndarray]:
    """The AIMD tests of :class:`RecallBudget`, elementwise over floats or float64 arrays of steps (seconds): (shrink,
    grow), bool each. A step shrinks φ when its stall exceeded ``stall_target`` of its length; it grows φ when the
    stall stayed under half of that and the link was busy less than ``LINK_IDLE_BUSY_FRAC`` of it (where both hold,
    shrinking wins, :func:`_aimd`); a step of length 0 or less does neither."""
    positive = step_s > 0
    shrink = positive & (stall_s > stall_target * step_s)
    grow = positive & (stall_s < 0.5 * stall_target * step_s) & (link_busy_s < LINK_IDLE_BUSY_FRAC * step_s)
    return shrink, grow


def _aimd(phi: float, shrinks: list[bool]) -> float:
    """φ after the moves of :meth:`RecallBudget.observe` in order: ×0.8 for a shrinking step, +0.05 for a growing
    one, within [0.25, 3]. Growing steps while φ is at its cap are skipped (``min(PHI_MAX, PHI_MAX + x)`` is
    ``PHI_MAX``)."""
    pos, end = 0, len(shrinks)
    while pos < end:
        if shrinks[pos]:
            phi = max(PHI_MIN, phi * PHI_DECREASE)
            pos += 1
        elif phi == PHI_MAX:  # growing steps leave φ at its cap until the next shrinking one
            try:
                pos = shrinks.index(True, pos)
            except ValueError:  # none left
                break
        else:
            phi = min(PHI_MAX, phi + PHI_INCREASE)
            pos += 1
    return phi


class IoAdaptiveAdmission(Admission):
    """Memory-only admission plus dense-while-HBM-allows and the :class:`RecallBudget` on offloaded joins.

    Args:
        params: what it takes from the policy; ``params.io`` must be set, ``params.knobs`` an ``OffloadPolicy``.
    """

    def __init__(self, params: AdmissionParams) -> None:
        super().__init__(params)
        io, knobs = params.io, params.knobs
        self.io = io
        self.budget = RecallBudget(knobs.admission_slack, knobs.stall_target_frac, io.warm_layer_s, io.cold_layer_s)
        self.dense_headroom_frac = knobs.dense_headroom_frac
        self.last_attended = 0  # KV tokens read per layer by the last decode step

    def on_decode_run(
        self,
        steps_s: list[float],
        attended_tokens: list[int],
        stalls_s: list[float] | None = None,
        link_busy_s: list[float] | None = None,
    ) -> None:
        """:meth:`Admission.on_decode_run`, φ's AIMD update after each step, and the last step's attended tokens."""
        if not len(steps_s):
            return
        super().on_decode_run(steps_s, attended_tokens)
        self.budget.observe(steps_s, stalls_s, link_busy_s)
        self.last_attended = int(attended_tokens[-1])

    def quiet_decisions(
        self, waiting: deque[Request], batch: DecodeBatch, kv: KvState, free_blocks: np.ndarray, disaggregated: bool
    ) -> int:
        """The base rule while the head of the queue would run dense; 0 when it could run offloaded (the I/O bound
        and the dense fallback depend on measured feedback, and held-back requests let others pass)."""
        if waiting and self.offload_possible(waiting[0], kv):
            return 0
        return super().quiet_decisions(waiting, batch, kv, free_blocks, disaggregated)

    def dense_fallback(self, req: Request, kv: KvState, batch: DecodeBatch, reserved: float) -> bool:
        """Run ``req`` dense when the I/O bound holds it back, if (1) the pool keeps ``dense_headroom_frac`` free
        after its whole KV, (2) reading its context densely adds no more to a layer's time than the batch's
        requests cost on average (so throughput cannot fall), and (3) the next step stays within the TPOT SLO.

        Offloaded is the preferred mode (a long request attends its budget instead of its whole context, so its
        step is cheaper); dense is the fallback that uses spare HBM while the link is the bottleneck, never at the
        price of throughput or of the TPOT tail (so more HBM cannot make either worse).
        """
        dense_worst = self.params.device_blocks(req.total_tokens, False)
        if dense_worst + self.dense_headroom_frac * kv.device.capacity > kv.device.free - reserved:
            return False
        compute, n = self.io.compute, len(batch)
        attended = self.last_attended + req.prompt_tokens + req.generated
        layer_s = compute.decode_layer_s(n + 1, attended)
        if n and layer_s - compute.decode_layer_s(n, self.last_attended) > layer_s / (n + 1):
            return False
        if self.io.tpot_slo_s is None:
            return True
        step_s = compute.num_layers * layer_s + compute.decode_head_s(n + 1) + compute.step_overhead_s
        step_s = max(step_s, compute.overlapped_host_s(n + 1))
        return step_s <= self.io.tpot_slo_s

    def io_allows(self, kv: KvState, batch: DecodeBatch, taken_blocks: float) -> bool:
        """Predicted recall of the next step, with one more cold offloaded request, within φ × layer compute; and,
        with a shared recall cache, the offloaded requests' working sets within what the cache holds after it."""
        if kv.num_offloaded == 0:
            return True  # always let one in: with nothing offloaded there is no recall to protect
        free_after_bytes = max(kv.device.free - taken_blocks, 0) * kv.block_bytes
        if not self.io.cache_holds(kv.num_offloaded + 1, free_after_bytes):
            return False
        in_batch = np.count_nonzero(batch.offloaded)
        cold_in_batch = np.count_nonzero(batch.offloaded & batch.cold)
        waiting_prefill = kv.num_offloaded - in_batch  # admitted, still prefilling: cold when they join
        joining = waiting_prefill + 1
        attended = self.last_attended + joining * self.io.sparse_tokens
        layer_s = self.io.compute.decode_layer_s(len(batch) + joining, attended)
        return self.budget.allows(in_batch - cold_in_batch, cold_in_batch + waiting_prefill, layer_s)
