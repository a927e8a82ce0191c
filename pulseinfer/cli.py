"""``pulseinfer`` — a thin argparse shell over functions that return tables.

Each sub-command lives in ``pulseinfer/commands/<name>.py`` with ``add_parser(subparsers)`` and
``run(args) -> int``; command modules import their heavy packages (sim, torch, matplotlib) inside
``run`` only, so building the parser is cheap and ``pulseinfer simulate`` never loads torch.

Exit status: 0 on success, 2 on bad input (one ``error:`` line on stderr naming the field, the value and
what was expected), 1 on an unexpected failure.
"""

from __future__ import annotations

import argparse
import importlib

EXIT_BAD_INPUT = 2
COMMANDS = [
    "simulate",
    "search",
    "plan",
    "plot",
    "calibrate",
    "validate",
    "accuracy",
    "engine_bench",
    "trace",
]  # command modules, help order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulseinfer",
        description="Simulate long-context LLM decode serving with sparse KV-cache offloading.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"pulseinfer.commands.{name}")
        module.add_parser(sub).set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
