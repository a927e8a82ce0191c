"""Admission: which queued requests join the running batch, dense or offloaded (SGLang ``PrefillAdder`` rules,
plus docs/design.md §5 mechanism 4, IO-adaptive offloading admission, as we read it; the rules: docs/design.md §10).

Admission takes plain parameters from the policy (:class:`AdmissionParams`; it imports nothing from sim/policies);
sim/serving/policy_admission.py builds them, and the admission a policy's replica asks, from the policy.
The replica asks it, at each scheduler iteration, to walk the waiting queue (:meth:`Admission.select`) and reports
each decode step (:meth:`Admission.on_decode_run`; a single step is a run of one) and preemption. Each rule is one
predicate over plain numbers, asked about the decision now (``select``) or about the next m decisions at once (the
skip-ahead run's bound, :meth:`Admission.quiet_decisions`). Rules:

* :class:`Admission` (``admission: static``, and every dense policy): FCFS memory rule, :func:`memory_waits`
  (future-token reservation with the decaying ``new_token_ratio``, as SGLang's scheduler, docs/sources.md; host
  DRAM and ``max_offloaded_requests`` for offloaded requests). The walk stops at the first request that must wait.
* SGLang's disaggregated decode budget (``decode_scheduler: sglang_pd``): sim/serving/decode_admission.py.
* :class:`~sim.serving.io_admission.IoAdaptiveAdmission` (``admission: io_adaptive``): the recall budget φ
  (``RecallBudget``, AIMD on the measured stall), the shared recall cache's room (else SparseServe's
  over-admission collapse), the dense fallback and the ``BYPASS_SCAN`` look past a held-back head.

Model assumption: admission only gates who joins; running requests are never evicted when φ shrinks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.config import DensePolicy
from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request

if TYPE_CHECKING:
    from sim.step.compute import ComputeModel

BYPASS_SCAN = 32  # queued requests scanned past an offloaded head that the I/O admission holds back

OK, WAIT, WAIT_IO = "ok", "wait", "wait_io"  # verdicts; any other verdict is the reason a request never runs


@dataclass(frozen=True, slots=True)
class IoBoundParams:
    """What IO-adaptive admission takes from an offload policy, besides :class:`AdmissionParams`."""

    warm_layer_s: float  # expected per-layer I/O-path seconds of one warm offloaded request (RecallBudget)
    cold_layer_s: float  # the same for a request whose recall buffer is empty (it recalls its whole selection)
    sparse_tokens: int  # KV tokens an offloaded request attends per layer (sink + recent + budget)
    tpot_slo_s: float | None  # per-request TPOT bound, if any
    compute: ComputeModel  # one GPU's layer, head and overhead seconds of a decode step (sim/step/compute.py)
    # whether a shared recall cache holds the working sets of this many offloaded requests with this many bytes of
    # the KV pool free (always, for a policy without one)
    cache_holds: Callable[[int, float], bool]


@dataclass(frozen=True, slots=True)
class AdmissionParams:
    """What admission takes from the policy (built by sim/serving/policy_admission.py ``admission_params``): the
    policy section's knobs and the policy's block accounting, as plain values and functions."""

    knobs: DensePolicy  # the policy section (sim/config/policy.py): batch cap, new_token_ratio, clip, PD reserve, ...
    max_offloaded: int  # most requests offloaded at once (0: the policy offloads none)
    kv_bytes_per_token: int  # one GPU's KV bytes per token (an offloaded request's host DRAM per token)
    max_seq_len: int  # the model's context limit, tokens
    # The policy's block rule (sim/policies/ ``device_blocks``; growth: its ``held=False``), one definition for one
    # request (int tokens, bool offloaded → int) and elementwise (int64 [..., n], bool [n] → int64 [..., n]): device
    # blocks a request holds with this many KV tokens, and device blocks this many more tokens need.
    device_blocks: Callable
    growth_blocks: Callable
    wants_offload: Callable[[int], bool]  # whether a request with this many prompt tokens runs offloaded
    io: IoBoundParams | None = None  # IO-adaptive admission's inputs (``admission: io_adaptive``)


def memory_waits(need, growth, worst, cached_blocks, room, reserved, ratio) -> bool | np.ndarray:
    """The memory rule (SGLang ``PrefillAdder``): whether a request waits for device blocks, i.e. whether the blocks
    it takes (``need``) plus its future tokens' reservation (``growth`` × ``ratio``), at most ``worst``, less the
    blocks its cached prefix holds, exceed the room left after the running batch's reservation::

        min(need + growth · ratio, worst) − cached_blocks  >  room − reserved

    ``need``, ``growth``, ``worst``, ``cached_blocks``: int blocks. ``room`` (free, plus evictable prefix-cache,
    blocks), ``reserved`` (:meth:`Admission.reserved_blocks`) and ``ratio`` (``new_token_ratio``) are scalars for
    the decision now, or int64 / float64 / float64 [m] at each of the next m decisions (bool [m] then). Written as
    two comparisons (taking ``cached_blocks`` off commutes with the min: rounding is monotone), so both give the
    same verdicts bit for bit.
    """
    left = room - reserved
    return (need + growth * ratio - cached_blocks > left) & (worst - cached_blocks > left)


class Admission:
    """Memory-only admission with SGLang's future-token reservation.

    Args:
        params: what it takes from the policy.
    """

    def __init__(self, params: AdmissionParams) -> None:
        p = self.params = params
        knobs = params.knobs
        self.max_running = knobs.max_running_requests
        self.clip_max_new_tokens = knobs.clip_max_new_tokens
        self.ratio_init, self.ratio_min = knobs.new_token_ratio_init, knobs.new_token_ratio_min
        self.ratio_decay = (self.ratio_init - self.ratio_min) / knobs.new_token_ratio_decay_steps
        self.new_token_ratio = self.ratio_init
        self.max_offloaded = p.max_offloaded
        self.kv_bytes_per_token = p.kv_bytes_per_token

    # ---- feedback the replica gives ---------------------------------------------------------------
    def on_decode_run(
        self,
        steps_s: list[float],
        attended_tokens: list[int],
        stalls_s: list[float] | None = None,
        link_busy_s: list[float] | None = None,
    ) -> None:
        """After k ≥ 1 decode steps (a single step is a run of one): decay ``new_token_ratio`` once per step.

        Args:
            steps_s: each step's seconds; attended_tokens: KV tokens each step read per layer.
            stalls_s, link_busy_s: each step's stall and link-busy seconds; None: no stall, the link idle (steps
                that recalled nothing).
        """
        if len(steps_s) and not (self.new_token_ratio == self.ratio_min and self.ratio_decay >= 0):  # (at its floor)
            self.new_token_ratio = self._decayed_ratios(len(steps_s))[-1]

    def on_preempt(self, batch: DecodeBatch | None = None) -> None:
        """After a preemption: ``retract_ratio: reset`` sets the ratio back to its initial value; ``estimate``
        sets SGLang's re-estimate over the surviving ``batch`` (``retract_decode`` /
        ``estimate_new_token_ratio_after_retract``): min(1, (Σ generated + steps · n) / (Σ output + 1))."""
        knobs = self.params.knobs
        if knobs.retract_ratio == "estimate" and batch is not None and len(batch):
            done = float(batch.generated.sum()) + knobs.retract_decode_steps * len(batch)
            self.new_token_ratio = min(1.0, done / (float(batch.output.sum()) + 1.0))
        else:
            self.new_token_ratio = self.ratio_init

    def _decayed_ratios(self, steps: int) -> list[float]:
        """``new_token_ratio`` after each of the next ``steps`` decode steps: max(min, ratio − decay) each step."""
        ratio, ratio_min, decay, out = self.new_token_ratio, self.ratio_min, self.ratio_decay, []
        if ratio == ratio_min and decay >= 0:  # decayed to its floor already (the usual case): stays there
            return [ratio_min] * steps
        for _ in range(steps):
            ratio = max(ratio_min, ratio - decay)
            out.append(ratio)
        return out

    # ---- the queue walk --------------------------------------------------------------------------
    def select(
        self,
        waiting: deque[Request],
        batch: DecodeBatch,
        kv: KvState,
        running: int,
        more: Callable[[], bool],
        disaggregated: bool,
    ) -> Iterator[tuple[Request, str]]:
        """Walk the queue FCFS; yield ``(request, verdict)`` for each request taken off it.

        ``verdict`` is :data:`OK` (it holds its blocks now) or the reason it can never run here (reject it).
        Stops at the first request that must wait for memory; ``more()`` is asked before each request.
        ``disaggregated``: requests bring their KV from remote prefill (prompt + generated − 1 tokens).
        """
        reserved = float(self.reserved_blocks(batch, self.new_token_ratio))
        pos = 0
        while pos < len(waiting) and running < self.max_running and more():
            req = waiting[pos]
            cached = req.prompt_tokens + req.generated - 1 if disaggregated else None
            verdict = self.decide(req, kv, batch, reserved, cached)
            if verdict == WAIT_IO and pos < BYPASS_SCAN:
                pos += 1  # the link is full, not the pool: let dense requests behind it in
                continue
            if verdict in (WAIT, WAIT_IO):
                return
            del waiting[pos]
            if verdict == OK:
                reserved += self.params.growth_blocks(self._future_tokens(req), req.offloaded) * self.new_token_ratio
                running += 1
            yield req, verdict

    def quiet_decisions(
        self, waiting: deque[Request], batch: DecodeBatch, kv: KvState, free_blocks: np.ndarray, disaggregated: bool
    ) -> int:
        """Skip-ahead (sim/serving/decode_run.py): at how many of the next scheduler decisions in a row
        :meth:`select` would take no request, if only the batch's decode steps change the state in between.

        Decision j (from 0) comes after j + 1 more decode steps: each running request has generated j + 1 more
        tokens, ``new_token_ratio`` has decayed j + 1 more times and the pool has ``free_blocks[j]`` free. The head
        of the queue waits while :func:`memory_waits` says so, over those m decisions at once (with a prefix cache,
        the head's cached blocks and the evictable room as they are now: a run evicts nothing). Subclasses whose
        rules this cannot tell ahead return 0.

        Args:
            free_blocks: int64 [m] free device blocks at each decision.

        Returns:
            The number of leading decisions (0..m) at which nobody joins.
        """
        m = len(free_blocks)
        if not m or not waiting or len(batch) >= self.max_running:
            return m
        req = waiting[0]
        offloaded = self.offload_possible(req, kv)
        target = req.prompt_tokens + req.generated - (1 if disaggregated else 0)
        need, worst, host_need = self._blocks(req, target, offloaded)
        if self._host_waits(offloaded, host_need, kv):
            return m  # waits for host DRAM or an offloaded slot, which decode steps do not free
        decayed = self._decayed_ratios(m)
        # one ratio for every decision when it has decayed to its floor (the same products, computed once)
        ratios = decayed[0] if decayed[0] == decayed[-1] == self.ratio_min else np.array(decayed)
        reserved = self.reserved_blocks(batch, ratios, batch.generated + np.arange(1, m + 1)[:, None])
        cached_blocks, room = self._prefix_room(req, kv)
        rooms = free_blocks + (room - kv.device.free)  # a run evicts nothing: the evictable room stays as it is
        growth = self.params.growth_blocks(self._future_tokens(req), offloaded)
        waits = memory_waits(need, growth, worst, cached_blocks, rooms, reserved, ratios)
        first = int(np.argmin(waits))  # the first decision at which the head joins (argmin: the first False)
        return m if waits[first] else first

    # ---- one request -----------------------------------------------------------------------------
    def decide(self, req: Request, kv: KvState, batch: DecodeBatch, reserved: float, cached: int | None) -> str:
        """Admit ``req`` if it fits (blocks taken, :data:`OK`), else :data:`WAIT`, :data:`WAIT_IO` or a reason.

        ``cached`` is the KV tokens the request brings (disaggregated: computed remotely); by default the tokens
        its local prefill will cache (prompt + generated).
        """
        reason = self.never_fits(req, kv)
        if reason:
            return reason
        target = req.prompt_tokens + req.generated if cached is None else cached
        verdict = self._try(req, kv, batch, reserved, target, self.offload_possible(req, kv), cached)
        if verdict == WAIT_IO and self.dense_fallback(req, kv, batch, reserved):
            verdict = self._try(req, kv, batch, reserved, target, False, cached)
        return verdict

    def _try(
        self,
        req: Request,
        kv: KvState,
        batch: DecodeBatch,
        reserved: float,
        target: int,
        offloaded: bool,
        cached: int | None,
    ) -> str:
        """Admit ``req`` dense or offloaded if memory (and, offloaded, the I/O bound) allows: blocks taken on OK."""
        need, worst, host_need = self._blocks(req, target, offloaded)
        req.offloaded = offloaded
        if self._host_waits(offloaded, host_need, kv):
            return WAIT
        cached_blocks, room = self._prefix_room(req, kv)  # blocks already held by cached prefix nodes
        growth = self.params.growth_blocks(self._future_tokens(req), offloaded)
        if memory_waits(need, growth, worst, cached_blocks, room, reserved, self.new_token_ratio):
            return WAIT
        if offloaded and not self.io_allows(kv, batch, need + reserved):
            return WAIT_IO
        hit = self._take_prefix(req, kv, need)
        kv.hold(req, need, host_need)
        if req.scheduled_s != req.scheduled_s:  # NaN: first admission (a re-admission after pre-emption keeps it)
            req.scheduled_s = kv.clock()
        req.prefill_target = target
        req.prefilled = hit if cached is None else 0  # colocated prefill skips the cached prefix
        return OK

    def _blocks(self, req: Request, target: int, offloaded: bool) -> tuple[int, int, int]:
        """(device blocks ``req`` takes with ``target`` KV tokens, the most it can ever hold, host bytes it takes)."""
        device_blocks = self.params.device_blocks
        host_need = req.total_tokens * self.kv_bytes_per_token if offloaded else 0
        return device_blocks(target, offloaded), device_blocks(req.total_tokens, offloaded), host_need

    def _host_waits(self, offloaded: bool, host_need: int, kv: KvState) -> bool:
        """Whether an offloaded request waits for host DRAM or an offloaded slot (never, dense)."""
        return offloaded and (kv.num_offloaded >= self.max_offloaded or host_need > kv.host.free)

    def _prefix_room(self, req: Request, kv: KvState) -> tuple[int, int]:
        """(blocks of ``req``'s prompt already cached, free blocks counting unreferenced cached ones).

        Without a prefix cache (or hashes): (0, free blocks). Cached nodes ``req`` would lock stop being
        evictable, so they are not counted as room (SGLang ``PrefillAdder``: available + evictable).
        """
        if kv.prefix is None or not req.hash_ids:
            return 0, kv.device.free
        path, _ = kv.prefix.match(req.hash_ids, req.prompt_tokens, req.hash_block_tokens)
        held = sum(n.blocks for n in path if n.on_device)  # host-tier (HiCache) nodes need device room again
        return held, kv.device.free + kv.prefix.evictable_blocks - kv.prefix.locked_evictable_blocks(path)

    def _take_prefix(self, req: Request, kv: KvState, need: int) -> int:
        """Lock ``req``'s prompt chain in the prefix cache (evicting LRU nodes for the new ones); hit tokens."""
        if kv.prefix is None or not req.hash_ids:
            if req.prefix_hit_tokens < 0:
                req.prefix_hit_tokens = 0
            return 0
        path, hit, added = kv.prefix.acquire(req.hash_ids, req.prompt_tokens, req.hash_block_tokens, kv.clock())
        shared = sum(n.blocks for n in path)
        room_ok = kv.make_room(added + max(0, need - shared)) and kv.device.allocate(added)
        assert room_ok, "prefix admission checked room it does not have"
        req.prefix_path, req.shared_blocks = path, min(shared, need)
        req.reload_tokens = kv.prefix.reloaded_tokens
        if req.prefix_hit_tokens < 0:
            req.prefix_hit_tokens = hit
        return hit

    def io_allows(self, kv: KvState, batch: DecodeBatch, taken_blocks: float) -> bool:
        """Whether the link (and a shared recall cache) has room for one more offloaded request that would take
        ``taken_blocks`` more of the pool (always, for memory-only admission)."""
        return True

    def dense_fallback(self, req: Request, kv: KvState, batch: DecodeBatch, reserved: float) -> bool:
        """Whether a request the I/O bound holds back may run dense instead (never, for memory-only admission)."""
        return False

    def offload_possible(self, req: Request, kv: KvState) -> bool:
        """The policy wants ``req`` offloaded and the host can hold its KV (else it runs dense)."""
        return (
            self.params.wants_offload(req.prompt_tokens)
            and req.total_tokens * self.kv_bytes_per_token <= kv.host.capacity
        )

    def never_fits(self, req: Request, kv: KvState) -> str:
        """Why ``req`` can never be served on this replica ('' if it can); checked on arrival too."""
        if req.total_tokens > self.params.max_seq_len:
            return "exceeds_max_seq_len"
        if self.params.device_blocks(req.total_tokens, self.offload_possible(req, kv)) > kv.device.capacity:
            return "exceeds_kv_pool"
        return ""

    # ---- the future-token reservation ------------------------------------------------------------
    def _future_tokens(self, req: Request) -> int:
        """Tokens reserved for ``req``'s future: its remaining output, clipped at ``clip_max_new_tokens``."""
        return min(req.output_tokens - req.generated, self.clip_max_new_tokens)

    def reserved_blocks(
        self, batch: DecodeBatch, ratio: float | np.ndarray, generated: np.ndarray | None = None
    ) -> np.floating | np.ndarray:
        """The running batch's reservation, blocks: Σ over it of its remaining output's blocks (clipped) × ``ratio``;
        float64. ``ratio`` (float) and ``generated`` (None: ``batch.generated``) as they are now, or float64 [m] and
        int64 [m, n] at each of the next m decisions (float64 [m] then)."""
        generated = batch.generated if generated is None else generated
        future = np.minimum(batch.output - generated, self.clip_max_new_tokens)
        return self.params.growth_blocks(future, batch.offloaded).sum(axis=-1) * ratio
