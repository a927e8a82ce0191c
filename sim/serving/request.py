"""A request's serving state and the running decode batch as a struct of arrays.

Token bookkeeping: ``ctx`` counts tokens whose KV is cached. A prefill of N tokens caches N and samples one
token; a decode step caches the last sampled token (ctx + 1), attends ctx + 1 tokens and samples the next.
A preempted request later re-prefills its prompt plus the tokens it had generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

NAN = math.nan


@dataclass(slots=True)
class Request:
    """One request and its serving state (times in simulation seconds)."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    generated: int = 0  # output tokens sampled so far
    prefill_target: int = 0  # tokens the current (re)prefill must cache
    prefilled: int = 0  # tokens of the current prefill already cached
    offloaded: bool = False
    device_blocks: int = 0  # device-pool blocks held
    host_bytes: int = 0  # host DRAM held (offloaded KV)
    first_token_s: float = NAN
    finish_s: float = NAN
    num_preemptions: int = 0
    unfinished_reason: str = ""
    holds_kv: bool = False  # admitted and holding device blocks / host bytes
    done: simpy.Event | None = None  # set by a closed-loop driver; fires when the request is done
    hash_ids: tuple[int, ...] = ()  # the trace's prefix-block hashes (sim/serving/prefix.py)
    hash_block_tokens: int = 0  # tokens per hash block (Mooncake 512); 0 = no hashes
    prefix_path: list | None = None  # prefix-cache nodes this request locks (held once, shared)
    shared_blocks: int = 0  # device blocks of ``prefix_path`` (charged to the prefix cache, not to the request)
    prefix_hit_tokens: int = -1  # prompt tokens served from the prefix cache at first admission (-1: not yet)
    decode_admit_s: float = NAN  # first time it joined the decode batch (the client's first token, PD)
    scheduled_s: float = NAN  # first time the scheduler admitted it to prefill (its queue wait ends)
    reload_tokens: int = 0  # prefix tokens its next prefill loads back from the host tier (HiCache)
    swapped: bool = False  # preempted with its KV kept in host memory (retract: swap), to be loaded back

    @property
    def total_tokens(self) -> int:
        """Prompt plus output tokens: the most KV the request can ever hold."""
        return self.prompt_tokens + self.output_tokens


class DecodeBatch:
    """The running decode batch as parallel arrays (struct of arrays) plus the Request objects.

    Hot path: per-step work reads and writes the arrays; Request objects are synced from them only when
    requests leave the batch (:meth:`remove`).
    """

    def __init__(self, recall_state_width: int = 0) -> None:
        self.reqs: list[Request] = []
        self.ctx = np.zeros(0, dtype=np.int64)  # cached KV tokens
        self.generated = np.zeros(0, dtype=np.int64)
        self.output = np.zeros(0, dtype=np.int64)
        self.blocks = np.zeros(0, dtype=np.int64)  # device blocks held
        self.offloaded = np.zeros(0, dtype=bool)
        self.cold = np.zeros(0, dtype=bool)  # recall buffer empty (first step after prefill)
        self.prompt = np.zeros(0, dtype=np.int64)
        # float [n, width]: the policy's per-request recall state (persistent factors, drift), drawn at join
        self.recall_state = np.zeros((0, recall_state_width))

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, reqs: list[Request]) -> None:
        """Append requests that just finished prefill (their ``prefill_target`` tokens are cached)."""
        if not reqs:
            return
        self.reqs.extend(reqs)
        rows = [(r.prefill_target, r.generated, r.output_tokens, r.device_blocks, r.prompt_tokens, r.offloaded)
                for r in reqs]  # fmt: skip
        new = np.array(rows, dtype=np.int64)  # int64 [m, 6]
        self.ctx = np.concatenate((self.ctx, new[:, 0]))
        self.generated = np.concatenate((self.generated, new[:, 1]))
        self.output = np.concatenate((self.output, new[:, 2]))
        self.blocks = np.concatenate((self.blocks, new[:, 3]))
        self.prompt = np.concatenate((self.prompt, new[:, 4]))
        self.offloaded = np.concatenate((self.offloaded, new[:, 5] != 0))
        self.cold = np.concatenate((self.cold, np.ones(len(reqs), dtype=bool)))
        width = self.recall_state.shape[1]
        added = np.zeros((len(reqs), width))
        self.recall_state = np.concatenate((self.recall_state, added)) if width else np.zeros((len(self.reqs), 0))

    def remove(self, mask: np.ndarray) -> list[Request]:
        """Drop the requests where ``mask`` is True; sync and return them."""
        idx = mask.nonzero()[0].tolist()
        gone = [self.reqs[i] for i in idx]
        generated, blocks = self.generated[idx].tolist(), self.blocks[idx].tolist()
        for r, g, held in zip(gone, generated, blocks):
            r.generated, r.device_blocks = g, held
        keep = ~mask
        if len(idx) == 1:
            del self.reqs[idx[0]]
        else:
            self.reqs = [r for r, k in zip(self.reqs, keep.tolist()) if k]
        self.ctx, self.generated, self.output = self.ctx[keep], self.generated[keep], self.output[keep]
        self.blocks, self.offloaded, self.cold = self.blocks[keep], self.offloaded[keep], self.cold[keep]
        self.prompt, self.recall_state = self.prompt[keep], self.recall_state[keep]
        return gone

    def remove_all(self) -> list[Request]:
        """Drop and return every request (the run was cut)."""
        return self.remove(np.ones(len(self), dtype=bool))
