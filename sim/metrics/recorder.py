"""Append-only records of one policy's run (SimPy monitoring style: values into columns, tables at the end).

The replica hands the recorder each prefill forward (:meth:`Recorder.record_prefill`) and each run of decode steps
(:meth:`Recorder.record_decode_run`: k ≥ 1 steps over a step axis, sim/step/cost.py ``DecodeRun``; a single step is
a run of one), with the recalling steps' per-layer recall and stall and the intervals of one chosen recalling step
(``run.timeline_step``); requests are appended when done.

Step rows are stored in step order as one typed ``array.array`` per column (8 bytes a value; a run's k rows
appended per column at once), turned into numpy columns by :meth:`Recorder.step_columns`; no per-row Python
object is kept. What the summary needs of the steps (:class:`StepTotals`) is kept for every run; with
``keep_steps=False`` (``run.tables: summary``) it is all that is kept: no step rows, per-layer records or timeline.
With a finite ``sample_s`` (a fleet's, issue 49) :attr:`Recorder.samples` keeps whatever ``keep_steps`` says at
most one decode and one prefill step row a ``sample_s`` seconds: a coarse series.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field, fields

import numpy as np

# Step-table columns after ``step_id`` (implicit: 0, 1, ...) with their array typecodes: q = int64, d = float64,
# b = int8 (phase: 1 decode, 0 prefill). Order = sim.metrics.tables.STEP_COLUMNS[1:].
STEP_TYPECODES = {
    "phase": "b", "start_s": "d", "duration_s": "d", "batch_size": "q", "num_offloaded": "q", "prefill_tokens": "q",
    "attended_tokens": "q", "recall_bytes": "q", "num_fragments": "q", "num_transfers": "q", "stall_s": "d",
    "link_busy_s": "d", "gather_busy_s": "d", "kv_used_blocks": "q", "hbm_used_bytes": "q", "host_used_bytes": "q",
    "selected_fragments": "q",
}  # fmt: skip
NUMPY_DTYPES = {"q": np.int64, "d": np.float64, "b": np.int8}  # numpy dtype of each array typecode
# The step columns of a run's recall (``DecodeRun`` arrays, [k] each; all zero for a run that recalled nothing).
RECALL_COLUMNS = (
    "recall_bytes", "num_fragments", "num_transfers", "selected_fragments", "stall_s", "link_busy_s", "gather_busy_s",
)  # fmt: skip


@dataclass
class StepTotals:
    """What :func:`sim.metrics.tables.summarize` needs of the step table, kept as the steps are recorded: counts,
    integer sums and the peak, and three float sums (decode time, prefill time, decode stall) added one step after
    another in step order (``np.cumsum`` is that sequential sum), so a run of k steps adds what k single steps add,
    bit for bit, in constant memory (64 replicas × 1M requests of Mooncake lengths record ~2·10⁸ decode steps)."""

    num_steps: int = 0
    decode_steps: int = 0
    decode_recall_bytes: int = 0
    decode_fragments: int = 0
    decode_selected_fragments: int = 0
    decode_batch_sum: int = 0
    peak_kv_used_blocks: int = 0  # over every step, prefill included
    decode_time_s: float = 0.0
    decode_stall_s: float = 0.0
    prefill_time_s: float = 0.0

    def merged(self, other: StepTotals) -> StepTotals:
        """Totals over two recorders (a cluster's replicas, ``self``'s first): sums, and the larger peak."""
        out = StepTotals(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})
        out.peak_kv_used_blocks = max(self.peak_kv_used_blocks, other.peak_kv_used_blocks)
        return out


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
    d2h_free_s: float = 0.0  # when the D2H queue ends: its queued work may run on past the end of the run
    decode_tokens: int = 0
    num_preemptions: int = 0
    layer_bytes: np.ndarray = None  # int64 [num_layers]
    layer_fragments: np.ndarray = None
    layer_stall_s: np.ndarray = None  # float [num_layers]
    binned_bytes: dict[int, np.ndarray] = field(default_factory=dict)  # bin → float64 [num_layers] bytes
    timeline: list[tuple] = field(default_factory=list)  # one decode step's intervals
    recall_steps: int = 0  # decode steps that recalled so far
    sample_s: float = math.inf  # seconds between :attr:`samples` (inf: none kept)
    samples: list[tuple] = field(default_factory=list)  # (start_s, phase, batch, offloaded, blocks, HBM bytes) rows

    def __post_init__(self) -> None:
        self._due_s = [0.0 if self.sample_s < math.inf else math.inf] * 2  # next [prefill, decode] sample from (s)
        self.layer_bytes = np.zeros(self.num_layers, dtype=np.int64)
        self.layer_fragments = np.zeros(self.num_layers, dtype=np.int64)
        self.layer_stall_s = np.zeros(self.num_layers)
        self._columns = {name: array(code) for name, code in STEP_TYPECODES.items()}
        self._appends = tuple(a.append for a in self._columns.values())

    def step_columns(self) -> dict[str, np.ndarray]:
        """The step rows as numpy arrays (copies: the stored columns keep growing), ``step_id`` first.

        Raises:
            ValueError: the recorder keeps no step rows (``keep_steps=False``).
        """
        if not self.keep_steps:
            raise ValueError("this recorder keeps no step rows (run.tables: summary)")
        out = {"step_id": np.arange(self.totals.num_steps, dtype=np.int64)}
        for name, column in self._columns.items():
            out[name] = np.frombuffer(column, dtype=NUMPY_DTYPES[column.typecode]).copy()
        return out

    def _bin_bytes(self, time_s: float, nbytes: np.ndarray, end_s: float) -> None:
        """Spread one step's per-layer bytes (int64 [num_layers]) over the time bins it spans, in proportion to its
        overlap with each, so a bin never books more than the link moved in it (an instant, ``end_s == time_s``,
        books into its one bin)."""
        bin_s = self.layer_bin_s
        end_s = max(end_s, time_s)
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

    def _sample(self, times_s: list, k: int, phase: int, batch: int, offloaded: int, blocks: list, hbm: list) -> None:
        """Append to :attr:`samples` the due rows among ``k`` steps starting at ``times_s[:k]`` (s, ascending): the
        first step starting at or after its phase's due time, which then moves ``sample_s`` past its start (so a run
        of k steps samples what k single steps would). A row: (start_s [s], phase (1 decode, 0 prefill), batch size,
        offloaded requests, device KV blocks and HBM bytes used after the step: ``blocks``, ``hbm`` [k])."""
        while times_s[k - 1] >= self._due_s[phase]:
            i = bisect_left(times_s, self._due_s[phase], 0, k - 1)
            self.samples.append((times_s[i], phase, batch, offloaded, blocks[i], hbm[i]))
            self._due_s[phase] = times_s[i] + self.sample_s

    @property
    def next_step_id(self) -> int:
        """Id the next recorded step gets (steps are numbered in recording order from 0)."""
        return self.totals.num_steps

    def record_decode_run(
        self,
        run,
        times_s: list[float],
        steps_s: list[float],
        batch_size: int,
        num_offloaded: int,
        blocks_used: list[int],
        hbm_bytes: list[int],
        host_bytes: int,
    ) -> None:
        """Record the k = ``run.steps`` ≥ 1 decode steps taken of ``run`` (sim/step/cost.py ``DecodeRun``; a single step
        is a run of one): :attr:`totals`, the link and gather busy totals, the steps that recalled through the layer
        pipeline (:attr:`recall_steps`, their per-layer recall and stall, spread over the time bins they span), the
        timeline of a step that recorded its intervals, the step rows and the due :attr:`samples` (kept always).
        Every float total adds the steps' values one after another, as the steps ran (``np.cumsum`` along the steps
        is that sequential sum, in one call).

        Args:
            run: the steps: ``attended_tokens``, the recall columns (:data:`RECALL_COLUMNS`; None: recalled nothing),
                ``layer_bytes``/``layer_fragments``/``item_stall_s`` of the steps that recalled, ``intervals``.
            times_s: [k + 1] step boundaries; steps_s: [k] each step's length (seconds).
            blocks_used, hbm_bytes: [k] device blocks and HBM bytes used after each step (blocks used never fall
                within a run: blocks held only grow); host_bytes: host DRAM bytes used (unchanged over the run).

        Raises:
            TypeError: a count is not an integer (the int64 columns refuse floats rather than truncate them).
        """
        k = run.steps
        t = self.totals
        step_id = t.num_steps
        t.num_steps += k
        t.decode_steps += k
        recall = None  # the recall columns as lists of k values
        if run.recall_bytes is not None:
            recall = []
            for name in RECALL_COLUMNS:
                recall.append(getattr(run, name)[:k].tolist())
        if k == 1:  # (one step: the sums below of one value)
            t.decode_time_s += steps_s[0]
            if recall is not None:
                t.decode_stall_s += recall[4][0]
                self.link_busy_s += recall[5][0]
                self.gather_busy_s += recall[6][0]
        else:
            t.decode_time_s = float(np.cumsum([t.decode_time_s, *steps_s])[-1])
            if recall is not None:
                t.decode_stall_s = float(np.cumsum([t.decode_stall_s, *recall[4]])[-1])
                self.link_busy_s = float(np.cumsum([self.link_busy_s, *recall[5]])[-1])
                self.gather_busy_s = float(np.cumsum([self.gather_busy_s, *recall[6]])[-1])
        if recall is not None:
            t.decode_recall_bytes += sum(recall[0])
            t.decode_fragments += sum(recall[1])
            t.decode_selected_fragments += sum(recall[3])
        t.decode_batch_sum += batch_size * k
        t.peak_kv_used_blocks = max(t.peak_kv_used_blocks, blocks_used[-1])
        steps = None  # the steps that recalled through the layer pipeline (timed by it: stall, per-layer records)
        if recall is not None and (run.jobs is not None or run.sequential is not None):
            steps = np.flatnonzero(run.recall_bytes[:k]) if k > 1 else (None if not recall[0][0] else [0])
            self.recall_steps += 0 if steps is None else len(steps)
        if times_s[k - 1] >= self._due_s[1]:
            self._sample(times_s, k, 1, batch_size, num_offloaded, blocks_used, hbm_bytes)
        if not self.keep_steps:
            return
        if steps is not None and len(steps):  # per-layer recall and stall, in step order
            nbytes, frags, stall = run.layer_bytes[steps], run.layer_fragments[steps], run.item_stall_s[steps]
            groups = run.group_layer_s.shape[1]
            if groups > 1:
                stall = stall.reshape(len(steps), self.num_layers, groups).sum(axis=2)
            if run.intervals:
                self.set_timeline(step_id + int(steps[0]), groups, run.intervals)
            bin_s = self.layer_bin_s
            if len(steps) == 1:
                self.layer_bytes += nbytes[0]
                self.layer_fragments += frags[0]
                self.layer_stall_s += stall[0]
                start_s, end_s = times_s[steps[0]], times_s[steps[0] + 1]
                if int(start_s // bin_s) == int(max(end_s, start_s) // bin_s):  # in one bin (the usual case)
                    acc = self.binned_bytes.setdefault(int(start_s // bin_s), np.zeros(self.num_layers))
                    acc += nbytes[0] * 1.0
                else:
                    self._bin_bytes(start_s, nbytes[0], end_s)
            else:
                self.layer_bytes += nbytes.sum(axis=0)
                self.layer_fragments += frags.sum(axis=0)
                self.layer_stall_s = np.cumsum(np.vstack((self.layer_stall_s, stall)), axis=0)[-1]
                starts_s, ends_s = [times_s[i] for i in steps], [times_s[i + 1] for i in steps]
                first, last = int(starts_s[0] // bin_s), int(max(ends_s[-1], starts_s[-1]) // bin_s)
                if first == last:  # every step in one bin (the usual case): share 1 each, added step after step
                    acc = self.binned_bytes.setdefault(first, np.zeros(self.num_layers))
                    self.binned_bytes[first] = np.cumsum(np.vstack((acc, nbytes * 1.0)), axis=0)[-1]
                else:
                    for i in range(len(steps)):
                        self._bin_bytes(starts_s[i], nbytes[i], ends_s[i])
        c = self._columns
        zeros = bytes(8 * k)  # k zeros of an 8-byte column: 0 and 0.0 are eight zero bytes
        c["phase"].frombytes(b"\x01" * k)
        c["start_s"].fromlist(times_s[:-1])
        c["duration_s"].fromlist(steps_s)
        c["batch_size"].fromlist([batch_size] * k)
        c["num_offloaded"].fromlist([num_offloaded] * k)
        c["prefill_tokens"].frombytes(zeros)
        c["attended_tokens"].fromlist(run.attended_tokens[:k].tolist())
        c["kv_used_blocks"].fromlist(blocks_used)
        c["hbm_used_bytes"].fromlist(hbm_bytes)
        c["host_used_bytes"].fromlist([host_bytes] * k)
        for i, name in enumerate(RECALL_COLUMNS):
            if recall is None:
                c[name].frombytes(zeros)
            else:
                c[name].fromlist(recall[i])

    def record_prefill(
        self, start_s: float, end_s: float, batch_size: int, num_offloaded: int, prefill_tokens: int,
        kv_state: tuple[int, int, int],
    ) -> None:  # fmt: skip
        """Append one prefill forward's row of the step table (``sim.metrics.tables.STEP_COLUMNS``; its decode and
        recall columns are 0) and update :attr:`totals` and :attr:`samples`. Decode steps: :meth:`record_decode_run`.

        Args:
            kv_state: (device blocks used, HBM bytes used, host bytes used) after the forward.

        Raises:
            TypeError: a count is not an integer (the int64 columns refuse floats rather than truncate them).
        """
        blocks_used, hbm_bytes, host_bytes = kv_state
        duration_s = end_s - start_s
        t = self.totals
        t.num_steps += 1
        t.prefill_time_s += duration_s
        if blocks_used > t.peak_kv_used_blocks:
            t.peak_kv_used_blocks = blocks_used
        if start_s >= self._due_s[0]:
            self._sample([start_s], 1, 0, batch_size, num_offloaded, [blocks_used], [hbm_bytes])
        if not self.keep_steps:
            return
        (
            a_phase, a_start, a_duration, a_batch, a_offloaded, a_prefill, a_attended, a_recall, a_fragments,
            a_transfers, a_stall, a_link, a_gather, a_blocks, a_hbm, a_host, a_selected,
        ) = self._appends  # fmt: skip
        a_phase(0)
        a_start(start_s)
        a_duration(duration_s)
        a_batch(batch_size)
        a_offloaded(num_offloaded)
        a_prefill(prefill_tokens)
        for zero in (a_attended, a_recall, a_fragments, a_transfers, a_selected):
            zero(0)
        for zero in (a_stall, a_link, a_gather):
            zero(0.0)
        a_blocks(blocks_used)
        a_hbm(hbm_bytes)
        a_host(host_bytes)
