"""Where a study's simulations run: local worker processes or a Ray cluster, behind one function.

``run_tasks(fn, tasks, backend, jobs, ray_address, on_done) -> list`` calls ``fn(*task)`` for every task and
returns the results in task order, whatever order they finish in, so a table built from them does not depend
on the backend or on scheduling. ``fn`` must be a module-level function and tasks picklable.

Backends:

- ``local``: ``jobs == 1`` (or a single task) runs in this process; otherwise a ``ProcessPoolExecutor`` of
  ``jobs`` spawned processes (no fork: workers start clean, as on another machine).
- ``ray``: each task is one Ray remote call. With no ``ray_address`` and no Ray already initialised in this
  process, ``ray.init()`` starts a local instance with ``jobs`` CPUs (and shuts it down afterwards); with
  ``ray_address`` (``auto``, or ``ray://host:10001``) it joins that cluster, whose nodes must have this package
  installed (``pip install -e '.[ray]'``). A Ray already initialised by the caller (a test fixture, a notebook)
  is used as is and left running. Ray is an optional extra, imported only here and only for this backend.

A task that raises re-raises its exception here (the first failure to come back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

BACKENDS = ("local", "ray")
RAY_EXTRA = "pip install -e '.[ray]'"


class ExecutorError(ValueError):
    """A bad backend setting (unknown name, Ray not installed, cluster unreachable); ``field`` names the
    ``run_tasks`` argument (``backend``, ``ray_address``, ``jobs``)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self):  # keep ``field`` across processes
        return type(self), (str(self), self.field)


def check_backend(backend: str, jobs: int, ray_address: str | None = None) -> None:
    """Fail fast on a bad backend, job count or a missing Ray install.

    Raises:
        ExecutorError: unknown ``backend``, ``jobs`` < 1, ``ray_address`` without the ray backend, or Ray absent.
    """
    if backend not in BACKENDS:
        raise ExecutorError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}", "backend")
    if jobs < 1:
        raise ExecutorError(f"jobs must be >= 1, got {jobs}", "jobs")
    if ray_address and backend != "ray":
        raise ExecutorError(f"ray_address {ray_address!r} needs backend 'ray'", "ray_address")
    if backend == "ray":
        _import_ray()


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
        ExecutorError: see :func:`check_backend`; whatever a task raised.
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
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(fn, *task): i for i, task in enumerate(tasks)}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if on_done:
                    on_done(i, results[i])
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
        try:
            if ray_address:
                ray.init(address=ray_address, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ExecutorError(f"cannot start or join Ray ({ray_address or 'local'}): {exc}", "ray_address") from None
        started = True
    try:
        remote = ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(*task) for task in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                results[index[ref]] = _ray_get(ray, ref)
                if on_done:
                    on_done(index[ref], results[index[ref]])
        return [results[i] for i in range(len(tasks))]
    finally:
        if started:
            ray.shutdown()


def _ray_get(ray, ref) -> Any:
    """The task's result; a task's own exception is re-raised as itself, not wrapped in RayTaskError."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        original = getattr(exc, "cause", None)
        raise (original if isinstance(original, BaseException) else cause) from None
