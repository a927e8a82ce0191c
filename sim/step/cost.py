"""What one decode step costs before the layer pipeline turns it into time (a policy's answer, the step
package's input)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sim.step.recall import RecallRun


@dataclass(slots=True)
class InterruptJobs:
    """Recall jobs of an interruptibly scheduled step, per GPU work item (sim/step/pipeline.py)."""

    prefetch: np.ndarray  # float64 [items, 4]: bytes, link-held seconds, copy seconds, gather seconds per item
    correction: np.ndarray  # float64 [items, 4], the urgent part
    lookahead_items: int
    chunk_bytes: int


@dataclass(slots=True)
class StepCost:
    """What one decode step costs, before the layer pipeline turns it into time."""

    compute_s: list[float]  # per layer, GPU time
    recall_s: list[float] | None  # per layer, H2D link time (copy or GPU gather kernel); None: no recall
    gather_s: list[float] | None  # per layer, host gather time (gather-scatter), or None
    head_s: float  # LM head + sampling after the last layer
    recall_bytes: int  # H2D bytes of the whole step
    num_fragments: int  # recalled fragments of the whole step
    num_transfers: int  # H2D copies of the whole step
    attended_tokens: int  # KV tokens read per layer, summed over the batch
    layer_bytes: np.ndarray | None = None  # int64 [num_layers] recall bytes per layer
    layer_fragments: np.ndarray | None = None  # int64 [num_layers]
    interrupt: InterruptJobs | None = None  # set when the step is scheduled interruptibly
    selected_fragments: int = 0  # fragments the recall selected (recalled / selected = the step's miss fraction)
    d2h_bytes: int = 0  # offload writes (eager per-token backups) queued on the D2H link at step start


@dataclass(slots=True)
class StepCosts:
    """What k consecutive decode steps of one batch cost (an offload policy's ``step_costs``; one step is k = 1),
    arrays indexed by step; :meth:`at` is one step's :class:`StepCost`."""

    group_layer_s: np.ndarray  # float64 [k, G] GPU seconds of one layer of each micro-batch group
    # float64 [k, L·G] GPU seconds per work item (layer-major, group-minor) where items of a step differ (recall
    # inline on the computing thread, or GPU gather kernels taking SM time); None: group_layer_s at every layer
    compute_s: np.ndarray | None
    head_s: float  # LM head + sampling (the batch does not change)
    d2h_bytes: int  # offload writes queued at each step's start
    attended_tokens: np.ndarray  # int64 [k] KV tokens read per layer, summed over the batch
    layer_bytes: np.ndarray  # int64 [k, L] recall bytes per layer
    layer_fragments: np.ndarray  # int64 [k, L]
    recall_bytes: np.ndarray  # int64 [k]
    num_fragments: np.ndarray  # int64 [k]
    num_transfers: np.ndarray  # int64 [k]
    selected_fragments: np.ndarray  # int64 [k]
    lookahead_items: int
    chunk_bytes: int
    recall: RecallRun | None  # None: no offloaded request (nothing drawn)
    # interruptible scheduling: (prefetch, correction) jobs, float64 [k, L·G, 4] each (InterruptJobs's columns)
    jobs: tuple[np.ndarray, np.ndarray] | None = None
    # sequential scheduling: (link seconds, host gather seconds) of group 0, float64 [k, L] each (gather zeros
    # unless ``host_gather``)
    sequential: tuple[np.ndarray, np.ndarray] | None = None
    host_gather: bool = False  # sequential gather-scatter: the step's host gather times are charged

    @property
    def layer_s(self) -> np.ndarray:
        """float64 [k]: seconds of each layer of group 0 (every layer of a one-group step where ``compute_s`` is
        None)."""
        return self.group_layer_s[:, 0]

    @property
    def has_recall(self) -> np.ndarray:
        """bool [k]: the step recalls something (else it is timed as a plain compute step)."""
        return self.recall_bytes > 0

    def commit(self, steps: int, recall_state: np.ndarray | None, offloaded: np.ndarray) -> None:
        """Consume the recall draws of the first ``steps`` steps and write the offloaded requests' recall state
        after them into their rows of ``recall_state`` (float [n, width], in place; None when none is kept)."""
        if self.recall is None:
            return
        state = recall_state[offloaded] if self.recall.state is not None and recall_state is not None else None
        self.recall.commit(steps, state)
        if state is not None:
            recall_state[offloaded] = state

    def at(self, t: int) -> StepCost:
        """Step t's cost, as the layer pipeline (sim/step/timing.py) takes it."""
        num_layers = self.layer_bytes.shape[1]
        if self.compute_s is not None:
            compute = self.compute_s[t].tolist()
        else:  # every layer alike: the groups' times, layer after layer
            compute = self.group_layer_s[t].tolist() * num_layers
        cost = StepCost(
            compute, None, None, self.head_s, 0, 0, 0, int(self.attended_tokens[t]),
            selected_fragments=int(self.selected_fragments[t]), d2h_bytes=self.d2h_bytes,
        )  # fmt: skip
        if not self.recall_bytes[t]:
            return cost
        cost.recall_bytes, cost.num_fragments = int(self.recall_bytes[t]), int(self.num_fragments[t])
        cost.num_transfers = int(self.num_transfers[t])
        cost.layer_bytes, cost.layer_fragments = self.layer_bytes[t], self.layer_fragments[t]
        if self.jobs is not None:
            cost.interrupt = InterruptJobs(self.jobs[0][t], self.jobs[1][t], self.lookahead_items, self.chunk_bytes)
        elif self.sequential is not None:
            cost.recall_s = self.sequential[0][t].tolist()
            cost.gather_s = self.sequential[1][t].tolist() if self.host_gather else None
        return cost
