"""Where a study's simulations run: local worker processes or a Ray cluster, behind one function, and the one
way every pool stops.

``run_tasks(fn, tasks, backend, jobs, ray_address, on_done) -> list`` calls ``fn(*task)`` for every task and
returns the results in task order, whatever order they finish in, so a table built from them does not depend
on the backend or on scheduling. ``fn`` must be a module-level function and tasks picklable.

Backends (docs/search.md "Backends"): ``local`` runs ``jobs == 1`` (or a single task) in this process, else a
:class:`WorkerPool` of ``jobs`` spawned processes (no fork: workers start clean, as on another machine); ``ray``
makes each task one Ray remote call, on a local Ray it starts (and shuts down) with ``jobs`` CPUs, on the cluster at
``ray_address`` (probed first, :data:`RAY_CONNECT_TIMEOUT_S`), or on a Ray the caller already initialised (used as
is and left running). Ray is an optional extra, imported only here and only for this backend.

A task that raises re-raises its exception here (the first failure to come back).

Stopping. Whatever leaves a pool early (a task's exception, Ctrl-C, the CLI's SIGTERM and SIGHUP) stops its workers
at once instead of waiting for their tasks: the local pool as workers/__init__.py describes (the one process pool of the
project); on Ray every pending task is cancelled, and a Ray this process started is shut down. Results that came
back before the stop were already handed to ``on_done``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from workers import HELD_SIGNALS, POLL_S, WorkerPool, signals_held

BACKENDS = ("local", "ray")
RAY_EXTRA = "pip install -e '.[ray]'"
RAY_CONNECT_TIMEOUT_S = 5.0  # the probe of an explicit --ray-address


class FieldError(ValueError):
    """A bad setting; ``field`` names the config field or argument at fault (the CLI maps it to a flag). The base of
    every study's error (ExecutorError, PlanError, SweepError, SearchError, AccuracyError)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self):  # keep ``field`` when a worker process sends the error back
        return type(self), (str(self), self.field)


class ExecutorError(FieldError):
    """A bad backend setting (unknown name, Ray not installed, cluster unreachable); ``field`` names the
    ``run_tasks`` argument (``backend``, ``ray_address``, ``jobs``)."""


def check_backend(backend: str, jobs: int, ray_address: str | None = None) -> None:
    """Fail fast on a bad backend, job count, a missing Ray install or a Ray address nothing answers at.

    Raises:
        ExecutorError: unknown ``backend``, ``jobs`` < 1, ``ray_address`` without the ray backend, Ray absent,
            or ``ray_address`` malformed or refusing connections (see :func:`probe_ray_address`).
    """
    if backend not in BACKENDS:
        raise ExecutorError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}", "backend")
    if jobs < 1:
        raise ExecutorError(f"jobs must be >= 1, got {jobs}", "jobs")
    if ray_address and backend != "ray":
        raise ExecutorError(f"ray_address {ray_address!r} needs backend 'ray'", "ray_address")
    if backend == "ray":
        _import_ray()
        if ray_address:
            probe_ray_address(ray_address)


def probe_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to a Ray address, so a wrong one fails in seconds.

    ``auto`` is probed only when the ``RAY_ADDRESS`` environment variable names the cluster (otherwise Ray
    finds a local one itself, or says there is none); ``local`` is not probed.

    Raises:
        ExecutorError: (field ``ray_address``) the address is not ``HOST:PORT`` or ``ray://HOST:PORT``, or no
            connection opens within ``timeout_s``.
    """
    target = (os.environ.get("RAY_ADDRESS") or address) if address == "auto" else address
    if target in ("auto", "local"):
        return
    expected = "expected auto, HOST:PORT of a running Ray head (e.g. 10.0.0.5:6379) or ray://HOST:10001"
    host, sep, port = target.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ExecutorError(f"{address!r}: not a Ray address; {expected}", "ray_address")
    try:
        connection = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__  # e.g. "Connection refused"; a timeout has no strerror
        raise ExecutorError(
            f"{address}: nothing accepts connections at {host}:{port} ({reason}, {timeout_s:g} s timeout); {expected}",
            "ray_address",
        ) from None
    with connection:
        if not speaks_grpc(connection):
            raise ExecutorError(
                f"{address}: {host}:{port} accepts connections but gives no gRPC answer within {timeout_s:g} s, as a "
                f"Ray head (GCS) or Ray client server would; {expected}",
                "ray_address",
            )


# An HTTP/2 client's first bytes (RFC 9113 §3.4): the preface and an empty SETTINGS frame.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS = 4  # frame type a server's first frame has (RFC 9113 §3.4: its connection preface)


def speaks_grpc(connection: socket.socket) -> bool:
    """Whether the server at the other end of ``connection`` answers an HTTP/2 client preface with the SETTINGS
    frame every HTTP/2 server sends first. Ray's GCS and its client server are gRPC, so HTTP/2: a port that is open
    but is something else (a web server, a database, nothing listening behind a proxy) says nothing or something
    else, and ``ray.init`` would wait on it without a bound. Uses the socket's timeout."""
    try:
        connection.sendall(HTTP2_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:  # a timeout, a reset
        return False
    return header[3] == HTTP2_SETTINGS


def run_tasks(
    fn: Callable[..., Any],
    tasks: Sequence[tuple],
    backend: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    on_done: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """``[fn(*task) for task in tasks]`` on the chosen backend, in task order.

    Args:
        on_done: called in this process with (task index, result) as each task finishes (any order).

    Raises:
        ExecutorError: see :func:`check_backend`; whatever a task raised. KeyboardInterrupt (or a subclass)
            after the workers stopped (see the module docstring).
    """
    check_backend(backend, jobs, ray_address)
    if not tasks:
        return []
    if backend == "ray":
        return _run_ray(fn, tasks, jobs, ray_address, on_done)
    results: dict[int, Any] = {}
    if jobs == 1 or len(tasks) == 1:
        for i, task in enumerate(tasks):
            results[i] = fn(*task)
            if on_done:
                on_done(i, results[i])
        return [results[i] for i in range(len(tasks))]
    with WorkerPool(min(jobs, len(tasks))) as pool:
        futures = {pool.submit(fn, *task): i for i, task in enumerate(tasks)}

        def collect(future: Future) -> None:
            results[futures[future]] = future.result()  # a task's exception leaves the pool: the others stop
            if on_done:
                on_done(futures[future], results[futures[future]])

        pool.wait(list(futures), on_done=collect)
    return [results[i] for i in range(len(tasks))]


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"backend 'ray' needs Ray: {RAY_EXTRA}", "backend") from None
    return ray


def _run_ray(fn, tasks, jobs: int, ray_address: str | None, on_done) -> list[Any]:
    """Tasks as Ray remote calls; starts (and later stops) a local Ray unless one is running or an address is given."""
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        _init_ray(ray, jobs, ray_address)
        started = True
    pending: list = []
    try:
        remote = ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(*task) for task in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in done:
                results[index[ref]] = _ray_get(ray, ref)
                if on_done:
                    on_done(index[ref], results[index[ref]])
        return [results[i] for i in range(len(tasks))]
    except BaseException:
        with signals_held():
            for ref in pending:  # a joined cluster keeps running what is not cancelled
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 -- best effort: a finished or lost task cannot be cancelled
                    pass
        raise
    finally:
        if started:
            with signals_held():
                ray.shutdown()


def _init_ray(ray, jobs: int, ray_address: str | None) -> None:
    """``ray.init`` (join ``ray_address`` or start a local Ray), keeping this process's SIGTERM and SIGHUP
    handlers: Ray installs its own SIGTERM one (``sys.exit(15)``), which would skip the CLI's status 143 and its
    cleanup."""
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in HELD_SIGNALS if s != signal.SIGINT} if main_thread else {}
    try:
        if ray_address:
            ray.init(address=ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ExecutorError(f"cannot start or join Ray ({ray_address or 'local'}): {exc}", "ray_address") from None
    finally:
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)


def _ray_get(ray, ref) -> Any:
    """The task's result; a task's own exception is re-raised as itself, not wrapped in RayTaskError."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        original = getattr(exc, "cause", None)
        raise (original if isinstance(original, BaseException) else cause) from None
