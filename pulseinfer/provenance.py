"""What a results folder records about the run that wrote it: the command line, pulseinfer's version, the date, the
commit of the checkout it ran from.

:func:`pulseinfer.cli.main` opens :func:`invocation` around the sub-command; :func:`pulseinfer.marker.write_marker`
writes :func:`current` into the folder's marker, where the report page (pulseinfer/page/) reads it. Outside
:func:`invocation` (a library call, a test calling a function directly) there is no command line, and nothing is
recorded for it.
"""

from __future__ import annotations

import datetime
import platform
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from pathlib import Path

from pulseinfer import __version__

_CURRENT: ContextVar[dict | None] = ContextVar("pulseinfer_invocation", default=None)


@contextmanager
def invocation(argv: list[str]) -> Iterator[list[Path]]:
    """Record ``pulseinfer ARGV`` as the command line of the results folders written inside the block (``argv``:
    the arguments after ``pulseinfer``, as :func:`pulseinfer.cli.main` received them).

    Yields:
        The results folders written inside the block, in order, as :func:`wrote` adds them (``--report``'s pages);
        each a ``Path``, or for a folder written in place (:func:`pulseinfer.in_place.mark_results`) an
        :class:`InPlace` holding it, which the caller settles once the command succeeded.
    """
    written: list = []
    token = _CURRENT.set({"command_line": shlex.join(["pulseinfer", *argv]), "written": written})
    try:
        yield written
    finally:
        _CURRENT.reset(token)


def current() -> dict:
    """The provenance of a folder written now: ``command_line`` (None outside :func:`invocation`), ``version``,
    ``written_at`` (UTC, ISO 8601, seconds), ``commit`` (the checkout's HEAD, None outside a git checkout),
    ``uncommitted`` (whether tracked files differ from it; None outside a checkout) and ``python``."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    running = _CURRENT.get() or {}
    return {
        "command_line": running.get("command_line"),
        "version": __version__,
        "written_at": now.isoformat().replace("+00:00", "Z"),
        "commit": checkout_commit(),
        "uncommitted": uncommitted_changes() if checkout_commit() else None,
        "python": platform.python_version(),
    }


class InPlace(Path().__class__):
    """A results folder the running command writes in place (sweep, search, cases): its marker keeps the previous
    run's provenance, and its previous report page, until the command succeeds (pulseinfer/in_place.py
    ``settle_in_place``)."""


def wrote(folder: Path, in_place: bool = False) -> None:
    """Note that the running command writes (staged: has written) the results folder ``folder``
    (pulseinfer/outdir.py, pulseinfer/in_place.py); ``in_place``: it writes there directly, and is settled only on
    success."""
    running = _CURRENT.get()
    entry = InPlace(folder) if in_place else Path(folder)
    if running is not None and entry not in running["written"]:
        running["written"].append(entry)


@cache
def checkout_commit() -> str | None:
    """The HEAD commit of the git checkout pulseinfer runs from (an editable install), or None (an installed wheel,
    no git, or a checkout git cannot read). Asked once per process."""
    commit = (_git("rev-parse", "HEAD") or "").strip()
    return commit if len(commit) == 40 else None


def uncommitted_changes() -> bool | None:
    """Whether the checkout's tracked files differ from its HEAD (``git status``), so the commit alone does not say
    what ran; None if git cannot tell. Asked at each call (a session edits between runs)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status.strip())


def _git(*args: str) -> str | None:
    """``git ARGS`` run in pulseinfer's own folder: its standard output, or None (no git, not a checkout, a failure,
    more than 5 s)."""
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None
