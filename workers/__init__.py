"""The one local process pool and the one way it stops (whatever leaves it early: a task's exception, Ctrl-C's
``KeyboardInterrupt``, the CLI's SIGTERM and SIGHUP exceptions, ``KeyboardInterrupt`` subclasses):

1. each worker gets SIGTERM; in a task it raises ``KeyboardInterrupt`` there, so the task's ``finally`` and
   ``with`` blocks run (an Optuna trial is marked failed, a journal lock released), then the worker exits;
   an idle worker exits at once;
2. a worker still alive after :data:`STOP_GRACE_S` is killed; then the pool is shut down, and with no worker
   left, multiprocessing's resource tracker exits too.

A worker also ends by itself once its parent is gone, whatever ended the parent (SIGKILL included, which runs no
stop at all): it watches its parent id (:func:`_watch_parent`), so no worker, and then no resource tracker, outlives
the run.

SIGINT, SIGTERM and SIGHUP that arrive while the workers stop are delivered once they have stopped (a second
Ctrl-C cannot cut the stop short). Workers ignore SIGINT and SIGHUP: the terminal's Ctrl-C and hangup reach the
whole process group, and the parent alone decides what stops. Workers are spawned (no fork: they start clean, as on
another machine). Two start-up windows are closed: a signal to this process while ``submit`` spawns a worker is held
until the worker has its start-up data (else the half-started worker dies printing ``EOFError`` from
``multiprocessing/spawn.py``), and a new worker blocks SIGINT and SIGHUP as its first act, before it imports the
simulator, so a Ctrl-C at start-up does not print its ``KeyboardInterrupt`` from every worker.

Used by the studies (study/executors.py: sweeps, plans, searches), the serving-suite fit
(calibrate/serving_fit.py) and a round-robin fleet's replicas (sim/serving/fleet_pool.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Any

# signals held while workers stop (SIGHUP: POSIX only)
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))
STOP_GRACE_S = 10.0  # a stopped worker's time to unwind its task before it is killed
POLL_S = 0.5  # how often a waiting pool calls its ``on_wait``
PARENT_POLL_S = 0.5  # how often a worker checks that its parent is alive


class WorkerPool:
    """``jobs`` spawned worker processes that stop together (the module docstring's "Stopping").

    Use as a context manager: leaving the block normally waits for every task; leaving it by an exception
    (Ctrl-C and SIGTERM included) stops the workers first (:meth:`stop`), then re-raises.
    """

    def __init__(self, jobs: int) -> None:
        self._pool = ProcessPoolExecutor(
            max_workers=jobs, mp_context=get_context("spawn"), initializer=_boot, initargs=(os.getpid(),)
        )

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self._pool.shutdown(wait=True)
        else:
            self.stop()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """``fn(*args)`` in a worker (module-level ``fn``, picklable arguments). ``submit`` may spawn a worker: a
        signal arriving meanwhile is delivered once the worker has what it needs to start."""
        with signals_held():
            return self._pool.submit(_run_in_worker, fn, args)

    def wait(
        self,
        futures: list[Future],
        on_done: Callable[[Future], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        """Until every future is done: ``on_done(future)`` as each finishes (a failed future raises there when
        ``on_done`` reads its result), ``on_wait()`` every :data:`POLL_S` seconds. Waiting in short slices keeps
        this process responsive to signals."""
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_EXCEPTION)
            for future in done:
                if on_done:
                    on_done(future)
                elif future.exception() is not None:
                    raise future.exception()
            if on_wait:
                on_wait()

    def stop(self) -> None:
        """Stop every worker now: SIGTERM, :data:`STOP_GRACE_S` to unwind, then SIGKILL; then shut the pool down."""
        with signals_held():
            # ProcessPoolExecutor has no public handle on its processes before Python 3.14 (terminate_workers)
            processes = list((getattr(self._pool, "_processes", None) or {}).values())
            for process in processes:
                if process.is_alive():
                    process.terminate()
            deadline = time.monotonic() + STOP_GRACE_S
            for process in processes:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join()
            self._pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP that arrive inside the block are delivered when it ends (so a second Ctrl-C cannot
    cut a stop short and leave workers behind, nor split the results folder's two renames, pulseinfer/outdir.py);
    only in the main thread, where Python runs signal handlers. Handlers are swapped rather than the signals
    blocked: a process-directed signal reaches any thread that does not block it (tqdm's monitor, numba's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in HELD_SIGNALS}
    try:
        yield
    finally:  # also when the block raised: the signal's exception then replaces that one (Ctrl-C wins)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in caught:  # the first one not ignored (SIGHUP under nohup) is acted on by the handler restored
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.raise_signal(signum)  # KeyboardInterrupt, the CLI's Terminated or HungUp
                break


_in_task = False  # worker processes: whether a task is running (SIGTERM then unwinds it before exiting)
_started = False  # worker processes: whether _init_worker has run


def _init_worker() -> None:
    """Worker initializer: ignore SIGINT and SIGHUP (the parent decides), turn SIGTERM into a stop
    (:func:`_on_stop`). A stop that lands inside a C callback (numba compiling) cannot unwind there: Python would
    print it as an ignored exception; it is dropped quietly and the worker is killed after :data:`STOP_GRACE_S`."""
    for signum in HELD_SIGNALS:
        if signum != signal.SIGTERM:
            signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_stop)
    sys.unraisablehook = _quiet_stop


def _boot(parent: int) -> None:
    """A new worker's first act (its initializer; this module imports the standard library only): block SIGINT and
    SIGHUP, then watch the parent (:func:`_watch_parent`). ``_init_worker`` runs before the first task. Without
    pthread_sigmask (not POSIX) it runs here instead."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, [s for s in HELD_SIGNALS if s != signal.SIGTERM])
    else:
        _init_worker()
    threading.Thread(target=_watch_parent, args=(parent,), name="watch-parent", daemon=True).start()


def _watch_parent(parent: int) -> None:
    """End this worker once its parent is gone, whatever ended the parent (SIGKILL included, which leaves the parent
    no chance to stop its workers): the worker is then re-parented, and its parent id changes."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(128 + signal.SIGKILL)


def _quiet_stop(unraisable: object) -> None:
    """``sys.unraisablehook`` of a worker: a stop's ``KeyboardInterrupt`` is not reported, anything else is."""
    if not isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)


def _on_stop(signum: int, frame: object) -> None:
    if _in_task:
        raise KeyboardInterrupt  # unwinds the task (its finally/with blocks run); _run_in_worker then exits
    os._exit(128 + signum)


def _run_in_worker(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)`` in a worker; a stop (SIGTERM) during it ends the process once the task has unwound."""
    global _in_task, _started
    if not _started:
        _init_worker()
        _started = True
    _in_task = True
    try:
        return fn(*args)
    except KeyboardInterrupt:
        os._exit(128 + signal.SIGTERM)
    finally:
        _in_task = False
