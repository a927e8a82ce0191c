"""Prefill, the replica's role before decode: a colocated prefill forward (chunked, FCFS) or a remote one.

A mixin of :class:`~sim.serving.replica.Replica` (beside :class:`~sim.serving.decode.Decode`), using its
clock, queue, batch, pools, admission, devices and recorder. ``serving.prefill``:

- ``colocated``: the scheduler loop runs one prefill forward of at most ``chunked_prefill_tokens`` new tokens
  before decoding (:meth:`Prefill._build_prefill`, :meth:`Prefill._prefill`; SGLang's ``PrefillAdder``); with
  ``serving.mixed_prefill`` the chunks ride in the running batch's decode step instead (one forward: the step's
  time plus the chunks' FLOPs, ``ComputeModel.prefill_extra_s``; vLLM V1, TensorRT-LLM, SGLang
  ``--enable-mixed-chunk``), so decode does not stop while a long prompt is prefilled;
- ``disaggregated``: arrivals queue for a FIFO pool of ``num_prefill_gpus`` remote GPUs, and a prefilled request
  waits for the decode GPU's admission (:meth:`Prefill._remote_prefill`, :meth:`Prefill._admit_prefilled`);
- ``none``: prefill costs no time (requests arrive with their KV cached).
"""

from __future__ import annotations

import math
from collections.abc import Generator

import simpy

from sim.serving.prefix import host_tier_forward, reload_forward_s
from sim.serving.request import Request


class Prefill:
    """Mixin of :class:`~sim.serving.replica.Replica`: its prefill role (module docstring)."""

    def _to_prefill(self, req: Request) -> None:
        """Send a new or preempted request to prefill: free, remote, or this GPU's queue (at the back)."""
        if self.prefill_free:
            self._prefilled(req)
        elif self.disaggregated:
            self.prefills_queued += 1
            self.env.process(self._remote_prefill(req))
        else:
            self._enqueue(req)

    def _remote_prefill(self, req: Request) -> Generator[simpy.Event, object, None]:
        """Prefill on a remote GPU (FIFO pool), then queue for the decode GPU."""
        with self.prefill_gpus.request() as gpu:
            yield gpu
            self.prefills_queued -= 1
            duration_s = self._remote_prefill_s(req)
            end_s = self.env.now + duration_s  # where SimPy schedules the timeout
            self.prefill_ends_s.append(end_s)
            yield self.env.timeout(duration_s)
            self.prefill_ends_s.remove(end_s)
        self._prefilled(req)

    def _remote_prefill_s(self, req: Request) -> float:
        """Seconds a remote GPU takes to prefill ``req`` (its prompt and the tokens it generated before a
        preemption)."""
        return self.policy.compute.prefill_s([(req.prompt_tokens + req.generated, 0)], 1)

    def remote_prefill_end_s(self, req: Request, at_s: float) -> float | None:
        """When a remote prefill of ``req`` sent at ``at_s`` (now, or the time of this replica's next arrival) ends,
        if it starts then: a prefill GPU is free now and no prefill waits for one (``_remote_prefill`` adds the same
        seconds to the same clock); None when it may have to wait (a prefill sent but not computing yet, or every GPU
        taken). Until ``at_s`` only this replica's arrivals and its preempted requests take its prefill GPUs, and a
        request is preempted only at a scheduling decision, which no skip-ahead run contains: within a run the free
        GPU stays free until the arrival."""
        gpus = self.prefill_gpus
        if self.prefills_queued or gpus.count >= gpus.capacity:
            return None
        return at_s + self._remote_prefill_s(req)

    def next_prefill_event_s(self) -> float:
        """The next time a remote prefill of this replica can feed its queue (skip-ahead behind a router): now while
        one that has not started computing may start now (a prefill GPU is free, or was granted to a process that
        has not resumed yet), else the earliest end of those computing (inf if none): a queued prefill starts only
        when one of them ends."""
        gpus = self.prefill_gpus
        if self.prefills_queued and (gpus.count < gpus.capacity or gpus.count > len(self.prefill_ends_s)):
            return self.env.now
        return min(self.prefill_ends_s, default=math.inf)

    def _prefilled(self, req: Request) -> None:
        """A remote (or, with ``prefill: none``, free and immediate) prefill finished: first token, then queue."""
        req.generated = min(req.generated + 1, req.output_tokens)
        if math.isnan(req.first_token_s) and req.output_tokens > 0:
            req.first_token_s = self.env.now
        if req.generated >= req.output_tokens:
            self._finish(req)
            self._wake()
        else:
            self._enqueue(req)

    def _admit_prefilled(self) -> list[Request]:
        """Move prefilled requests from the queue into the decode batch while their KV fits (FCFS)."""
        admitted: list[Request] = []
        if not self.waiting:
            return admitted
        for req in self._admitted(len(self.batch), lambda: True):
            req.prefilled = req.prefill_target
            if req.swapped:  # load its KV back from host (SGLang decode resume_retracted_reqs → load_kv_cache)
                end_s = self.gpu.swap_in(self.devices, self.env.now, req.prefill_target)  # on the link, FIFO
                self.swap_end_s = max(self.swap_end_s, end_s)
                req.swapped = False
            if math.isnan(req.decode_admit_s):  # the client's first token streams from here (PD)
                req.decode_admit_s = self.env.now
            admitted.append(req)
        return admitted

    def _build_prefill(self) -> list[tuple[Request, int]]:
        """The next prefill forward: ``(request, new tokens)`` chunks within ``chunked_prefill_tokens``. A mixed step
        (``serving.mixed_prefill``) fills its token budget with the running batch's decode tokens first (vLLM V1's
        scheduler: running requests, then waiting ones), so its chunks get what they leave."""
        budget = self.policy.params.chunked_prefill_tokens
        if self.scenario.serving.mixed_prefill:
            budget -= len(self.batch)
        chunks: list[tuple[Request, int]] = []
        if self.chunked is not None and budget > 0:
            req = self.chunked
            take = min(req.prefill_target - req.prefilled, budget)
            chunks.append((req, take))
            budget -= take
            if req.prefilled + take < req.prefill_target:
                return chunks
            self.chunked = None
        if not self.waiting or budget <= 0:
            return chunks
        for req in self._admitted(len(self.batch) + len(chunks), lambda: budget > 0):  # noqa: B023
            take = min(req.prefill_target - req.prefilled, budget)  # prefilled: prefix-cache hit tokens
            chunks.append((req, take))
            budget -= take
            if req.prefilled + take < req.prefill_target:
                self.chunked = req
                break
        return chunks

    def _prefill(self, chunks: list[tuple[Request, int]]) -> Generator[simpy.Event, object, None]:
        start = self.env.now
        done = [r for r, take in chunks if r.prefilled + take >= r.prefill_target]
        duration = self.policy.compute.prefill_s([(take, r.prefilled) for r, take in chunks], len(done))
        reload_tokens = sum(r.reload_tokens for r, _ in chunks)
        if reload_tokens:  # HiCache: host-tier prefix KV loads back (on the link) layer-wise during this forward
            wait_s, load_s = self.gpu.hicache_load(self.devices, start, reload_tokens)
            duration = wait_s + reload_forward_s(duration, load_s, self.gpu.num_layers)
            for r, _ in chunks:
                r.reload_tokens = 0
        # HiCache (sim/serving/prefix.py): host-tier bookkeeping before the forward, new nodes written through after
        duration, write_tokens = host_tier_forward(self.kv.prefix, duration, self.policy.params.hicache_node_op_us)
        mixed = self.scenario.serving.mixed_prefill and len(self.batch) and not reload_tokens
        if mixed:  # one forward: the running batch's decode step carries the chunks (they add only their FLOPs)
            extra_s = self.policy.compute.prefill_extra_s([(take, r.prefilled) for r, take in chunks], len(done))
            self.in_forward = [r for r, _ in chunks if r is not self.chunked]
            yield from self._decode_step(extra_s)
            self.in_forward = []
            if self.env.now == start:  # the step preempted its whole batch: the chunks run alone
                yield from self.devices.run_forward(duration)
            else:
                start = self.env.now  # the step's row holds the forward's time; the prefill row records its tokens
        else:
            yield from self.devices.run_forward(duration)
        for r, take in chunks:
            r.prefilled += take
        self._write_offloaded_prompts(chunks)
        self.gpu.write_through(self.devices, self.env.now, write_tokens)
        now = self.env.now
        joining = []
        for r in done:
            r.generated = min(r.generated + 1, r.output_tokens)
            if math.isnan(r.first_token_s) and r.output_tokens > 0:
                r.first_token_s = now
            if r.generated >= r.output_tokens:
                self._finish(r)
            else:
                joining.append(r)
                if math.isnan(r.decode_admit_s):
                    r.decode_admit_s = now
        self.batch.add(joining)
        tokens = sum(take for _, take in chunks)
        self._record_prefill(start, len(chunks), sum(r.offloaded for r, _ in chunks), tokens)

    def _write_offloaded_prompts(self, chunks: list[tuple[Request, int]]) -> None:
        """Queue on the D2H queue the prompt KV a colocated prefill just computed for offloaded requests: it
        must reach host DRAM (model assumption: written after the forward, not layer by layer during it).
        A preempted request's KV is released and recomputed, so preemption writes nothing."""
        tokens = sum(take for r, take in chunks if r.offloaded)
        self.gpu.write_back(self.devices, self.env.now, tokens)  # this GPU's shard of their KV

    def _record_prefill(self, start_s: float, batch_size: int, num_offloaded: int, prefill_tokens: int) -> None:
        kv = self.kv
        hbm = kv.hbm_used_bytes
        if self.debug:
            self._check_invariants(hbm)
        self.rec.d2h_busy_s, self.rec.d2h_free_s = self.devices.d2h_busy_s, self.devices.d2h_free_s
        state = (kv.device.used, hbm, kv.host.used)
        self.rec.record_prefill(start_s, self.env.now, batch_size, num_offloaded, prefill_tokens, state)
