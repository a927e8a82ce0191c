"""SGLang's disaggregated decode admission (``decode_scheduler: sglang_pd``): who joins the decode batch when
prefill runs elsewhere, as sglang ``disaggregation/decode.py`` ``DecodePreallocQueue.pop_preallocated`` and
``_allocatable_token_budgets`` do it (docs/sources.md §5.7)::

    retractable   = Σ over the running batch of (prompt + generated)
    single        = max over the running batch of (prompt + min(output, clip)) − retractable   (0 if empty)
    allocatable   = free + evictable − max(R · active, single)
    required      = fill + R,    fill = prompt + max(generated − 1, 0)   (the KV it brings)
    admit if max(required, prompt + min(output, clip) − retractable) ≤ allocatable

with R = ``num_reserved_decode_tokens`` (SGLang default 512) per active request (running plus those admitted
in this walk), clip = ``clip_max_new_tokens`` (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096). There is no
``new_token_ratio`` in this rule (SGLang: "TODO: add new token ratio"). The walk is FCFS and stops at the first
request that does not fit. A retracted request waits at the head of the queue (SGLang serves its
``retracted_queue`` first and counts it against the budget of new ones); with ``retract: swap`` it kept its KV
in host memory and reloads it (sim/serving/replica.py).

The rule is written once (:meth:`DecodeAdmission.budget_waits`), over the decision now or the next m decisions.

Model assumption: a request's ``max_new_tokens`` is its trace output length (clients rarely send the exact
length; SGLang would reserve against the request's limit).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from sim.serving.admission import OK, Admission, AdmissionParams
from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request


def _larger(a: int | np.ndarray, b: int | np.ndarray) -> int | np.ndarray:
    """max(a, b) of two ints, elementwise when either is an int64 array over the decision axis."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


class DecodeAdmission(Admission):
    """SGLang PD decode-side admission (module docstring); the colocated path keeps :class:`Admission`.

    Args:
        params: what it takes from the (dense) policy; ``knobs.num_reserved_decode_tokens``, ``clip_max_new_tokens``
            and ``block_size`` are this rule's.
    """

    def __init__(self, params: AdmissionParams) -> None:
        super().__init__(params)
        self.reserved_tokens = params.knobs.num_reserved_decode_tokens
        self.block_size = params.knobs.block_size

    def select(
        self,
        waiting: deque[Request],
        batch: DecodeBatch,
        kv: KvState,
        running: int,
        more: Callable[[], bool],
        disaggregated: bool,
    ) -> Iterator[tuple[Request, str]]:
        """Walk the queue FCFS with SGLang's decode budget; yield ``(request, verdict)`` for those taken off it."""
        if not disaggregated:
            yield from super().select(waiting, batch, kv, running, more, disaggregated)
            return
        retractable, single = self.retractable(batch)
        while waiting and running < self.max_running and more():
            req = waiting[0]
            reason = self.never_fits(req, kv)
            if reason:
                waiting.popleft()
                yield req, reason
                continue
            fill, need = self._fill(req)
            cached_blocks, room = self._prefix_room(req, kv)
            if self.budget_waits(req, need, cached_blocks, room, running, retractable, single):
                return
            req.offloaded = False
            self._take_prefix(req, kv, need)
            kv.hold(req, need, 0)
            req.prefill_target, req.prefilled = fill, 0
            waiting.popleft()
            running += 1
            yield req, OK

    def quiet_decisions(
        self, waiting: deque[Request], batch: DecodeBatch, kv: KvState, free_blocks: np.ndarray, disaggregated: bool
    ) -> int:
        """:meth:`Admission.quiet_decisions` under SGLang's decode budget (colocated: the base rule). Decision j
        comes after j + 1 more decode steps: ``retractable`` has grown by (j + 1) · n tokens; integer arithmetic."""
        m = len(free_blocks)
        if not disaggregated:
            return super().quiet_decisions(waiting, batch, kv, free_blocks, disaggregated)
        if not waiting or len(batch) >= self.max_running:
            return m
        req = waiting[0]
        if kv.prefix is not None and req.hash_ids:
            return 0
        retractable, single = self.retractable(batch, np.arange(1, m + 1))
        waits = self.budget_waits(req, self._fill(req)[1], 0, free_blocks, len(batch), retractable, single)
        return m if waits.all() else int(np.argmin(waits))

    def retractable(self, batch: DecodeBatch, ahead: int | np.ndarray = 0) -> tuple:
        """(retractable, single) tokens of the running batch (module docstring) after ``ahead`` more decode steps:
        ints for the decision now (``ahead`` 0), or int64 [m] for ``ahead`` int64 [m]."""
        retractable = int((batch.prompt + batch.generated).sum()) + len(batch) * ahead
        if not len(batch):
            return retractable, 0
        return retractable, int((batch.prompt + np.minimum(batch.output, self.clip_max_new_tokens)).max()) - retractable

    def budget_waits(self, req: Request, need, cached_blocks, room, active, retractable, single) -> bool | np.ndarray:
        """SGLang's decode budget in blocks (module docstring): whether ``req`` waits; integer arithmetic.

        Args:
            need: blocks of the KV it brings (``fill`` tokens); cached_blocks: of those, blocks its cached prefix holds.
            room: free device blocks plus evictable prefix-cache blocks; active: requests running or admitted.
            retractable, single: tokens (:meth:`retractable`).
            room, retractable and single are ints for the decision now, or int64 [m] at each of the next m decisions
            (bool [m] then).
        """
        bs, r = self.block_size, self.reserved_tokens
        worst = -(-(req.prompt_tokens + min(req.output_tokens, self.clip_max_new_tokens) - retractable) // bs)
        allocatable = room - -(-_larger(r * active, single) // bs)
        return _larger(need + -(-r // bs), worst) - cached_blocks > allocatable

    def _fill(self, req: Request) -> tuple[int, int]:
        """(KV tokens ``req`` brings from remote prefill, the device blocks they take)."""
        fill = req.prompt_tokens + max(req.generated - 1, 0)
        return fill, self.params.device_blocks(fill, False)
