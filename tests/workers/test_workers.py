"""The worker pool's start-up windows (workers/__init__.py): a signal while ``submit`` spawns a worker waits until the
spawn is done, and a new worker holds SIGINT and SIGHUP off from its first act."""

from __future__ import annotations

import os
import signal

import pytest

from workers import WorkerPool

POSIX = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")


@pytest.fixture(autouse=True)
def _ctrl_c_not_ignored():
    """A shell starts a background job with SIGINT ignored, and a process that ignores it keeps ignoring a held one
    (by design, as under ``nohup``): give these tests Python's own Ctrl-C handler, as a terminal would."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _worker_signals() -> tuple[bool, bool, bool]:
    """In a worker: (SIGINT blocked, SIGHUP blocked, SIGINT ignored)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return signal.SIGINT in blocked, signal.SIGHUP in blocked, signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@POSIX
def test_a_worker_holds_off_the_terminal_signals():
    """A Ctrl-C or hangup reaches the whole process group; a worker leaves the decision to its parent, from before
    it imports the simulator (blocked by its initializer) and after (ignored)."""
    with WorkerPool(1) as pool:
        assert pool.submit(_worker_signals).result(timeout=120) == (True, True, True)


@POSIX
def test_a_signal_during_submit_arrives_after_the_spawn(monkeypatch):
    """``submit`` can spawn a worker; a signal in the middle would leave it half-started (it dies with an EOFError
    traceback). The signal is delivered once the submit is done."""
    pool = WorkerPool(1)
    done = []

    def submit(*args):
        os.kill(os.getpid(), signal.SIGINT)
        done.append("spawned")  # without the hold, KeyboardInterrupt is raised before this line
        return None

    monkeypatch.setattr(pool._pool, "submit", submit)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.submit(print)
        assert done == ["spawned"]
    finally:
        pool._pool.shutdown()


@POSIX
def test_a_signal_held_while_submit_fails_is_still_delivered(monkeypatch):
    """A Ctrl-C held during a submit that raises is not lost: it is delivered, and wins (exit 130, not a
    traceback)."""
    pool = WorkerPool(1)

    def submit(*args):
        os.kill(os.getpid(), signal.SIGINT)
        raise RuntimeError("cannot schedule new futures after shutdown")

    monkeypatch.setattr(pool._pool, "submit", submit)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            pool.submit(print)
        assert isinstance(caught.value.__context__, RuntimeError)
    finally:
        pool._pool.shutdown()
