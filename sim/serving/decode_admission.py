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

Model assumption: a request's ``max_new_tokens`` is its trace output length (clients rarely send the exact
length; SGLang would reserve against the request's limit).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from sim.serving.admission import OK, WAIT, Admission
from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request


class DecodeAdmission(Admission):
    """SGLang PD decode-side admission (module docstring); the colocated path keeps :class:`Admission`.

    Args:
        policy: the dense policy that owns it (``num_reserved_decode_tokens``, ``clip_max_new_tokens``).
    """

    def __init__(self, policy) -> None:
        super().__init__(policy)
        self.reserved_tokens = policy.params.num_reserved_decode_tokens

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
        bs, n, clip = self.policy.block_size, len(batch), self.clip_max_new_tokens
        retractable = int((batch.prompt + batch.generated).sum()) + n * np.arange(1, m + 1)
        single = int((batch.prompt + np.minimum(batch.output, clip)).max()) - retractable
        allocatable = free_blocks - -(-np.maximum(self.reserved_tokens * n, single) // bs)
        fill = req.prompt_tokens + max(req.generated - 1, 0)
        required = self.policy.blocks_one(fill, False) + -(-self.reserved_tokens // bs)
        worst = -(-(req.prompt_tokens + min(req.output_tokens, clip) - retractable) // bs)
        waits = np.maximum(required, worst) > allocatable
        return m if waits.all() else int(np.argmin(waits))

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
        clip = self.clip_max_new_tokens
        retractable = int((batch.prompt + batch.generated).sum())
        single = int((batch.prompt + np.minimum(batch.output, clip)).max()) - retractable if len(batch) else 0
        while waiting and running < self.max_running and more():
            req = waiting[0]
            reason = self.never_fits(req, kv)
            if reason:
                waiting.popleft()
                yield req, reason
                continue
            verdict = self._decide_decode(req, kv, running, retractable, single)
            if verdict == WAIT:
                return
            waiting.popleft()
            running += 1
            yield req, OK

    def _decide_decode(self, req: Request, kv: KvState, active: int, retractable: int, single: int) -> str:
        """Admit ``req`` (blocks taken, :data:`OK`) if SGLang's decode budget allows it, else :data:`WAIT`."""
        pol, bs = self.policy, self.policy.block_size
        fill = req.prompt_tokens + max(req.generated - 1, 0)
        need = pol.blocks_one(fill, False)
        cached_blocks, room = self._prefix_room(req, kv)
        allocatable = room - -(-max(self.reserved_tokens * active, single) // bs)
        required = need - cached_blocks + -(-self.reserved_tokens // bs)
        worst = -(-(req.prompt_tokens + min(req.output_tokens, self.clip_max_new_tokens) - retractable) // bs)
        if max(required, worst - cached_blocks) > allocatable:
            return WAIT
        req.offloaded = False
        self._take_prefix(req, kv, need)
        kv.hold(req, need, 0)
        req.prefill_target, req.prefilled = fill, 0
        return OK
