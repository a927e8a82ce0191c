"""``pulseinfer report``: one self-contained HTML page for a results folder (pulseinfer/page/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pulseinfer.errors import UsageError
from pulseinfer.helpfmt import DefaultsHelpFormatter


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="write RESULTS_DIR/report.html: verdict, key table, figures, provenance",
        description="Write RESULTS_DIR/report.html, one page you can open offline or send as one file: a one-line "
        "verdict (the answer to the question the command that wrote the folder answers), the key table, every "
        "figure with a caption, the scenario and the provenance (command line, version, date, commit). Figures are "
        "inline PNG data and tables are HTML; the page loads nothing from the network and runs no script. Works "
        "for the folders of simulate (one replica or a fleet), plan, sweep, search, validate, calibrate, cases, "
        "accuracy and engine-bench; every command also takes --report to write it at the end.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="a folder a pulseinfer command wrote (--out)")
    return p


def run(args: argparse.Namespace) -> int:
    from pulseinfer.page import write_report

    if not args.results_dir.strip():  # Path("") would be the current folder
        raise UsageError("RESULTS_DIR '': an empty path; give a results folder (--out of a pulseinfer command)")
    print(f"wrote {write_report(Path(args.results_dir))}")
    return 0
