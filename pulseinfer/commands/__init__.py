"""One module per ``pulseinfer`` sub-command: ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse


def add_overrides(p: argparse.ArgumentParser, example: str = "workload.time_scale=0.5") -> None:
    """The shared ``--set KEY=VALUE`` option (dotted scenario keys, repeatable) into ``args.overrides``."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a scenario key (repeatable), e.g. --set {example}",
    )
