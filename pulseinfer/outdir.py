"""Result folders written whole: every command that writes ``--out`` stages it beside the target first.

:func:`results_folder` is entered before any work. It checks that ``--out`` can be written (so an unwritable
path fails in a second, not after the simulation), creates a hidden staging folder beside it
(``.NAME.partial-XXXX`` in the same parent, hence the same file system, with the permissions the umask gives a
new folder) and yields it; the command writes every file there. On success the staging folder replaces
``--out`` in one rename, so a reader sees the previous run's folder or this run's, never a mix. On any error or
Ctrl-C the staging folder is removed and ``--out`` is left exactly as it was.

Only what pulseinfer wrote is replaced. Every results folder holds the marker :data:`MARKER`, which lists the
paths its run wrote (pulseinfer/marker.py). An existing ``--out`` is used only if it is empty, holds a marker,
or is a folder that an enclosing results folder's marker lists (``RESULTS/plots`` of ``simulate --plots``);
any other folder is refused with one line naming it. A re-run leaves the previous run's listed files behind
(no stale table or figure survives) and carries everything else of the old folder, a notes file or a subfolder
of the user's, into the new one untouched (renamed, not copied). What cannot be carried (another file system,
no permission to move it) refuses the run up front; a user's entry at a path this run wrote stops the run
before anything is replaced. A marker of an earlier version, which has no list, claims the file types those
versions wrote (.csv, .parquet, .yaml, .json, .png, .svg, .pdf) at the folder's top and inside ``plots/`` and
``cache/``; anything else there is carried over.

``update=True`` (``pulseinfer calibrate``, which keeps a profile's ``recall_stats``; ``calibrate selection``,
which adds them) starts the staging folder with copies of the folder's pulseinfer files and of the files at
its top, so the command can read them; a copy the run left unchanged gives way to the original, a changed one
replaces it. Commands that write ``--out`` in place (``sweep``, ``search``, ``cases``: a cache or a study
journal that a re-run resumes) call :func:`mark_results` instead.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pulseinfer.errors import UsageError
from pulseinfer.marker import MARKER, Claims, claims_of, plan_carry, read_claims, write_marker, written_claims

__all__ = ["MARKER", "StageKept", "check_writable", "mark_results", "results_folder"]
DEFERRED = (signal.SIGINT, signal.SIGTERM)


def check_writable(out: Path, flag: str = "--out", update: bool = False) -> Claims:
    """Raise UsageError (one line naming ``flag`` and the path) unless ``out`` can be (re)written.

    Creates ``out``'s missing parent folders (an OSError there is a one-line error at the CLI boundary).

    Returns:
        What pulseinfer wrote in an existing ``out`` (empty claims for a new or empty folder, or, with ``update``,
        a folder without a marker).
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out}: exists and is not a folder; give a folder path")
    claims = Claims()
    if out.is_dir():
        found = claims_of(out)
        if found is None and not update and any(out.iterdir()):
            raise UsageError(
                f"{flag} {out}: folder exists, is not empty and was not written by pulseinfer (no {MARKER} marks "
                "it); give a new or empty folder"
            )
        claims = found or Claims()
        _check_carry(out, flag, claims)
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
    return claims


def _check_carry(out: Path, flag: str, claims: Claims) -> None:
    """UsageError naming the first entry of ``out`` that is not pulseinfer's and could not be carried over."""
    device = os.stat(out.absolute().parent).st_dev
    for src, _ in plan_carry(out, None, claims).moves:
        if os.lstat(src).st_dev != device:
            why = "it is on another file system"
        elif not os.access(src.parent, os.W_OK | os.X_OK):
            why = f"{src.parent} is not writable"
        elif src.is_dir() and not src.is_symlink() and not os.access(src, os.W_OK):
            why = "moving a folder needs write permission on it"
        else:
            continue
        raise UsageError(
            f"{flag} {out}: {src.relative_to(out)} was not written by pulseinfer and a re-run cannot carry it into "
            f"the new folder ({why}); move it elsewhere or give another folder"
        )


@contextmanager
def results_folder(out: Path, flag: str = "--out", update: bool = False, command: str = "") -> Iterator[Path]:
    """Stage a results folder; on success it replaces ``out``, on error or Ctrl-C nothing changes.

    The marker (:data:`MARKER`, listing every path the command wrote) is added to the staging folder, and what
    the previous ``out`` holds that pulseinfer did not write is carried into the new one.

    Args:
        out: the folder the user named.
        flag: the option that named it (for messages).
        update: start from copies of an existing ``out``'s pulseinfer files and top-level files.
        command: recorded in the marker.

    Yields:
        The staging folder (beside ``out``) to write every file into.

    Raises:
        UsageError: ``out`` is a file or a folder pulseinfer did not write, holds something that cannot be
            carried over, its parent is not writable, or (after the run, before anything is replaced) the run
            wrote a path where ``out`` holds something of the user's.
        OSError: the staging folder cannot be created (the CLI prints one line).
    """
    claims = check_writable(out, flag, update)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.absolute().parent))
    try:
        os.chmod(stage, 0o777 & ~_umask())
        copied = _copy_for_update(out, stage, claims) if update and out.is_dir() else {}
        yield stage
        claims |= _settle_copies(out, stage, copied)
        write_marker(stage, command, written_claims(stage))
        with _no_interrupt():
            _replace(stage, out, claims, flag)
    except BaseException as exc:
        if not isinstance(exc, StageKept):  # never delete entries of the user's that could not be put back
            shutil.rmtree(stage, ignore_errors=True)
        raise


def mark_results(out: Path, command: str, files: Iterable[str] = (), trees: Iterable[str] = ()) -> None:
    """Create ``out`` (after :func:`check_writable`) as a results folder that ``command`` writes in place.

    Its marker lists ``files`` and ``trees`` (folders whose whole content the command writes) besides what it
    listed before, so a later run that replaces ``out`` removes them and keeps everything else.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = Claims(files=frozenset(files), trees=frozenset(trees))
    write_marker(out, command, (read_claims(out) or Claims()) | written)


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _copy_for_update(out: Path, stage: Path, claims: Claims) -> dict[str, tuple[int, int]]:
    """Copy ``out``'s pulseinfer files and its top-level files into ``stage``. Returns, for each copy of a file
    that is not pulseinfer's, its size and modification time (ns) as copied."""
    _copy_claimed(out, stage, claims)
    copied = {}
    for entry in os.scandir(out):
        if entry.is_file(follow_symlinks=False) and entry.name != MARKER and not claims.owns(entry.name, False):
            shutil.copy2(entry.path, stage / entry.name)
            copied[entry.name] = _signature(stage / entry.name)
    return copied


def _signature(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_size, st.st_mtime_ns


def _copy_claimed(src: Path, dst: Path, claims: Claims) -> None:
    for entry in os.scandir(src):
        is_dir = entry.is_dir(follow_symlinks=False)
        if entry.name == MARKER or not claims.owns(entry.name, is_dir):
            continue
        if is_dir:
            (dst / entry.name).mkdir(exist_ok=True)
            inner = claims.below(entry.name) | (read_claims(Path(entry.path)) or Claims())
            _copy_claimed(Path(entry.path), dst / entry.name, inner)
        else:
            shutil.copy2(entry.path, dst / entry.name, follow_symlinks=False)


def _settle_copies(out: Path, stage: Path, copied: dict[str, tuple[int, int]]) -> Claims:
    """Drop the copies of the user's files that the run left as they were, or made equal to the original (which
    is carried over instead, with any edit made to it meanwhile); the other copies are this run's, and the
    claims returned make them replace the originals."""
    changed = []
    for name, signature in copied.items():
        copy = stage / name
        if not copy.is_file() or copy.is_symlink():
            if os.path.lexists(copy):
                changed.append(name)
        elif _signature(copy) == signature or filecmp.cmp(out / name, copy, shallow=False):
            copy.unlink()
        else:
            changed.append(name)
    return Claims(files=frozenset(changed))


class StageKept(OSError):
    """Entries of the user's, carried into the staging folder, could not be put back; the folder is kept."""


def _replace(stage: Path, out: Path, claims: Claims, flag: str) -> None:
    """Carry the user's entries of ``out`` into ``stage``, then move ``stage`` to ``out`` (an existing ``out`` is
    moved aside first and removed afterwards). On an error every entry is back where it was."""
    if not out.exists():
        os.replace(stage, out)
        return
    carry = plan_carry(out, stage, claims)
    if carry.conflicts:
        raise UsageError(
            f"{flag} {out}: {carry.conflicts[0].relative_to(out)} was not written by pulseinfer and this run wrote "
            f"the same path; nothing was replaced (move it out of the folder and run again)"
        )
    moved = _move(carry.moves, stage)
    try:
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.absolute().parent))
        try:
            os.replace(out, old / "previous")
            try:
                os.replace(stage, out)
            except OSError:
                os.replace(old / "previous", out)  # put the previous run back
                raise
        except OSError:
            shutil.rmtree(old, ignore_errors=True)
            raise
    except OSError:
        _move_back(moved, stage)
        raise
    _clear(old, out, claims)


def _move(moves: list[tuple[Path, Path]], stage: Path) -> list[tuple[Path, Path]]:
    """Rename each entry to its place (creating folders); on an error, put back what moved and raise."""
    done: list[tuple[Path, Path]] = []
    try:
        for src, dst in moves:
            dst.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(dst):  # appeared since the plan; never overwrite
                raise FileExistsError(f"{dst}: appeared while the results were moved into place")
            os.rename(src, dst)
            done.append((src, dst))
    except OSError:
        _move_back(done, stage)
        raise
    return done


def _move_back(done: list[tuple[Path, Path]], stage: Path) -> None:
    """Undo renames; StageKept (naming ``stage``, which then stays) if one cannot be undone."""
    failed = []
    for src, dst in reversed(done):
        try:
            os.rename(dst, src)
        except OSError:
            failed.append(dst)
    if failed:
        raise StageKept(f"{failed[0]}: could not be put back into its folder; it is in {stage}, which is kept")


def _clear(old: Path, out: Path, claims: Claims) -> None:
    """Remove the previous folder, moved aside into ``old``; an entry of the user's that appeared in it during the
    run is carried into ``out`` first (if that fails, ``old`` is kept and named)."""
    previous = old / "previous"
    try:
        carry = plan_carry(previous, out, claims)
        for src, dst in carry.moves:
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, dst)
        keep = bool(carry.conflicts)
    except OSError:
        keep = True
    if keep:
        print(f"note: kept {old}: it holds files written into {out} during the run", file=sys.stderr)
        return
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _no_interrupt() -> Iterator[None]:
    """Block Ctrl-C and SIGTERM for the renames (an exception between them would leave no ``out``, or entries of
    the user's in a staging folder that is then removed); the kernel keeps a signal sent meanwhile pending and
    delivers it when the block ends, so the usual handler (KeyboardInterrupt, the CLI's Terminated) runs then."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, DEFERRED)
