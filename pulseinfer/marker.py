"""The results marker: which paths of a results folder pulseinfer wrote, so a re-run replaces those and no others.

Every folder a command writes (``--out``) holds :data:`MARKER` at its top, a small JSON file::

    {"pulseinfer_results": 2, "written_by": "pulseinfer simulate", "note": "...",
     "files": ["plots/tpot_cdf.png", "requests.csv", ...], "folders": ["plots"], "trees": []}

``written_by`` names the command: only a re-run of it may replace the folder (pulseinfer/outdir.py).
``files`` and ``folders`` are the paths (relative, ``/``-separated) the command created; ``trees`` are folders
whose whole content is pulseinfer's (``sweep``'s ``cache/``). Nothing else in the folder is pulseinfer's: a notes
file or a subfolder of your own is carried into the new folder by a re-run (pulseinfer/outdir.py).

Claims add up: a folder inside a results folder (``R/plots``) is pulseinfer's where ``R``'s marker lists it as a
folder, and then what ``R`` lists under ``plots/`` is pulseinfer's too, as is what its own marker lists (the
figures of ``pulseinfer plot R``). A marker found inside a folder that is *not* claimed (a results folder you
nested, ``R/exp2``) is another run's: its files give way only to a file this run writes at the same path.

A marker of an earlier version (plain text, no list) claims what those versions wrote: files ending in
.csv/.parquet/.yaml/.json/.png/.svg/.pdf at its top and anywhere inside ``plots/`` or ``cache/``; anything else
(``notes.txt``, ``my_notes/``) is the user's. Its first words name the command that wrote it
(``written by pulseinfer sweep; ...``), read by :func:`read_writer` as ``written_by`` is.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

MARKER = ".pulseinfer-results"
FORMAT = 2  # the "pulseinfer_results" value of a marker with lists; a marker without it is an earlier version's
LEGACY_SUFFIXES = {".csv", ".parquet", ".yaml", ".json", ".png", ".svg", ".pdf"}
LEGACY_FOLDERS = {"plots", "cache"}
LEGACY_WRITER = re.compile(r"written by (pulseinfer(?: [a-z][a-z_-]*)+)")  # an earlier version's plain-text marker


@dataclass(frozen=True)
class Claims:
    """What pulseinfer wrote inside one folder: paths relative to it, ``/``-separated."""

    files: frozenset[str] = frozenset()
    folders: frozenset[str] = frozenset()
    trees: frozenset[str] = frozenset()  # folders whose whole content is pulseinfer's
    everything: bool = False  # this folder lies in a tree

    def owns(self, name: str, folder: bool) -> bool:
        """Whether the entry ``name`` (a folder or not) directly inside this folder is pulseinfer's."""
        if self.everything or (folder and name in self.trees):
            return True
        return name in (self.folders if folder else self.files)

    def below(self, name: str) -> Claims:
        """The claims inside the subfolder ``name``."""
        if self.everything or name in self.trees:
            return Claims(everything=True)
        cut = len(name) + 1

        def inside(paths: frozenset[str]) -> frozenset[str]:
            return frozenset(p[cut:] for p in paths if p.startswith(f"{name}/"))

        return Claims(inside(self.files), inside(self.folders), inside(self.trees))

    def __or__(self, other: Claims) -> Claims:
        return Claims(
            self.files | other.files,
            self.folders | other.folders,
            self.trees | other.trees,
            self.everything or other.everything,
        )


def read_claims(folder: Path) -> Claims | None:
    """The claims of ``folder``'s own marker; None without one. Raises OSError if the marker cannot be read."""
    path = folder / MARKER
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("pulseinfer_results") != FORMAT:
            raise ValueError("an earlier version's marker")
        return Claims(*(frozenset(str(p) for p in data.get(key, [])) for key in ("files", "folders", "trees")))
    except (ValueError, TypeError):  # plain text of an earlier version (or a damaged list): the legacy rule
        return _legacy_claims(folder)


def read_writer(folder: Path) -> str | None:
    """The command that wrote ``folder``'s own marker (``pulseinfer simulate``): its ``written_by``, or for an
    earlier version's plain-text marker its first words. None without a marker; "" when the marker does not say
    (damaged). Raises OSError if the marker cannot be read."""
    path = folder / MARKER
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        found = LEGACY_WRITER.match(text.strip())
        return found.group(1) if found else ""
    writer = data.get("written_by") if isinstance(data, dict) else None
    return writer.strip() if isinstance(writer, str) and writer.strip() != "pulseinfer" else ""


def read_provenance(folder: Path) -> dict:
    """The ``provenance`` ``folder``'s marker recorded (:func:`write_marker`); {} for a marker of an earlier version,
    a damaged one, or none. Raises OSError if the marker cannot be read."""
    path = folder / MARKER
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {}
    found = data.get("provenance") if isinstance(data, dict) else None
    return found if isinstance(found, dict) else {}


def add_file(folder: Path, name: str) -> None:
    """List the file ``name`` (directly inside ``folder``) in ``folder``'s own marker, keeping what it records, so
    a re-run of the command replaces it (``pulseinfer report`` adds ``report.html``). Raises OSError if the marker
    cannot be read or written. An earlier version's marker (plain text) is rewritten with lists: what its rule
    claims now, and ``name``; a damaged one is left as it is."""
    path = folder / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("pulseinfer_results") != FORMAT:  # an earlier version's plain text
        writer = read_writer(folder)
        if writer:  # rewritten as a list: what the earlier rule claims now, and the new file
            claims = _legacy_claims(folder) | Claims(files=frozenset({name}))
            write_marker(folder, writer.removeprefix("pulseinfer").strip(), claims, provenance={})
        return
    files = [str(p) for p in data.get("files", [])]
    if name in files:
        return
    data["files"] = sorted([*files, name])
    tmp = folder / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def claims_of(folder: Path) -> Claims | None:
    """What pulseinfer wrote in ``folder``: its own marker's claims and those of enclosing folders that claim it.

    None when ``folder`` holds no marker and no enclosing folder claims it (the folder is not pulseinfer's).
    """
    folder = Path(os.path.abspath(folder))
    own = read_claims(folder)
    if folder.parent == folder:
        return own
    above = claims_of(folder.parent)
    if above is None or not above.owns(folder.name, folder=True):
        return own
    return above.below(folder.name) | (own or Claims())


def claimed_by(folder: Path) -> tuple[Path, str, bool] | None:
    """The enclosing results folder whose marker claims ``folder`` (``R`` for ``R/plots`` of ``simulate --plots``),
    the command that wrote that marker ("" if it does not say), and whether ``folder`` lies in a tree the marker
    claims whole (``R/cache`` of a sweep). None when no enclosing folder claims ``folder``."""
    folder = Path(os.path.abspath(folder))
    parent = folder.parent
    if parent == folder:
        return None
    above = claims_of(parent)
    if above is None or not above.owns(folder.name, folder=True):
        return None
    writer = read_writer(parent)
    if writer is None:  # the parent is itself claimed from further up
        holder, writer, _ = claimed_by(parent)
    else:
        holder = parent
    return holder, writer, above.below(folder.name).everything


def written_claims(folder: Path) -> Claims:
    """Every file and folder now inside ``folder`` (its marker aside), as claims: what a run staged there wrote."""
    files, folders = set(), set()
    for path, is_dir in _walk(folder):
        (folders if is_dir else files).add(path)
    files.discard(MARKER)
    return Claims(frozenset(files), frozenset(folders))


def write_marker(folder: Path, command: str, claims: Claims, provenance: dict | None = None) -> None:
    """Write ``folder``'s marker listing ``claims`` and, under ``provenance``, the run that wrote it (command line,
    version, date, commit: pulseinfer/provenance.py; default: the running command's). Written to a temporary file,
    then renamed into place."""
    from pulseinfer.provenance import current

    data = {
        "pulseinfer_results": FORMAT,
        "written_by": f"pulseinfer {command}".strip(),
        "note": "pulseinfer wrote the files and folders listed here; only a re-run of the same command replaces "
        "them, and it keeps everything else in this folder",
        "files": sorted(claims.files),
        "folders": sorted(claims.folders),
        "trees": sorted(claims.trees),
        "provenance": current() if provenance is None else provenance,
    }
    tmp = folder / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


@dataclass
class Carry:
    """What a re-run does with the entries of the previous folder that are not pulseinfer's."""

    moves: list[tuple[Path, Path]] = field(default_factory=list)  # (entry in the old folder, its place in the new)
    conflicts: list[Path] = field(default_factory=list)  # entries the new folder already has something at


def plan_carry(old: Path, new: Path | None, claims: Claims, ours: bool = True) -> Carry:
    """Decide, entry by entry, what of ``old`` is the user's and goes into ``new`` (None: an empty new folder).

    Entries ``claims`` name are pulseinfer's and left behind. With ``ours`` False the claims are another run's
    (a marker inside a folder of the user's): such an entry is left behind only where ``new`` has the same path.
    A user's entry whose path ``new`` already has (a folder into a folder aside) is a conflict.
    """
    carry = Carry()
    _plan(old, new, claims, ours, carry)
    return carry


def _plan(old: Path, new: Path | None, claims: Claims, ours: bool, carry: Carry) -> None:
    for entry in _entries(old):
        is_dir = entry.is_dir(follow_symlinks=False)
        owned = claims.owns(entry.name, is_dir) or (entry.name == MARKER and entry.is_file(follow_symlinks=False))
        target = None if new is None else new / entry.name
        taken = target is not None and os.path.lexists(target)
        into_folder = taken and target.is_dir() and not target.is_symlink()
        if is_dir and (into_folder or (owned and ours)):
            # a user's entry inside goes into the new run's folder, or into a recreated one; where the new run
            # wrote a file in its place, it cannot go in (a conflict, _blocked)
            inner = claims.below(entry.name) | (read_claims(Path(entry.path)) or Claims())
            _plan(Path(entry.path), target, inner, ours and owned, carry)
        elif owned and (ours or taken):
            continue  # pulseinfer's: replaced by this run
        elif taken or (target is not None and _blocked(target)):
            carry.conflicts.append(Path(entry.path))
        else:
            carry.moves.append((Path(entry.path), target))


def _blocked(target: Path) -> bool:
    """Whether a folder above ``target`` exists in the new folder as something that is not a folder."""
    for parent in target.parents:
        if os.path.lexists(parent):
            return not parent.is_dir() or parent.is_symlink()
    return False


def _entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _walk(folder: Path, prefix: str = ""):
    """(relative path, is a folder) of everything below ``folder``; symbolic links are not followed."""
    for entry in _entries(folder):
        is_dir = entry.is_dir(follow_symlinks=False)
        yield prefix + entry.name, is_dir
        if is_dir:
            yield from _walk(Path(entry.path), f"{prefix}{entry.name}/")


def _legacy_claims(folder: Path) -> Claims:
    """An earlier version's marker: its known file types at the top and in ``plots/``/``cache/``."""
    files, folders = set(), set()
    for entry in _entries(folder):
        if entry.is_dir(follow_symlinks=False):
            if entry.name in LEGACY_FOLDERS:
                folders.add(entry.name)
                for path, is_dir in _walk(Path(entry.path), f"{entry.name}/"):
                    if is_dir:
                        folders.add(path)
                    elif Path(path).suffix in LEGACY_SUFFIXES:
                        files.add(path)
        elif entry.is_file(follow_symlinks=False) and Path(entry.name).suffix in LEGACY_SUFFIXES:
            files.add(entry.name)
    return Claims(frozenset(files), frozenset(folders))
