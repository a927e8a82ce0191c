"""Results folders a command writes in place (``sweep``, ``search``, ``cases``: a cache or a study journal that a
re-run resumes), where pulseinfer/outdir.py stages every other folder whole: :func:`mark_results` claims the folder
before the work, :func:`settle_in_place` records the run once it succeeded (pulseinfer/cli.py calls it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pulseinfer.marker import Claims, read_claims, read_provenance, read_writer, write_marker
from pulseinfer.outdir import check_owner, check_writable, make_parents
from pulseinfer.provenance import wrote

REPORT_PAGE = "report.html"  # a results folder's report page (pulseinfer/page/), removed when the command re-runs


def mark_results(out: Path, command: str, files: Iterable[str] = (), trees: Iterable[str] = ()) -> None:
    """Create ``out`` (after :func:`check_writable`) as a results folder that ``command`` writes in place.

    Its marker lists ``files`` and ``trees`` (folders whose whole content the command writes) besides what it
    listed before, so a later run that replaces ``out`` removes them and keeps everything else. The previous run's
    provenance and report page stay until the command succeeds (:func:`settle_in_place`, called by the CLI).

    Raises:
        UsageError: see :func:`check_writable` (checked again here, in case the folder changed meanwhile).
    """
    if out.is_dir() and not out.is_symlink():
        check_owner(out, "--out", command)  # nothing is moved: the owner is what matters
    else:
        check_writable(out, command)
    make_parents(out, "--out")
    out.mkdir(exist_ok=True)
    written = Claims(files=frozenset(files), trees=frozenset(trees))
    before = read_claims(out)
    # a run that is refused or stopped leaves the previous results: their provenance stays until it succeeds
    provenance = read_provenance(out) if before is not None else None
    write_marker(out, command, (before or Claims()) | written, provenance=provenance or None)
    wrote(out, in_place=True)


def settle_in_place(out: Path) -> None:
    """After a command that wrote ``out`` in place (:func:`mark_results`) succeeded: its marker records this run's
    provenance, and the previous run's report page (``report.html``, when the marker lists it) is removed, since it
    describes other results (``--report`` writes the new one after this)."""
    claims = read_claims(out)
    if claims is None:
        return
    if claims.owns(REPORT_PAGE, folder=False) and (out / REPORT_PAGE).is_file():
        (out / REPORT_PAGE).unlink()
    command = (read_writer(out) or "").removeprefix("pulseinfer").strip()
    if command:
        write_marker(out, command, claims)
