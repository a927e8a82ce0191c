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
from pulseinfer.marker import add_file, read_provenance, read_writer
from pulseinfer.page.folder import Folder
from pulseinfer.page.html import Page, render

REPORT = "report.html"


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
    page = kinds[command](folder)
    page.figures = collect_figures(folder, draw=command == "simulate")
    page.notes += folder.notes
    for name in ("scenario.yaml",):
        text = folder.text(name)
        if text:
            page.texts.insert(0, (name, text))
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    page.provenance = {
        **read_provenance(path),
        "report_written_at": now.isoformat().replace("+00:00", "Z"),
        "folder": str(path.resolve()),
    }
    return page


def write_report(path: Path) -> Path:
    """Write ``path/report.html`` (to a temporary file, then renamed into place) and list it in the folder's marker;
    return its path. Raises UsageError (see :func:`build_page`) or OSError (the folder cannot be written)."""
    path = Path(path)
    text = render(build_page(path))
    out = path / REPORT
    tmp = path / f".{REPORT}.{os.getpid()}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    add_file(path, REPORT)
    return out
