"""Closed-loop replay of a session trace (agentic coding sessions, ``traces.read_kvcache_tester``).

Sessions have no shared clock, and a client issues its next request only once the previous answer is back, so
a session's arrivals depend on how fast the server answers: a slower system sees later arrivals. The
:class:`SessionDriver` process drives a :class:`~sim.serving.replica.Replica` through ``submit`` / ``close``:

1. Session s (in the table's session order) is offered at ``starts[s]``: seeded Poisson arrivals from
   :func:`session_starts` (the first at 0 s). With ``max_concurrent_sessions`` it then waits FIFO for a free
   slot; its start is when it gets one.
2. Within the session, request k (turn order) is issued ``think_time_s[k]`` after request k - 1 is done
   (finished or rejected: its ``Request.done`` event), request 0 ``think_time_s[0]`` after the session start
   (0 s in the recorded traces). ``arrival_s`` is the issue time; ``request_id`` is the table's.
3. The session ends when its last request is done and frees its slot; when every session has ended the
   driver calls ``Replica.close()``, so the replica's run loop returns once the last request is done.

Model assumption (sub-agents): a session's sub-agent requests were flattened into it in time order by the
reader, and are replayed in the same closed loop as the main agent's: one request in flight per session.
Sub-agents that ran concurrently in the recording (several at once in some sessions) are serialised, so the
replay offers at most one request per session at a time. Recorded think times are the client's delays
(tool runs, user pauses); they are kept as they are unless the scenario caps them
(``workload.sessions.max_think_time_s``, applied and counted by ``traces.shape_sessions``).
"""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np
import pandas as pd
import simpy

from sim.serving.replica import Replica
from sim.serving.request import Request


def session_starts(num_sessions: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """Offered session start times: 0 s, then exponential gaps of mean ``1 / rate_per_s``.

    Args:
        num_sessions: >= 1.
        rate_per_s: mean session arrival rate, > 0.
        rng: the only source of randomness.

    Returns:
        float64 [num_sessions], non-decreasing, starting at 0.0.
    """
    gaps_s = rng.exponential(1.0 / rate_per_s, size=num_sessions - 1)
    return np.concatenate(([0.0], np.cumsum(gaps_s)))


class SessionDriver:
    """Issues a session table's requests to a replica closed loop (module docstring has the protocol).

    Args:
        env: the SimPy environment of ``replica``.
        replica: a replica built with no requests (``requests=[]``); the driver submits and closes it.
        workload: a session table (``traces.is_session_table``): rows grouped by session, in turn order.
        starts: offered start time of each session, in the table's session order (:func:`session_starts`).
        max_concurrent_sessions: sessions running at once; None = no cap.

    Raises:
        ValueError: if ``starts`` does not have one time per session.
    """

    def __init__(
        self,
        env: simpy.Environment,
        replica: Replica,
        workload: pd.DataFrame,
        starts: np.ndarray,
        max_concurrent_sessions: int | None = None,
    ) -> None:
        self.env, self.replica = env, replica
        order = pd.unique(workload["session_id"])
        rows = zip(
            workload["session_id"],
            workload["request_id"].astype(int),
            workload["prompt_tokens"].astype(int),
            workload["output_tokens"].astype(int),
            workload["think_time_s"].astype(float),
        )
        by_session: dict[str, list[tuple[int, int, int, float]]] = {s: [] for s in order}
        for session_id, *row in rows:
            by_session[session_id].append(tuple(row))
        self.sessions = [by_session[s] for s in order]
        # prefix-block hashes by request id, for the prefix cache (sim/serving/prefix.py)
        self.block_tokens = int(workload.attrs.get("hash_block_tokens", 0))
        has_ids = self.block_tokens and "hash_ids" in workload.columns
        self.hash_ids = dict(zip(workload["request_id"].astype(int), workload["hash_ids"])) if has_ids else {}
        self.session_ids = list(order)
        if len(starts) != len(self.sessions):
            raise ValueError(f"starts has {len(starts)} times for {len(self.sessions)} sessions; expected one each")
        self.starts = [float(s) for s in starts]
        self.slots = simpy.Resource(env, capacity=max_concurrent_sessions) if max_concurrent_sessions else None
        self.issued: set[int] = set()  # request_ids submitted so far
        self.session_start_s = [math.nan] * len(self.sessions)  # when each session got its slot
        self.session_end_s = [math.nan] * len(self.sessions)  # when its last request was done

    def run(self) -> Generator[simpy.Event, object, None]:
        """Offer the sessions at their start times, wait for all of them, then close the replica."""
        running = []
        for index, start_s in enumerate(self.starts):
            if start_s > self.env.now:
                yield self.env.timeout(start_s - self.env.now)
            running.append(self.env.process(self._session(index)))
        yield self.env.all_of(running)
        self.replica.close()

    def _session(self, index: int) -> Generator[simpy.Event, object, None]:
        if self.slots is None:
            yield from self._replay(index)
            return
        with self.slots.request() as slot:
            yield slot
            yield from self._replay(index)

    def _replay(self, index: int) -> Generator[simpy.Event, object, None]:
        env = self.env
        self.session_start_s[index] = env.now
        for request_id, prompt_tokens, output_tokens, think_time_s in self.sessions[index]:
            if think_time_s > 0:
                yield env.timeout(think_time_s)
            req = Request(request_id, float(env.now), prompt_tokens, output_tokens)  # (SimPy's clock starts at int 0)
            if request_id in self.hash_ids:
                req.hash_ids, req.hash_block_tokens = tuple(self.hash_ids[request_id]), self.block_tokens
            req.done = env.event()
            self.issued.add(request_id)
            self.replica.submit(req)
            yield req.done
        self.session_end_s[index] = env.now

    def unissued(self, reason: str) -> list[Request]:
        """Requests the run ended before issuing (the horizon cut their session, or the replica got stuck), as
        unfinished records with ``arrival_s`` NaN (never issued) and ``unfinished_reason`` = ``reason``
        ("horizon" or "stuck", as for issued requests the run cut)."""
        return [
            Request(request_id, math.nan, prompt, output, unfinished_reason=reason)
            for rows in self.sessions
            for request_id, prompt, output, _ in rows
            if request_id not in self.issued
        ]
