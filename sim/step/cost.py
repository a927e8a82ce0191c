"""The one record of decode steps: :class:`DecodeRun`, k ≥ 1 consecutive decode steps of one batch over a step axis
(a single step is a run of one). The policy fills its costs (``Policy.step_costs``), the replica its block growth
(sim/serving/decode_run.py), the layer pipeline its times (``StepDevices.time_run``, sim/step/timing.py), and the
replica applies and records it (``Replica._apply_run``, ``Recorder.record_decode_run``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sim.step.recall import RecallRun


@dataclass(slots=True)
class DecodeRun:
    """k ≥ 1 decode steps of one batch (its membership fixed): what they cost, the blocks they grow by, and, once
    timed, when each ends. Arrays are indexed by step; of the k steps costed the first :attr:`steps` are taken.

    Costs (the policy's):
        group_layer_s: float64 [k, G] GPU seconds of one layer of each micro-batch group.
        compute_s: float64 [k, L·G] GPU seconds per work item (layer-major, group-minor) where a step's items differ
            (recall inline on the computing thread, eager launches, GPU gather kernels taking SM time); None:
            ``group_layer_s`` at every layer.
        head_s: LM head and sampling (seconds; the batch does not change). d2h_bytes: offload writes (eager per-token
            backups) queued on the D2H queue at each step's start.
        num_layers: L. attended_tokens: int64 [k] KV tokens read per layer, summed over the batch.
        layer_bytes, layer_fragments: int64 [k, L] recall per layer; recall_bytes, num_fragments, num_transfers,
            selected_fragments: int64 [k]. All None for a recall-free run (no offloaded request: nothing recalled,
            nothing drawn, timed without the pipeline).
        jobs: the interruptible pipeline's (prefetch, correction) jobs, float64 [k, L·G, 4] each (bytes, link-held
            seconds, copy seconds, gather seconds per item), with ``lookahead_items`` and ``chunk_bytes``.
        sequential: the sequential pipeline's (link seconds, host gather seconds) of group 0, float64 [k, L] each.
        recall: the recall model's draws and state after each step (:meth:`commit`), None: nothing drawn.
    Blocks (the replica's, sim/serving/decode_run.py ``grown_blocks``):
        ctx, held: int64 [k, n] KV tokens attended and device blocks held at each step; allocated: int64 [k] blocks
            allocated since the run began, after each step.
    Times (``StepDevices.time_run``):
        steps: the steps taken (≤ k). times_s: float64 [k + 1] step boundaries (step i from times_s[i] to
            times_s[i + 1]); step_s: float64 [k] each step's clock advance; stall_s, link_busy_s, gather_busy_s:
            float64 [k] (None: timed recall-free); item_stall_s: float64 [k, L·G] stall before each work item;
            queues_s: float64 [k, 3] the H2D queue's end, the D2H queue's end and D2H seconds queued after each
            step; intervals: the recorded step's (kind, item, start_s, end_s, preempted) tuples, or None.
    """

    group_layer_s: np.ndarray
    compute_s: np.ndarray | None
    head_s: float
    d2h_bytes: int
    num_layers: int
    attended_tokens: np.ndarray
    layer_bytes: np.ndarray | None = None
    layer_fragments: np.ndarray | None = None
    recall_bytes: np.ndarray | None = None
    num_fragments: np.ndarray | None = None
    num_transfers: np.ndarray | None = None
    selected_fragments: np.ndarray | None = None
    lookahead_items: int = 1
    chunk_bytes: int = 1
    recall: RecallRun | None = None
    jobs: tuple[np.ndarray, np.ndarray] | None = None
    sequential: tuple[np.ndarray, np.ndarray] | None = None
    ctx: np.ndarray | None = None
    held: np.ndarray | None = None
    allocated: np.ndarray | None = None
    steps: int = 0
    times_s: np.ndarray | None = None
    step_s: np.ndarray | None = None
    stall_s: np.ndarray | None = None
    link_busy_s: np.ndarray | None = None
    gather_busy_s: np.ndarray | None = None
    item_stall_s: np.ndarray | None = None
    queues_s: np.ndarray | None = None
    intervals: list[tuple] | None = None

    def commit(self, recall_state: np.ndarray | None, offloaded: np.ndarray, devices) -> None:
        """What the steps taken leave behind outside the batch's rows: the recall draws they used consumed, the
        offloaded requests' recall state after them written into their rows of ``recall_state`` (float [n, width], in
        place; None when none is kept), and the devices' queues (sim/step/timing.py ``StepDevices``) as the timing left
        them after the last step."""
        if self.queues_s is not None:
            devices.link_free_s, devices.d2h_free_s, devices.d2h_busy_s = self.queues_s[self.steps - 1].tolist()
        recall, steps = self.recall, self.steps
        if recall is None:
            return
        for stream, used in recall.used:  # (per step, or the draws taken by the end of each step)
            stream.consume(used * steps if isinstance(used, int) else int(used[steps - 1]))
        if recall.state is not None and recall_state is not None:
            factors, drift, left = recall.state
            L = recall_state.shape[1] - 2
            rows = recall_state[offloaded]
            if factors is not None:
                rows[:, :L] = factors
            rows[:, L] = drift[steps - 1]
            rows[:, L + 1] = left[steps - 1]
            recall_state[offloaded] = rows
