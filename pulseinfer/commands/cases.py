"""``pulseinfer cases``: the shipped published cases, simulated and compared with their published values."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pulseinfer.commands import check_out_folder
from pulseinfer.outdir import mark_results
from pulseinfer.progress import Bar

EPILOG = """\
Each case in scenarios/cases/<name>.yaml names a published measurement, its source, the tolerance stated
before the simulator was run, and how the simulator computes the same metric (one small simulation per
point, or a closed-form link figure). Verdict: within / outside the tolerance, or not_modelled with the
reason when this build lacks what the case needs. Sources: docs/sources.md §9.
OUT/cases.csv: case, source, metric, published, simulated, error_pct, tolerance_pct, verdict, note.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "cases",
        help="compare the simulator with published measurements (shipped cases)",
        description="Run the shipped suite of published cases and print simulated vs published values.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("results/cases"), help="results folder (default results/cases)")
    p.add_argument("--only", default=None, metavar="NAME,...", help="run only these cases (file names without .yaml)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    from sim.study.cases import cases_table, load_case, run_case, select_cases

    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    specs = [load_case(path) for path in select_cases(only)]
    check_out_folder(args.out, "cases")
    mark_results(args.out, "cases", files=["cases.csv"])  # creates OUT, marked as pulseinfer's
    started = time.perf_counter()
    rows = []
    with Bar(len(specs), "cases", "case", hidden=args.no_progress) as bar:
        for spec in specs:
            bar.note(spec.name)
            rows.append(run_case(spec, on_sim=lambda point, name=spec.name: bar.note(f"{name}: {point}")))
            bar.advance()
    table = cases_table(rows)
    table.to_csv(args.out / "cases.csv", index=False)
    print(f"\npublished cases ({time.perf_counter() - started:.0f} s wall)")
    print(format_cases(table))
    print(f"\nwrote {args.out / 'cases.csv'}")
    return 0


def format_cases(table) -> str:
    """cases.csv for the terminal: numbers rounded, the note last."""
    shown = table.copy()
    shown["simulated"] = shown["simulated"].map(lambda v: "-" if v != v else f"{v:.3g}")
    shown["error_pct"] = shown["error_pct"].map(lambda v: "-" if v != v else f"{v:+.1f}")
    shown["tolerance_pct"] = shown["tolerance_pct"].map(lambda v: f"{v:g}")
    return shown.drop(columns=["note"]).to_string(index=False) + _notes(table)


def _notes(table) -> str:
    notes = [f"  {row.case}: {row.note}" for row in table.itertuples() if row.note]
    return "\n\nnotes:\n" + "\n".join(notes) if notes else ""
