"""What one decode step costs before the layer pipeline turns it into time (a policy's answer, the step
package's input)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class InterruptPlan:
    """Recall jobs of an interruptibly scheduled step, per GPU work item (sim/step/interrupt.py)."""

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
    interrupt: InterruptPlan | None = None  # set when the step is scheduled interruptibly
    selected_fragments: int = 0  # fragments the recall selected (recalled / selected = the step's miss fraction)
    d2h_bytes: int = 0  # offload writes (eager per-token backups) queued on the D2H link at step start
