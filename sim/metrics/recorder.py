"""Append-only records of one policy's run (SimPy monitoring style: tuples into lists, tables at the end).

The replica hands the recorder each prefill forward and decode step (:meth:`Recorder.record_step`), each
recalling step's per-layer recall and stall (:meth:`Recorder.add_layers`) and the intervals of one chosen
recalling step (``run.timeline_step``; :meth:`Recorder.timeline_buffer`); requests are appended when done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.step.cost import StepCost


@dataclass
class Recorder:
    """Append-only records of one policy's run; turned into tables once, at the end.

    Per-layer recall is kept two ways: totals over the run (``layers.csv``) and per time bin of
    ``layer_bin_s`` seconds (``layer_recall.csv``, the layer × time heatmap).
    """

    num_layers: int
    layer_bin_s: float = 10.0
    timeline_step: int = 200  # keep the intervals of this recalling decode step (else of the first)
    steps: list[tuple] = field(default_factory=list)
    requests: list = field(default_factory=list)  # sim.serving.request.Request objects, finished or rejected
    link_busy_s: float = 0.0  # H2D copy time (or GPU gather kernel time), never host gather
    gather_busy_s: float = 0.0  # host-gather time of recalls
    d2h_busy_s: float = 0.0  # D2H offload-write time queued (eager backups, offloaded prompts)
    decode_tokens: int = 0
    num_preemptions: int = 0
    layer_bytes: np.ndarray = None  # int64 [num_layers]
    layer_fragments: np.ndarray = None
    layer_stall_s: np.ndarray = None  # float [num_layers]
    binned_bytes: dict[int, np.ndarray] = field(default_factory=dict)  # bin → float64 [num_layers] bytes
    timeline: list[tuple] = field(default_factory=list)  # one decode step's intervals
    recall_steps: int = 0  # decode steps that recalled so far

    def __post_init__(self) -> None:
        self.layer_bytes = np.zeros(self.num_layers, dtype=np.int64)
        self.layer_fragments = np.zeros(self.num_layers, dtype=np.int64)
        self.layer_stall_s = np.zeros(self.num_layers)

    def add_layers(
        self, time_s: float, nbytes: np.ndarray, fragments: np.ndarray, stall_s: list[float], end_s: float | None = None
    ) -> None:
        """Accumulate one step's per-layer recall (int64 [num_layers] each) and stall.

        The step ran from ``time_s`` to ``end_s`` (None: an instant); its bytes are spread over the time bins
        it spans in proportion to its overlap with each, so a bin never books more than the link moved in it.
        """
        self.layer_bytes += nbytes
        self.layer_fragments += fragments
        self.layer_stall_s += stall_s
        bin_s = self.layer_bin_s
        end_s = time_s if end_s is None else max(end_s, time_s)
        first, last = int(time_s // bin_s), int(end_s // bin_s)
        if end_s > time_s and last > first and end_s == last * bin_s:
            last -= 1  # ends exactly on a bin edge: nothing in the next bin
        for key in range(first, last + 1):
            overlap_s = min(end_s, (key + 1) * bin_s) - max(time_s, key * bin_s)
            share = 1.0 if first == last else overlap_s / (end_s - time_s)
            acc = self.binned_bytes.setdefault(key, np.zeros(self.num_layers))
            acc += nbytes * share

    def set_timeline(self, step_id: int, groups: int, intervals: list[tuple]) -> None:
        """Keep one step's ``(kind, item, start_s, end_s, preempted)`` intervals (item = layer·groups + group)."""
        self.timeline = [(step_id, item // groups, item % groups, kind, a, b, p) for kind, item, a, b, p in intervals]

    @property
    def next_step_id(self) -> int:
        """Id the next recorded step gets (steps are numbered in recording order from 0)."""
        return len(self.steps)

    def timeline_buffer(self) -> list[tuple] | None:
        """Called once per recalling decode step: a list to collect its intervals if it is the step the timeline
        keeps (the first, then the ``timeline_step``-th), else None."""
        self.recall_steps += 1
        return [] if self.recall_steps in (1, self.timeline_step) else None

    def record_step(
        self,
        phase: str,
        start_s: float,
        end_s: float,
        batch_size: int,
        num_offloaded: int,
        prefill_tokens: int,
        cost: StepCost | None,
        stall_s: float,
        link_busy_s: float,
        kv_state: tuple[int, int, int],
        gather_busy_s: float = 0.0,
    ) -> None:
        """Append one row of the step table (``sim.metrics.tables.STEP_COLUMNS``).

        Args:
            phase: ``"prefill"`` or ``"decode"``.
            cost: the decode step's cost (attended tokens, recall bytes, fragments, transfers), None for prefill.
            kv_state: (device blocks used, HBM bytes used, host bytes used) after the step.
            gather_busy_s: host-gather seconds of the step's recalls.
        """
        attended = recall_bytes = fragments = transfers = selected = 0
        if cost is not None:
            attended, recall_bytes = cost.attended_tokens, cost.recall_bytes
            fragments, transfers, selected = cost.num_fragments, cost.num_transfers, cost.selected_fragments
        blocks_used, hbm_bytes, host_bytes = kv_state
        self.steps.append(
            (
                len(self.steps), phase, start_s, end_s - start_s, batch_size, num_offloaded, prefill_tokens,
                attended, recall_bytes, fragments, transfers, stall_s, link_busy_s, gather_busy_s, blocks_used,
                hbm_bytes, host_bytes, selected,
            )
        )  # fmt: skip
