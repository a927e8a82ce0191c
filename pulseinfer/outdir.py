"""Result folders written whole: every command that writes ``--out`` stages it beside the target first.

:func:`results_folder` is entered before any work. It checks that ``--out`` can be written (so an unwritable
path fails in a second, not after the simulation), creating nothing until every check passed, then creates a
hidden staging folder beside it (``.NAME.partial-PID-XXXX`` in the same parent, hence the same file system, with the
permissions the umask gives a new folder) and yields it (a staging folder a killed run left, whose PID is gone, is
removed first, with a note: :func:`remove_stale_stages`); the command writes every file there. On success the
staging folder replaces ``--out`` in one rename, so a reader sees the previous run's folder or this run's, never
a mix. On any error, Ctrl-C, SIGTERM or SIGHUP the staging folder (and any parent folder the run created) is
removed and ``--out`` is left exactly as it was; the renames themselves hold those signals until they are done,
so no ``.NAME.old-XXXX`` folder outlives a run.

Only what pulseinfer wrote is replaced, and only by the command that wrote it. Every results folder holds the
marker :data:`MARKER`, which lists the paths its run wrote and the command (``written_by``; pulseinfer/marker.py).
An existing ``--out`` is used only if it is empty, or its marker was written by the same command (a re-run;
``calibrate`` and ``calibrate selection`` count as one), or it is the figure folder ``plots`` an enclosing results
folder lists, for ``pulseinfer plot``; a folder another command wrote is refused with one line naming it and that
command, and so is any other non-empty folder. A symbolic link as ``--out`` is refused (it would be replaced by a
folder, not followed). A re-run leaves the previous run's listed files behind
(no stale table or figure survives) and carries everything else of the old folder, a notes file or a subfolder
of the user's, into the new one untouched (renamed, not copied). What cannot be carried (another file system,
no permission to move it) refuses the run up front; a user's entry at a path this run wrote stops the run
before anything is replaced. A marker of an earlier version, which has no list, claims the file types those
versions wrote (.csv, .parquet, .yaml, .json, .png, .svg, .pdf) at the folder's top and inside ``plots/`` and
``cache/``; anything else there is carried over.

``update=True`` (``pulseinfer calibrate``, which keeps a profile's ``recall_stats``; ``calibrate selection``,
which adds them) starts the staging folder with copies of the folder's pulseinfer files and of the files at
its top, so the command can read them; a copy the run left unchanged gives way to the original, a changed one
replaces it (the folder must still be empty or written by calibrate). Commands that write ``--out`` in place
(``sweep``, ``search``, ``cases``: a cache or a study journal that a re-run resumes) call
:func:`pulseinfer.in_place.mark_results` instead.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pulseinfer.errors import UsageError
from pulseinfer.marker import (
    MARKER,
    Claims,
    claimed_by,
    claims_of,
    plan_carry,
    read_claims,
    read_writer,
    write_marker,
    written_claims,
)
from pulseinfer.provenance import wrote

__all__ = ["MARKER", "StageKept", "check_owner", "check_writable", "make_parents", "results_folder", "same_command"]
FIGURES = "plots"  # the figure folder inside a results folder, which `pulseinfer plot` may (re)draw


def check_writable(out: Path, command: str, flag: str = "--out") -> Claims:
    """Raise UsageError (one line naming ``flag`` and the path) unless ``command`` may (re)write ``out``.

    Creates nothing: a missing parent folder is checked through its nearest existing ancestor (the parents are
    created by :func:`results_folder` or :func:`pulseinfer.in_place.mark_results`, once every input check has passed).

    Args:
        out: the folder the user named.
        command: the sub-command (``simulate``, ``calibrate selection``); an existing results folder may be
            (re)written only by the command that wrote it (:func:`same_command`).
        flag: the option that named ``out`` (for messages).

    Returns:
        What pulseinfer wrote in an existing ``out`` (empty claims for a new or empty folder).
    """
    if out.name in ("", ".", ".."):
        raise UsageError(f"{flag} {out}: give the folder by a path that ends in its name, not in . or ..")
    try:
        str(out.absolute()).encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system took that are not UTF-8: pyarrow cannot name its files
        shown = str(out).encode("utf-8", "replace").decode("utf-8")
        raise UsageError(
            f"{flag} {shown}: the path is not valid UTF-8 (shown with ?); rename it or give another"
        ) from None
    if out.is_symlink():
        target = os.path.realpath(out)
        if out.exists():
            raise UsageError(f"{flag} {out}: is a symbolic link to {target}; give {target} itself")
        raise UsageError(f"{flag} {out}: is a symbolic link to {target}, which does not exist; give a folder path")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out}: exists and is not a folder; give a folder path")
    claims = Claims()
    if out.is_dir():
        claims = check_owner(out, flag, command)
        _check_carry(out, flag, claims)
    parent = out.absolute().parent
    while not os.path.lexists(parent):
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {out}: a parent of it, {parent}, is a file, not a folder; give a folder path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: cannot write into {parent} (permission denied)")
    try:  # the results are staged beside `out` (results_folder): some file systems refuse folders anyway
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=parent))
    except OSError as exc:
        raise UsageError(f"{flag} {out}: cannot create a folder in {parent} ({exc.strerror})") from None
    return claims


def same_command(writer: str, command: str) -> bool:
    """Whether the marker's ``writer`` (``pulseinfer calibrate``) and ``command`` (``calibrate selection``) are one
    command: the same first word (``calibrate selection`` adds to what ``calibrate`` wrote, and back)."""
    return writer.split()[1:2] == command.split()[:1]


def check_owner(out: Path, flag: str, command: str) -> Claims:
    """The claims of the existing folder ``out`` if ``command`` may replace it; UsageError otherwise.

    Allowed: a folder whose own marker ``command`` wrote; an empty folder that no results folder claims; the figure
    folder ``plots`` a results folder lists, for ``plot``. Refused: a folder another command wrote (naming it),
    a folder that is part of another run's results, any other non-empty folder."""
    writer = read_writer(out)
    if writer is not None:
        if not writer:
            raise UsageError(
                f"{flag} {out}: its {MARKER} marker does not name the command that wrote it, so nothing in it is "
                "replaced; give another folder"
            )
        if not same_command(writer, command):
            raise UsageError(
                f"{flag} {out}: holds the results of `{writer}` (its {MARKER} marker says so), which only a re-run "
                f"of `{writer}` may replace, not `pulseinfer {command}`; give another folder"
            )
        return claims_of(out) or Claims()
    holder = claimed_by(out)
    if holder is None:
        if any(out.iterdir()):
            raise UsageError(
                f"{flag} {out}: folder exists, is not empty and was not written by pulseinfer (no {MARKER} marks "
                "it); give a new or empty folder"
            )
        return Claims()
    folder, writer, in_tree = holder
    if command == "plot" and out.name == FIGURES and not in_tree:
        return claims_of(out) or Claims()
    raise UsageError(
        f"{flag} {out}: is part of the results of `{writer or 'pulseinfer'}` in {folder}, which only a re-run of "
        "that command may replace; give another folder"
    )


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
def results_folder(out: Path, command: str, flag: str = "--out", update: bool = False) -> Iterator[Path]:
    """Stage a results folder; on success it replaces ``out``, on error or a signal nothing changes.

    The marker (:data:`MARKER`, listing every path the command wrote) is added to the staging folder, and what
    the previous ``out`` holds that pulseinfer did not write is carried into the new one.

    Args:
        out: the folder the user named.
        command: the sub-command, recorded in the marker (only it may later replace the folder).
        flag: the option that named it (for messages).
        update: start from copies of an existing ``out``'s pulseinfer files and top-level files.

    Yields:
        The staging folder (beside ``out``) to write every file into.

    Raises:
        UsageError: see :func:`check_writable`; also (after the run, before anything is replaced) the run wrote a
            path where ``out`` holds something of the user's.
        OSError: the staging folder cannot be created (the CLI prints one line).
    """
    claims = check_writable(out, command, flag)
    created = make_parents(out, flag)  # removed again if the run fails
    stage = None
    try:
        remove_stale_stages(out)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.absolute().parent))
        os.chmod(stage, 0o777 & ~_umask())
        copied = _copy_for_update(out, stage, claims) if update and out.is_dir() else {}
        yield stage
        claims |= _settle_copies(out, stage, copied)
        write_marker(stage, command, written_claims(stage))
        from workers import signals_held  # the one hold of SIGINT/SIGTERM/SIGHUP; sim is loaded by now

        with signals_held():  # an exception between the renames would leave no out, or a .NAME.old-XXXX folder
            _replace(stage, out, claims, flag)
        wrote(out)
    except BaseException as exc:
        if stage is not None and not isinstance(exc, StageKept):  # never delete the user's entries put there
            shutil.rmtree(stage, ignore_errors=True)
        for folder in reversed(created):
            try:
                os.rmdir(folder)  # only while empty
            except OSError:
                break
        raise


STALE_UNNAMED_S = 3600.0  # a staging folder without its writer's process id (older versions) is stale after this


def remove_stale_stages(out: Path) -> list[Path]:
    """Remove the staging folders of ``out`` that a run killed outright left behind (SIGKILL, a power cut: no
    ``finally`` ran) and say so on stderr, one line each. A staging folder is named ``.NAME.partial-PID-XXXX``; it is
    stale when process PID is gone (one of another user, or whose process id cannot be checked, is left alone); a
    folder of an earlier version, without the id, when it is older than :data:`STALE_UNNAMED_S`. A stale folder that
    holds its run's marker was killed while it replaced ``out`` (entries of the old folder may have been moved into
    it): it is left, and named. Returns the folders removed."""
    import glob
    import sys
    import time

    removed = []
    for stage in out.absolute().parent.glob(f".{glob.escape(out.name)}.partial-*"):
        pid_text = stage.name.rsplit(".partial-", 1)[1].split("-", 1)[0]
        try:
            if pid_text.isdigit():
                os.kill(int(pid_text), 0)  # raises ProcessLookupError when the writer is gone
                continue
            if time.time() - stage.stat().st_mtime < STALE_UNNAMED_S:
                continue
        except ProcessLookupError:
            pass
        except OSError:  # PermissionError: another user's live process; a folder gone meanwhile
            continue
        if not stage.is_dir() or stage.is_symlink():
            continue
        if (stage / MARKER).exists():  # killed while replacing --out: the old folder's entries may be in it
            print(f"note: {stage} is the staging folder of an earlier run killed while it replaced {out}; it may "
                  f"hold files that were in {out}: left as it is, look there", file=sys.stderr)  # fmt: skip
            continue
        shutil.rmtree(stage, ignore_errors=True)
        removed.append(stage)
        print(f"note: removed {stage}, the staging folder of an earlier run that was killed", file=sys.stderr)
    return removed


def make_parents(out: Path, flag: str) -> list[Path]:
    """Create ``out``'s missing parent folders; returns those created, outermost first. UsageError if one cannot
    be created."""
    created = []
    for parent in reversed(out.absolute().parents):
        if os.path.lexists(parent):
            continue
        try:
            parent.mkdir()
        except FileExistsError:  # made meanwhile by someone else
            continue
        except OSError as exc:
            for folder in reversed(created):
                os.rmdir(folder)
            raise UsageError(f"{flag} {out}: cannot create its parent folder {parent} ({exc.strerror})") from None
        created.append(parent)
    return created


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
    """Remove the previous folder, moved aside into ``old``. An entry of the user's that appeared in it during the
    run is carried into ``out`` first; one at a path this run wrote goes into a new folder ``out/kept-XXXX``
    (named in a note). Only if a move fails is ``old`` kept, named in a note."""
    previous = old / "previous"
    try:
        carry = plan_carry(previous, out, claims)
        for src, dst in carry.moves:
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, dst)
        if carry.conflicts:
            kept = Path(tempfile.mkdtemp(prefix="kept-", dir=out))
            os.chmod(kept, 0o777 & ~_umask())
            for src in carry.conflicts:
                dst = kept / src.relative_to(previous)
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dst)
            print(f"note: {kept}: files written into {out} during the run at paths the run also wrote", file=sys.stderr)
    except OSError as exc:
        print(f"note: kept {old}: files written into {out} during the run could not be moved ({exc})", file=sys.stderr)
        return
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(old):
        print(f"note: could not remove {old}, the previous {out}; remove it by hand", file=sys.stderr)
