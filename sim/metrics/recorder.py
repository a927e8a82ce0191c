"""Append-only records of one policy's run (SimPy monitoring style: values into columns, tables at the end).

The replica hands the recorder each prefill forward and decode step (:meth:`Recorder.record_step`), each
recalling step's per-layer recall and stall (:meth:`Recorder.add_layers`) and the intervals of one chosen
recalling step (``run.timeline_step``; :meth:`Recorder.timeline_buffer`); requests are appended when done.

Step rows are stored as one typed ``array.array`` per column (8 bytes a value, one C append each); a skip-ahead
run's rows as the arrays it computed (one :class:`RunRows` per run); both are merged in step order into numpy
columns every ``RUNS_PER_CHUNK`` runs and by :meth:`Recorder.step_columns`; no per-row Python object is kept. What
the summary needs of the steps (:class:`StepTotals`) is kept for every run; with ``keep_steps=False``
(``run.tables: summary``) it is all that is kept: no step rows, per-layer records or timeline.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np

from sim.step.cost import StepCost

# Step-table columns after ``step_id`` (implicit: 0, 1, ...) with their array typecodes: q = int64, d = float64,
# b = int8 (phase: 1 decode, 0 prefill). Order = sim.metrics.tables.STEP_COLUMNS[1:].
STEP_TYPECODES = {
    "phase": "b", "start_s": "d", "duration_s": "d", "batch_size": "q", "num_offloaded": "q", "prefill_tokens": "q",
    "attended_tokens": "q", "recall_bytes": "q", "num_fragments": "q", "num_transfers": "q", "stall_s": "d",
    "link_busy_s": "d", "gather_busy_s": "d", "kv_used_blocks": "q", "hbm_used_bytes": "q", "host_used_bytes": "q",
    "selected_fragments": "q",
}  # fmt: skip
NUMPY_DTYPES = {"q": np.int64, "d": np.float64, "b": np.int8}  # numpy dtype of each array typecode
RUNS_PER_CHUNK = 2048  # skip-ahead runs whose rows are kept as given before merging them into numpy columns
# The columns a run that recalled gives (``record_decode_run``'s ``recall``: one [k] array each).
RECALL_COLUMNS = (
    "recall_bytes", "num_fragments", "num_transfers", "selected_fragments", "stall_s", "link_busy_s", "gather_busy_s",
)  # fmt: skip


class RunRows(NamedTuple):
    """One skip-ahead run's k decode-step rows as :meth:`Recorder.record_decode_run` was given them."""

    first: int  # step id of its first row
    k: int
    start_s: np.ndarray  # float64 [k]
    duration_s: np.ndarray  # float64 [k]
    batch_size: int
    attended_tokens: np.ndarray  # int64 [k]
    kv_used_blocks: np.ndarray  # int64 [k]
    hbm_used_bytes: np.ndarray  # int64 [k]
    num_offloaded: int
    host_used_bytes: int
    recall: dict[str, np.ndarray] | None  # the recall columns, int64/float64 [k] each (None: all 0)


@dataclass
class StepTotals:
    """What :func:`sim.metrics.tables.summarize` needs of the step table, kept as the steps are recorded.

    Counts, integer sums and the peak are running aggregates. The three float sums (decode time, prefill time,
    decode stall) keep their terms as compact float64 arrays (8 bytes a step) and are summed at the end with
    numpy, as pandas sums the step table's columns, so the summary is the same bit for bit either way (a
    running Python sum would differ in the last bits).
    """

    num_steps: int = 0
    decode_steps: int = 0
    decode_recall_bytes: int = 0
    decode_fragments: int = 0
    decode_selected_fragments: int = 0
    decode_batch_sum: int = 0
    peak_kv_used_blocks: int = 0  # over every step, prefill included
    decode_durations_s: array = field(default_factory=lambda: array("d"))
    decode_stalls_s: array = field(default_factory=lambda: array("d"))
    prefill_durations_s: array = field(default_factory=lambda: array("d"))

    @property
    def decode_time_s(self) -> float:
        return _sum(self.decode_durations_s)

    @property
    def prefill_time_s(self) -> float:
        return _sum(self.prefill_durations_s)

    @property
    def decode_stall_s(self) -> float:
        return _sum(self.decode_stalls_s)

    def merged(self, other: StepTotals) -> StepTotals:
        """Totals over two recorders (a cluster's replicas, ``self``'s steps first): sums, and the larger peak."""
        out = StepTotals(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})
        out.peak_kv_used_blocks = max(self.peak_kv_used_blocks, other.peak_kv_used_blocks)
        return out


def _sum(values: array) -> float:
    """numpy's (pairwise) sum of a float64 array, as pandas sums a column; 0.0 when empty."""
    return float(np.frombuffer(values, dtype=np.float64).sum()) if len(values) else 0.0


@dataclass
class Recorder:
    """Append-only records of one policy's run; turned into tables once, at the end.

    Per-layer recall is kept two ways: totals over the run (``layers.csv``) and per time bin of
    ``layer_bin_s`` seconds (``layer_recall.csv``, the layer × time heatmap). ``keep_steps=False`` keeps only
    :attr:`totals` (no step rows, per-layer records or timeline), for runs that need only the summary.
    """

    num_layers: int
    layer_bin_s: float = 10.0
    timeline_step: int = 200  # keep the intervals of this recalling decode step (else of the first)
    keep_steps: bool = True
    totals: StepTotals = field(default_factory=StepTotals)
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
        self._columns = {name: array(code) for name, code in STEP_TYPECODES.items()}
        self._appends = tuple(a.append for a in self._columns.values())
        # Skip-ahead runs' rows, kept as given: RunRows tuples (absent columns are 0). Every RUNS_PER_CHUNK runs they
        # and the rows recorded one by one since the last chunk are merged in order into numpy columns (_chunks),
        # which step_columns concatenates.
        self._runs: list[RunRows] = []
        self._chunks: list[dict[str, np.ndarray]] = []
        self._chunked_rows = 0  # rows merged into _chunks

    def step_columns(self) -> dict[str, np.ndarray]:
        """The step rows as numpy arrays (copies: the stored columns keep growing), ``step_id`` first.

        Raises:
            ValueError: the recorder keeps no step rows (``keep_steps=False``).
        """
        if not self.keep_steps:
            raise ValueError("this recorder keeps no step rows (run.tables: summary)")
        self._merge_rows()
        out = {"step_id": np.arange(self.totals.num_steps, dtype=np.int64)}
        for name, code in STEP_TYPECODES.items():
            parts = [chunk[name] for chunk in self._chunks]
            out[name] = np.concatenate(parts) if parts else np.empty(0, dtype=NUMPY_DTYPES[code])
        return out

    def _merge_rows(self) -> None:
        """Merge the rows recorded since the last chunk — one by one in the array columns, runs in :attr:`_runs` —
        in step order into one chunk of numpy columns, and empty both."""
        start, end = self._chunked_rows, self.totals.num_steps
        if end == start:
            return
        runs = self._runs
        chunk = {}
        for name, column in self._columns.items():
            dtype = NUMPY_DTYPES[column.typecode]
            chunk[name] = np.zeros(end - start, dtype=dtype)
        single = np.ones(end - start, dtype=bool)  # rows recorded one by one (record_step), in order
        if runs:
            firsts, ks, starts, durations, batch, attended, blocks, hbm, offloaded, host, recalls = zip(*runs)
            ks = np.array(ks, dtype=np.int64)
            # the runs' rows, in order: run i covers firsts[i] .. firsts[i] + ks[i] - 1
            run_rows = np.arange(int(ks.sum())) + np.repeat(np.array(firsts) - start - (np.cumsum(ks) - ks), ks)
            single[run_rows] = False
            chunk["phase"][run_rows] = 1  # decode
            for name, parts in (("start_s", starts), ("duration_s", durations), ("attended_tokens", attended),
                                ("kv_used_blocks", blocks), ("hbm_used_bytes", hbm)):  # fmt: skip
                chunk[name][run_rows] = np.concatenate(parts)
            for name, one in (("batch_size", batch), ("num_offloaded", offloaded), ("host_used_bytes", host)):
                chunk[name][run_rows] = np.repeat(np.array(one, dtype=np.int64), ks)
            recalled = np.array([r is not None for r in recalls])
            if recalled.any():  # runs that recalled: their per-step recall columns (others 0)
                rows = run_rows[np.repeat(recalled, ks)]
                for name in RECALL_COLUMNS:  # (a run that left one out raises KeyError)
                    chunk[name][rows] = np.concatenate([r[name] for r in recalls if r is not None])
        for name, column in self._columns.items():
            if len(column):
                chunk[name][single] = np.frombuffer(column, dtype=chunk[name].dtype)
                del column[:]
        self._chunks.append(chunk)
        self._runs.clear()
        self._chunked_rows = end

    def add_layers(
        self, time_s: float, nbytes: np.ndarray, fragments: np.ndarray, stall_s: list[float], end_s: float | None = None
    ) -> None:
        """Accumulate one step's per-layer recall (int64 [num_layers] each) and stall.

        The step ran from ``time_s`` to ``end_s`` (None: an instant); its bytes are spread over the time bins
        it spans in proportion to its overlap with each, so a bin never books more than the link moved in it.
        Nothing is kept with ``keep_steps=False``.
        """
        if not self.keep_steps:
            return
        self.layer_bytes += nbytes
        self.layer_fragments += fragments
        self.layer_stall_s += stall_s
        self._bin_bytes(time_s, nbytes, end_s)

    def _bin_bytes(self, time_s: float, nbytes: np.ndarray, end_s: float | None) -> None:
        """Spread one step's per-layer bytes over the time bins it spans (see :meth:`add_layers`)."""
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

    def add_layers_run(
        self, starts_s: np.ndarray, ends_s: np.ndarray, nbytes: np.ndarray, fragments: np.ndarray, stall_s: np.ndarray
    ) -> None:
        """:meth:`add_layers` of m steps in order (skip-ahead), equal to m calls: each float accumulator adds the
        steps' values one after another (``np.cumsum`` along the steps is that sequential sum).

        Args:
            starts_s, ends_s: float64 [m] each step's start and end.
            nbytes, fragments: int64 [m, num_layers]; stall_s: float64 [m, num_layers].
        """
        if not self.keep_steps or not len(starts_s):
            return
        self.layer_bytes += nbytes.sum(axis=0)
        self.layer_fragments += fragments.sum(axis=0)
        self.layer_stall_s = np.cumsum(np.vstack((self.layer_stall_s, stall_s)), axis=0)[-1]
        bin_s = self.layer_bin_s
        first, last = (starts_s // bin_s).astype(np.int64), (np.maximum(ends_s, starts_s) // bin_s).astype(np.int64)
        if (first == last).all() and first[0] == first[-1]:  # one bin (the usual case): share 1 each
            key = int(first[0])
            acc = self.binned_bytes.setdefault(key, np.zeros(self.num_layers))
            self.binned_bytes[key] = np.cumsum(np.vstack((acc, nbytes * 1.0)), axis=0)[-1]
            return
        for i in range(len(starts_s)):
            self._bin_bytes(float(starts_s[i]), nbytes[i], float(ends_s[i]))

    def set_timeline(self, step_id: int, groups: int, intervals: list[tuple]) -> None:
        """Keep one step's ``(kind, item, start_s, end_s, preempted)`` intervals (item = layer·groups + group)."""
        self.timeline = [(step_id, item // groups, item % groups, kind, a, b, p) for kind, item, a, b, p in intervals]

    @property
    def next_step_id(self) -> int:
        """Id the next recorded step gets (steps are numbered in recording order from 0)."""
        return self.totals.num_steps

    def timeline_buffer(self) -> list[tuple] | None:
        """Called once per recalling decode step: a list to collect its intervals if it is the step the timeline
        keeps (the first, then the ``timeline_step``-th), else None."""
        self.recall_steps += 1
        return [] if self.recall_steps in (1, self.timeline_step) else None

    def record_decode_run(
        self,
        times_s: np.ndarray,
        batch_size: int,
        num_offloaded: int,
        attended_tokens: np.ndarray,
        blocks_used: np.ndarray,
        hbm_bytes: np.ndarray,
        host_bytes: int,
        recall: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Append k decode steps at once (the scheduler's skip-ahead): the same rows and totals as k calls of
        :meth:`record_step`.

        Args:
            times_s: float64 [k + 1] step boundaries (step i ran from ``times_s[i]`` to ``times_s[i + 1]``).
            attended_tokens, blocks_used, hbm_bytes: int64 [k] per step (device blocks and HBM bytes after it).
            host_bytes: host DRAM bytes used (unchanged over the run).
            recall: per-step columns of steps that recall (``recall_bytes``, ``num_fragments``, ``num_transfers``,
                ``selected_fragments`` int64 [k]; ``stall_s``, ``link_busy_s``, ``gather_busy_s`` float64 [k]);
                None: they recalled nothing (all zero).
        """
        k = len(times_s) - 1
        durations_s = times_s[1:] - times_s[:-1]
        t = self.totals
        t.num_steps += k
        t.decode_steps += k
        t.decode_durations_s.frombytes(durations_s.tobytes())
        if recall is None:
            t.decode_stalls_s.frombytes(bytes(8 * k))  # no stall: 0.0 is eight zero bytes
        else:
            t.decode_stalls_s.frombytes(np.ascontiguousarray(recall["stall_s"], dtype=np.float64).tobytes())
            t.decode_recall_bytes += int(recall["recall_bytes"].sum())
            t.decode_fragments += int(recall["num_fragments"].sum())
            t.decode_selected_fragments += int(recall["selected_fragments"].sum())
        t.decode_batch_sum += batch_size * k
        t.peak_kv_used_blocks = max(t.peak_kv_used_blocks, int(blocks_used.max()))
        if not self.keep_steps:
            return
        self._runs.append(
            RunRows(
                t.num_steps - k, k, times_s[:-1], durations_s, batch_size, attended_tokens, blocks_used, hbm_bytes,
                num_offloaded, host_bytes, recall,
            )
        )  # fmt: skip
        if len(self._runs) >= RUNS_PER_CHUNK:
            self._merge_rows()

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
        """Append one row of the step table (``sim.metrics.tables.STEP_COLUMNS``) and update :attr:`totals`.

        Args:
            phase: ``"prefill"`` or ``"decode"``.
            cost: the decode step's cost (attended tokens, recall bytes, fragments, transfers), None for prefill.
            kv_state: (device blocks used, HBM bytes used, host bytes used) after the step.
            gather_busy_s: host-gather seconds of the step's recalls.

        Raises:
            TypeError: a count is not an integer (the int64 columns refuse floats rather than truncate them).
        """
        attended = recall_bytes = fragments = transfers = selected = 0
        if cost is not None:
            attended, recall_bytes = cost.attended_tokens, cost.recall_bytes
            fragments, transfers, selected = cost.num_fragments, cost.num_transfers, cost.selected_fragments
        blocks_used, hbm_bytes, host_bytes = kv_state
        duration_s = end_s - start_s
        decode = phase == "decode"
        t = self.totals
        t.num_steps += 1
        if decode:
            t.decode_steps += 1
            t.decode_durations_s.append(duration_s)
            t.decode_stalls_s.append(stall_s)
            t.decode_recall_bytes += recall_bytes
            t.decode_fragments += fragments
            t.decode_selected_fragments += selected
            t.decode_batch_sum += batch_size
        else:
            t.prefill_durations_s.append(duration_s)
        if blocks_used > t.peak_kv_used_blocks:
            t.peak_kv_used_blocks = blocks_used
        if not self.keep_steps:
            return
        (
            a_phase, a_start, a_duration, a_batch, a_offloaded, a_prefill, a_attended, a_recall, a_fragments,
            a_transfers, a_stall, a_link, a_gather, a_blocks, a_hbm, a_host, a_selected,
        ) = self._appends  # fmt: skip
        a_phase(decode)
        a_start(start_s)
        a_duration(duration_s)
        a_batch(batch_size)
        a_offloaded(num_offloaded)
        a_prefill(prefill_tokens)
        a_attended(attended)
        a_recall(recall_bytes)
        a_fragments(fragments)
        a_transfers(transfers)
        a_stall(stall_s)
        a_link(link_busy_s)
        a_gather(gather_busy_s)
        a_blocks(blocks_used)
        a_hbm(hbm_bytes)
        a_host(host_bytes)
        a_selected(selected)
