"""The report page of a results folder: ``write_report(folder) -> Path`` writes ``folder/report.html``.

One self-contained HTML file (pulseinfer/page/html.py: inline PNG figures, HTML tables, an inline style sheet, no
script, nothing loaded from the network) with, top to bottom: a one-line verdict (the answer to the question the
command answers), the key table, notes, every figure with a caption, the scenario and the provenance (command line,
version, date, commit: recorded in the folder's marker, pulseinfer/provenance.py).

The kind of folder is the command its marker names (``written_by``); ``validate`` and ``calibrate`` folders are
told apart by their files (pulseinfer/page/checks.py). ``pulseinfer report DIR`` and every command's ``--report``
call :func:`write_report`; the page is listed in the folder's marker, so a re-run of the command replaces it.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from pathlib import Path

from pulseinfer.errors import UsageError
from pulseinfer.marker import add_file, read_claims, read_provenance, read_writer
from pulseinfer.page.folder import Folder
from pulseinfer.page.html import Page, render

REPORT = "report.html"
# What a page builder raises on a table that is not what its command writes (a column missing or renamed, text in a
# numeric column, all values blank): the folder's fault, said in one line, not a bug of the report.
DAMAGED = (KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError)


def _kinds() -> dict[str, Callable[[Folder], Page]]:
    from pulseinfer.page import checks, serving

    return {
        "simulate": serving.simulate_page,
        "plan": serving.plan_page,
        "sweep": serving.sweep_page,
        "search": serving.search_page,
        "validate": checks.validate_page,
        "calibrate": checks.calibrate_page,
        "cases": checks.cases_page,
        "accuracy": checks.accuracy_page,
        "engine-bench": checks.engine_bench_page,
    }


def build_page(path: Path) -> Page:
    """The :class:`~pulseinfer.page.html.Page` of the results folder ``path``.

    Raises:
        UsageError: ``path`` is not a folder, or no pulseinfer command wrote it (no marker), or its marker names a
            command that writes no report (``pulseinfer plot``'s figure folder: report its results folder).
    """
    from pulseinfer.page.figures import collect_figures

    path = Path(path)
    if not path.is_dir():
        raise UsageError(
            f"{path}: {'not a folder' if path.exists() else 'no such folder'}; give a results folder (--out)"
        )
    writer = read_writer(path)
    if writer is None:
        raise UsageError(
            f"{path}: not a results folder (no .pulseinfer-results marker); give a folder a pulseinfer command wrote"
        )
    command = writer.split()[1] if len(writer.split()) > 1 else ""
    kinds = _kinds()
    if command not in kinds:
        what = f"`{writer}`" if writer else "a command its marker does not name"
        raise UsageError(
            f"{path}: written by {what}, which has no report page; report the results folder it belongs to"
        )
    folder = Folder(path)
    try:
        page = kinds[command](folder)
    except DAMAGED as exc:  # a table edited or cut short: its columns or values are not what the command writes
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        raise UsageError(
            f"{path}: its tables are not what `{writer}` writes (edited or damaged? {detail}); re-run the command"
        ) from None
    page.figures = collect_figures(folder, draw=command == "simulate")
    page.notes += folder.notes
    scenario = folder.text("scenario.yaml")
    if scenario:
        page.texts.insert(0, ("scenario.yaml", scenario))
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    page.provenance = {
        **read_provenance(path),
        "report_written_at": now.isoformat().replace("+00:00", "Z"),
        "folder": str(path.resolve()),
    }
    return page


def write_report(path: Path) -> Path:
    """Write ``path/report.html`` (to a temporary file, then renamed into place) and list it in the folder's marker;
    return its path.

    Raises:
        UsageError: see :func:`build_page`; also a ``report.html`` there that pulseinfer did not write (a file of
            yours is never replaced) or that is not a file, a folder that cannot be written (:func:`check_target`).
        OSError: the page cannot be written (named ``path/report.html``; no temporary file is left).
    """
    path = Path(path)
    out = path / REPORT
    check_target(path)
    text = render(build_page(path))
    tmp = path / f".{REPORT}.{os.getpid()}.tmp"
    try:
        tmp.write_bytes(text.encode("utf-8", "replace"))
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(out)) from None
    add_file(path, REPORT)
    return out


def check_target(path: Path) -> None:
    """UsageError unless ``path/report.html`` may be written: absent, or a file the folder's marker lists (an
    earlier page), in a folder this process may write (a folder not there yet passes: ``--report`` checks before
    its command runs)."""
    out = Path(path) / REPORT
    if path.is_dir() and os.path.lexists(out):
        claims = read_claims(path)
        if out.is_symlink() or not out.is_file():
            raise UsageError(f"{out}: is not a file; move it away to write the report page")
        if claims is None or not claims.owns(REPORT, folder=False):
            raise UsageError(f"{out}: not written by pulseinfer (the folder's marker does not list it); move it or "
                             "rename it to write the report page")  # fmt: skip
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: cannot be written (permissions); the report page goes inside the results folder")
