"""``pulseinfer`` — a thin argparse shell over functions that return tables.

Each sub-command lives in ``pulseinfer/commands/<name>.py`` with ``add_parser(subparsers)`` and
``run(args) -> int``; command modules import their heavy packages (sim, torch, matplotlib) inside
``run`` only, so building the parser is cheap and ``pulseinfer simulate`` never loads torch.

Error boundary: ``run`` does its work and raises; :func:`main` alone turns errors into output and exit status
(the statuses live in ``pulseinfer.errors``):

- an input error → one ``error: <message>`` line on stderr, exit 2. Input errors are the classes named in
  :data:`INPUT_ERRORS` (the libraries' typed errors, e.g. sim's ``ScenarioError``, traces' ``TraceError``, and
  the CLI's own ``UsageError``) and their subclasses; sub-commands wrap library calls that check input with a
  plain ``ValueError`` in ``pulseinfer.errors.usage_errors`` and map a library's field names to their flags
  with ``pulseinfer.errors.flag_names``;
- an ``OSError`` (a path the user named cannot be read or written) → one ``error:`` line, exit 2;
- ``KeyboardInterrupt`` (Ctrl-C, SIGINT) → one ``interrupted`` line, exit 130, no traceback; SIGTERM → one
  ``terminated`` line, exit 143; SIGHUP (the terminal or ssh session closed) → one ``hangup`` line, exit 129:
  while a sub-command runs, SIGTERM raises ``pulseinfer.errors.Terminated`` and SIGHUP its subclass ``HungUp``
  (``KeyboardInterrupt`` subclasses) in the main thread, so all three unwind the same way: worker pools stop their
  workers (workers/__init__.py), a staging folder is removed (pulseinfer/outdir.py), what finished is kept.
  A SIGHUP the process started ignoring (``nohup``) stays ignored;
- a bug the simulator caught itself (the classes in :data:`BUG_REPORTS`, e.g. sim's ``PhysicsError``: a run broke
  a physical bound) → one ``bug: <message>`` line naming the check and the scenario, exit 1, no traceback;
- anything else propagates with its traceback (exit 1): it is a bug.

Input errors are recognised by (top-level package, class name) along the exception's MRO rather than by
importing the classes, so the boundary loads nothing a sub-command did not (``pulseinfer trace`` never loads
sim, ``pulseinfer simulate`` never loads torch), and a class that moves within its package still matches
(tests/test_cli_boundary.py checks that every listed name exists).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pulseinfer.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, HungUp, Terminated
from pulseinfer.provenance import invocation

__all__ = ["COMMANDS", "EXIT_BAD_INPUT", "INPUT_ERRORS", "build_parser", "entry", "error_message", "main"]

COMMANDS = [
    "simulate",
    "search",
    "plan",
    "sweep",
    "plot",
    "calibrate",
    "validate",
    "cases",
    "accuracy",
    "engine_bench",
    "trace",
    "report",
]  # command modules, help order

# top-level package → names of its exception classes that mean bad input (subclasses included)
INPUT_ERRORS: dict[str, frozenset[str]] = {
    "pulseinfer": frozenset({"UsageError"}),
    "sim": frozenset({"ScenarioError", "CapacityError"}),
    "study": frozenset({"SpaceError", "SearchError", "PlanError", "SweepError", "ExecutorError", "AccuracyError"}),
    "traces": frozenset({"TraceError"}),
    "calibrate": frozenset({"CaseError", "ServingCaseError"}),
    "plots": frozenset({"MissingData"}),
    "engine": frozenset({"ModelNotInstalled"}),
}
# top-level package → names of its exception classes that report a bug the library caught in itself
BUG_REPORTS: dict[str, frozenset[str]] = {"sim": frozenset({"PhysicsError"})}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulseinfer",
        description="Simulate long-context LLM decode serving with sparse KV-cache offloading.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"pulseinfer.commands.{name}")
        command = module.add_parser(sub)
        command.set_defaults(run=module.run)
        if name not in UNREPORTED:
            _add_report_flag(command)
    return parser


UNREPORTED = {"plot", "trace", "report"}  # commands that write no results folder of their own: no --report


def _add_report_flag(parser: argparse.ArgumentParser) -> None:
    """``--report`` on ``parser`` and on each of its own sub-commands (``calibrate serving``). Set only where given
    (a sub-command's default would otherwise overwrite ``calibrate --report serving``)."""
    parser.add_argument(
        "--report",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also write OUT/report.html: one self-contained page with the verdict, the key table, every figure "
        "and the provenance (as `pulseinfer report OUT`)",
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _add_report_flag(child)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the sub-command, and map what it raises to one stderr line and an exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    empty = _empty_option(argv)
    if empty is not None:  # an empty value never means "all" or "the default": said, not guessed
        print(f"error: {empty} '': an empty value; give a value, or leave {empty} out for its default", file=sys.stderr)
        return EXIT_BAD_INPUT
    args = build_parser().parse_args(argv)
    try:
        with _signals_raise(), invocation(argv) as written:
            if getattr(args, "report", False):
                _check_report_targets(args)
            status = args.run(args)
            if status == 0:
                _settle(written, getattr(args, "report", False))
            return status
    except Terminated as exc:  # SIGTERM, or SIGHUP (HungUp)
        print(exc.line, file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        message = error_message(exc)
        if message is None:
            if not _named_in(exc, BUG_REPORTS):
                raise
            print(f"bug: {_one_line(exc)}", file=sys.stderr)
            return EXIT_FAILED
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT


# signal → the exception its handler raises inside a sub-command (SIGHUP: POSIX only)
RAISED = {signal.SIGTERM: Terminated, **({signal.SIGHUP: HungUp} if hasattr(signal, "SIGHUP") else {})}


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Inside the block SIGTERM raises :class:`~pulseinfer.errors.Terminated` and SIGHUP
    :class:`~pulseinfer.errors.HungUp` (main thread only: elsewhere Python cannot install a handler); a signal
    that is ignored (SIGHUP under ``nohup``) stays ignored. The previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        signum: signal.signal(signum, _raise_for) for signum in RAISED if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _raise_for(signum: int, frame: object) -> None:
    raise RAISED[signum]


def _check_report_targets(args: argparse.Namespace) -> None:
    """``--report``, before the command runs: a ``report.html`` of the user's in the named results folder (or one
    that cannot be written) is refused now, not after the work (pulseinfer/page ``check_target``)."""
    from pathlib import Path

    from pulseinfer.page import check_target

    for name in ("out", "selection_out", "serving_out"):
        folder = getattr(args, name, None)
        if folder is not None and Path(folder).is_dir():
            check_target(Path(folder))


def _settle(folders: list, report: bool) -> None:
    """After a command succeeded: each folder it wrote in place records this run's provenance and loses its previous
    report page (pulseinfer/in_place.py ``settle_in_place``); with ``--report``, each folder gets its page
    (pulseinfer/page/)."""
    from pulseinfer.in_place import settle_in_place
    from pulseinfer.provenance import InPlace

    for folder in folders:
        if isinstance(folder, InPlace):
            settle_in_place(folder)
    if not report:
        return
    from pulseinfer.page import write_report

    if not folders:
        print("note: --report: this run wrote no results folder, so there is no report page", file=sys.stderr)
    for folder in folders:
        print(f"wrote {write_report(folder)}")


def entry() -> None:
    """The process's entry point (the ``pulseinfer`` script and ``python -m pulseinfer``): :func:`main`, then exit
    with its status.

    Before the interpreter shuts down, every object still alive moves to the garbage collector's permanent
    generation (``gc.freeze``). Shutdown otherwise runs full collections over all of them, mostly the modules of
    pandas, pyarrow and pydantic: 150-220 ms after a ``simulate`` run on a 2-core machine, 26 ms frozen
    (measured side by side). atexit handlers and stream flushes still run; what the freeze skips is the
    finalizers of objects caught in garbage cycles at exit, and nothing here relies on one (the commands write
    their files inside ``with`` blocks). It freezes the process that runs it, so it is meant as a process's last
    act: call :func:`main` from a long-lived process (tests, a notebook), which never freezes.

    Raises:
        SystemExit: always, with :func:`main`'s status.
    """
    status = main()
    gc.freeze()
    sys.exit(status)


def _empty_option(argv: list[str]) -> str | None:
    """The first ``--option`` given an empty or blank value (``--policies ''``, ``--slo=``), or None. ``--set key=``
    is not one (an empty ``--set`` value is YAML's null, by design: sim/config/loader.py)."""
    for i, token in enumerate(argv):
        if not token.startswith("--") or token == "--":
            continue
        flag, sep, value = token.partition("=")
        if sep and not value.strip() and flag != "--set":
            return flag
        if not sep and i + 1 < len(argv) and not argv[i + 1].strip() and flag != "--set":
            return flag
    return None


def error_message(exc: BaseException) -> str | None:
    """The one-line message for an input or path error, or a worker killed from outside; None for anything else (a
    bug)."""
    from concurrent.futures.process import BrokenProcessPool

    if isinstance(exc, BrokenProcessPool):  # the out-of-memory killer, or a kill of the worker's pid
        return ("a worker process died while running a task (killed from outside: out of memory? fewer workers, "
                "--jobs or run.workers, need less memory)")  # fmt: skip
    if isinstance(exc, OSError):
        if exc.filename is not None and exc.strerror:
            return f"{exc.filename}: {exc.strerror}"
        return _one_line(exc)
    return _one_line(exc) if _named_in(exc, INPUT_ERRORS) else None


def _named_in(exc: BaseException, names: dict[str, frozenset[str]]) -> bool:
    """Whether a class along ``exc``'s MRO is named in ``names`` (top-level package → class names)."""
    return any(cls.__name__ in names.get(cls.__module__.partition(".")[0], ()) for cls in type(exc).__mro__)


def _one_line(exc: BaseException) -> str:
    """The message with any line breaks folded into spaces (the boundary prints exactly one line)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or exc.__class__.__name__
