"""Result folders written whole: every command that writes ``--out`` stages it beside the target first.

:func:`results_folder` is entered before any work. It checks that ``--out`` can be written (so an unwritable
path fails in a second, not after the simulation), creates a hidden staging folder beside it
(``.NAME.partial-XXXX`` in the same parent, hence the same file system) and yields it; the command writes every
file there. On success the staging folder replaces ``--out`` in one rename, so a reader sees the previous run's
folder or this run's, never a mix. On any error or Ctrl-C the staging folder is removed and ``--out`` is left
exactly as it was.

A re-run replaces the whole folder (no stale figures or tables of an earlier run survive). To keep that from
deleting anything else, only a folder pulseinfer wrote (it holds :data:`MARKER`, or lies in one, or holds only
figures) or an empty folder is replaced;
any other existing folder is refused with one line. ``update=True`` (``pulseinfer calibrate selection``, which
adds ``recall_stats`` to an existing calibration folder) starts the staging folder as a copy of ``--out``.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pulseinfer.errors import UsageError

MARKER = ".pulseinfer-results"  # written into every results folder; a re-run may replace such a folder
FIGURE_SUFFIXES = {".png", ".svg", ".pdf"}


def check_writable(out: Path, flag: str = "--out", update: bool = False) -> None:
    """Raise UsageError (one line naming ``flag`` and the path) unless ``out`` can be (re)written as a whole.

    Creates ``out``'s missing parent folders (an OSError there is a one-line error at the CLI boundary).
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out}: exists and is not a folder; give a folder path")
    if out.is_dir() and not update and not _ours(out):
        raise UsageError(
            f"{flag} {out}: folder exists, is not empty and was not written by pulseinfer; a run replaces its "
            "whole --out folder, so give a new or empty folder (or remove this one)"
        )
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{flag} {out}: a parent of it is a file, not a folder; give a folder path") from None
    except OSError as exc:
        raise UsageError(f"{flag} {out}: cannot create its parent folder {parent} ({exc.strerror})") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: cannot write into {parent} (permission denied)")
    try:  # the results are staged beside `out` (results_folder): some file systems refuse folders anyway
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=parent))
    except OSError as exc:
        raise UsageError(f"{flag} {out}: cannot create a folder in {parent} ({exc.strerror})") from None


def _ours(folder: Path) -> bool:
    """Empty, a results folder (:data:`MARKER`), a subfolder of one, or a figure folder (only figure files)."""
    entries = list(folder.iterdir())
    figures = all(p.is_file() and p.suffix in FIGURE_SUFFIXES for p in entries)
    return figures or (folder / MARKER).exists() or (folder.parent / MARKER).exists()


@contextmanager
def results_folder(
    out: Path, flag: str = "--out", update: bool = False, command: str = "", marker: bool = True
) -> Iterator[Path]:
    """Stage a results folder; on success it replaces ``out`` whole, on error or Ctrl-C nothing changes.

    Args:
        out: the folder the user named.
        flag: the option that named it (for messages).
        update: start from a copy of an existing ``out`` instead of an empty folder.
        command: recorded in the marker file.
        marker: write :data:`MARKER` (a figure folder, which lists only figures, goes without).

    Yields:
        The staging folder (beside ``out``) to write every file into.

    Raises:
        UsageError: ``out`` is a file, a foreign non-empty folder, or its parent is not writable.
        OSError: the staging folder cannot be created (the CLI prints one line).
    """
    check_writable(out, flag, update)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.absolute().parent))
    try:
        if update and out.is_dir():
            shutil.copytree(out, stage, dirs_exist_ok=True)
        if marker:
            (stage / MARKER).write_text(f"written by pulseinfer {command}; a re-run replaces this whole folder\n")
        yield stage
        with _no_interrupt():
            _replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _replace(stage: Path, out: Path) -> None:
    """Move ``stage`` to ``out``; an existing ``out`` is moved aside first and removed afterwards."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.absolute().parent))
        os.replace(out, old / "previous")
    try:
        os.replace(stage, out)
    except OSError:
        if old is not None:
            os.replace(old / "previous", out)  # put the previous run back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _no_interrupt() -> Iterator[None]:
    """Defer Ctrl-C for the two renames (a KeyboardInterrupt between them would leave no ``out``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
