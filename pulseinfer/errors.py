"""Exit statuses, the CLI's own input error, and two ways to hand a library's error to the boundary.

``pulseinfer.cli.main`` is the one place that turns errors into an ``error:`` line and an exit status (see its
docstring). Sub-commands raise; they never print ``error:`` themselves. This module imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

EXIT_OK = 0
EXIT_FAILED = 1  # the run finished but produced nothing usable (also Python's status for an uncaught exception)
EXIT_BAD_INPUT = 2  # one ``error:`` line naming the flag or field, the value and what was expected
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM)
EXIT_HANGUP = 129  # SIGHUP (128 + SIGHUP): the terminal or ssh session closed


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised in the main thread by the handler ``pulseinfer.cli.main`` installs.

    A ``KeyboardInterrupt`` subclass, so every cleanup written for Ctrl-C runs for SIGTERM too (a results
    folder's staging folder is removed, worker pools stop their workers, Optuna marks the running trial failed);
    ``main`` tells the two apart for the exit status: it prints :attr:`line` and exits with :attr:`status`.
    """

    line = "terminated"
    status = EXIT_TERMINATED


class HungUp(Terminated):
    """SIGHUP arrived (the terminal or ssh session closed): stops the run as SIGTERM does, with its own line and
    status. Not raised when the process started with SIGHUP ignored (``nohup``)."""

    line = "hangup"
    status = EXIT_HANGUP


class UsageError(ValueError):
    """An argument problem the CLI itself finds (a bad flag value, a missing extra); the boundary prints it."""


@contextmanager
def usage_errors(prefix: str = "") -> Iterator[None]:
    """Treat a ``ValueError`` from the wrapped library call as bad input, its message led by ``prefix``.

    For libraries that check their input with plain ``ValueError`` (plots, engine, calibrate, study.slo): wrap the
    call that validates, not a whole run, so a real bug elsewhere keeps its traceback.

    Raises:
        UsageError: from any ``ValueError`` (typed ones included) raised inside the block; a message that starts
            with a flag (``--contexts: ...``) is not led by ``prefix``.
    """
    try:
        yield
    except ValueError as exc:
        lead = "" if str(exc).startswith("--") else prefix  # a message that names its own flag keeps it first
        raise UsageError(f"{lead}{exc}") from exc


@contextmanager
def flag_names(flags: Mapping[str, str]) -> Iterator[None]:
    """Lead a library error by the flag the user typed, for errors that name their field in ``exc.field``.

    Args:
        flags: field or parameter name (``total_trials``, ``target_rate_per_s``) → CLI flag (``--trials``).

    Raises:
        UsageError: ``"<flag>: <message>"`` for an error whose ``field`` is in ``flags``; any other error
            passes through unchanged.
    """
    try:
        yield
    except ValueError as exc:
        flag = flags.get(getattr(exc, "field", None) or "")
        if flag is None:
            raise
        raise UsageError(f"{flag}: {exc}") from exc
