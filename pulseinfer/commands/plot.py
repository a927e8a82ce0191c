"""``pulseinfer plot``: draw every figure a results folder has data for."""

from __future__ import annotations

import argparse
from pathlib import Path

from pulseinfer.errors import UsageError, usage_errors
from pulseinfer.helpfmt import DefaultsHelpFormatter


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plot",
        help="draw the figures for a results folder",
        description="Draw every figure the results folder (written by `pulseinfer simulate --out`) has data "
        "for; a figure whose table is missing is skipped with a note.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("results_dir", type=Path, metavar="RESULTS_DIR", help="folder with summary/requests/steps.csv")
    p.add_argument("--out", type=Path, default=None, help="figure folder (default: RESULTS_DIR/plots)")
    add_format_arguments(p)
    return p


# --dpi bounds: 600 dots per inch is print quality for these 7-15 inch figures. At 1200 the default scenario's
# widest figure (the four-policy timeline, 15.4 x 5.6 in) is 18,480 x 6,720 pixels, ~0.5 GB of RGBA; at 20000 a
# 7 x 4 in figure needs ~45 GB (a MemoryError after the whole simulation, before this bound).
DPI_RANGE = (20, 600)


def add_format_arguments(p: argparse.ArgumentParser) -> None:
    """``--format`` and ``--dpi``, shared with ``pulseinfer simulate --plots``."""
    p.add_argument("--format", default="png", help="comma list of figure formats: png, svg, pdf")
    low, high = DPI_RANGE
    p.add_argument("--dpi", type=int, default=100, help=f"resolution of raster formats, {low} to {high}")


def check_format_arguments(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--format`` list, validated with ``--dpi`` (within :data:`DPI_RANGE`); UsageError with a one-line
    message otherwise. Both commands call it before any work, so a bad value never waits for a simulation."""
    from plots.render import parse_formats

    low, high = DPI_RANGE
    if not low <= args.dpi <= high:
        raise UsageError(f"--dpi {args.dpi}: expected dots per inch from {low} to {high}")
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
    if out.resolve() == args.results_dir.resolve():  # its tables would give way to the figures
        raise UsageError(
            f"--out {args.out}: is RESULTS_DIR itself; the figures need a folder of their own "
            f"(default {args.results_dir / 'plots'})"
        )
    with results_folder(out, command="plot") as stage:  # replaces the figures of the previous plot, keeps the rest
        written = plot_results(args.results_dir, stage, formats, dpi=args.dpi)  # OSError for a bad RESULTS_DIR
    print(f"{len(written)} figure file(s) in {out}/")
    return 0
