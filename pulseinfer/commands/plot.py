"""``pulseinfer plot``: draw every figure a results folder has data for."""

from __future__ import annotations

import argparse
from pathlib import Path

from pulseinfer.errors import UsageError, usage_errors


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plot",
        help="draw the figures for a results folder",
        description="Draw every figure the results folder (written by `pulseinfer simulate --out`) has data "
        "for; a figure whose table is missing is skipped with a note.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("results_dir", type=Path, metavar="RESULTS_DIR", help="folder with summary/requests/steps.csv")
    p.add_argument("--out", type=Path, default=None, help="figure folder (default: RESULTS_DIR/plots)")
    add_format_arguments(p)
    return p


def add_format_arguments(p: argparse.ArgumentParser) -> None:
    """``--format`` and ``--dpi``, shared with ``pulseinfer simulate --plots``."""
    p.add_argument("--format", default="png", help="comma list of figure formats: png, svg, pdf")
    p.add_argument("--dpi", type=int, default=100, help="resolution of raster formats")


def check_format_arguments(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--format`` list, validated with ``--dpi``; UsageError with a one-line message otherwise."""
    from plots.render import parse_formats

    if args.dpi < 1:
        raise UsageError(f"--dpi {args.dpi}: expected a positive integer")
    with usage_errors():  # parse_formats' message names --format
        return parse_formats(args.format)


def run(args: argparse.Namespace) -> int:
    from plots.render import plot_results
    from pulseinfer.outdir import results_folder

    out = args.out or args.results_dir / "plots"
    formats = check_format_arguments(args)
    if not args.results_dir.is_dir():  # before the figure folder (inside it, by default) is created
        state = "not a folder" if args.results_dir.exists() else "no such folder"
        raise NotADirectoryError(f"{args.results_dir}: {state}")
    with results_folder(out, command="plot", marker=False) as stage:  # replaces the figure folder whole
        written = plot_results(args.results_dir, stage, formats, dpi=args.dpi)  # OSError for a bad RESULTS_DIR
    print(f"{len(written)} figure file(s) in {out}/")
    return 0
