"""IO-adaptive offloading admission (DESIGN.md mechanism 4, our reading): bound recall by compute.

Each scheduler iteration, an offloaded request may join the running batch only if the predicted
per-layer recall time of every offloaded request in the next step stays within the predicted per-layer
compute time times φ = 1 + slack::

    n_warm · r_warm + (n_cold + 1) · r_cold  ≤  φ · c(batch + 1, attended + new)

``r_warm`` / ``r_cold`` are one request's expected per-layer link times (sim/recall.py
``expected_layer_fragments``: a cold request recalls its whole selection), ``c`` the roofline layer time.
Requests already running are never evicted when φ shrinks (Model assumption: admission only gates who
joins; no mid-request preemption for I/O).

φ adapts to what the last step measured (AIMD): if the step's stall exceeded ``stall_target_frac`` of
its time, φ ← 0.8·φ; if the stall stayed under half the target and the link was busy less than 80 % of
the step, φ ← φ + 0.05. φ stays within [0.25, 3].
"""

from __future__ import annotations

PHI_MIN, PHI_MAX = 0.25, 3.0
PHI_DECREASE, PHI_INCREASE = 0.8, 0.05
LINK_IDLE_BUSY_FRAC = 0.8


class IoAdmission:
    """Admission controller state for one replica.

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

    def observe(self, step_s: float, stall_s: float, link_busy_s: float) -> None:
        """AIMD update of φ from one decode step's measured stall and link use."""
        if step_s <= 0:
            return
        if stall_s > self.stall_target * step_s:
            self.phi = max(PHI_MIN, self.phi * PHI_DECREASE)
        elif stall_s < 0.5 * self.stall_target * step_s and link_busy_s < LINK_IDLE_BUSY_FRAC * step_s:
            self.phi = min(PHI_MAX, self.phi + PHI_INCREASE)
