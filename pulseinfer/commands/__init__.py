"""One module per ``pulseinfer`` sub-command: ``add_parser(subparsers)`` and ``run(args) -> int``.

``run`` raises on bad input (``pulseinfer.errors.UsageError`` or a library's typed error); ``pulseinfer.cli.main``
prints the ``error:`` line and picks the exit status.
"""

from __future__ import annotations

import argparse
import gc
import math
from collections.abc import Iterator
from contextlib import contextmanager

from pulseinfer.errors import UsageError


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


@contextmanager
def collections_paused() -> Iterator[None]:
    """No garbage collections inside the block (a sub-command's heavy imports: sim, pandas, pyarrow, pydantic).

    Importing them creates a few hundred thousand objects and no garbage, yet triggers collections that walk
    them all: ``simulate``'s imports took 578 ms paused against 672 ms (a 2-core machine, 9 interleaved runs each).
    The collector is left as it was found, also when the block raises.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def import_torch():
    """torch, or UsageError with the install command (torch is the `engine` extra, not a core dependency)."""
    try:
        import torch
    except ImportError:
        raise UsageError("this command needs torch: pip install -e '.[engine]'") from None
    return torch


def resolve_device(device: str | None, torch) -> str:
    """``--device``: cpu, cuda or cuda:N (default cuda when torch sees one). Raises UsageError naming the value."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"--device {device}: must be cpu, cuda or cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: torch sees no CUDA device")
    return device


def int_list(text: str, flag: str, minimum: int = 1) -> tuple[int, ...]:
    """A comma-separated list of integers >= minimum. Raises UsageError naming the flag and the value."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < minimum:
        raise UsageError(f"{flag} {text}: expected comma-separated integers >= {minimum}, e.g. 256,512,1024")
    return values


def check_positive(value: float | None, flag: str, unit: str) -> None:
    """Raise UsageError, naming the flag, the value and ``unit``, unless ``value`` is None (not given) or a finite
    number > 0: argparse's ``float`` also takes ``inf`` and ``nan``, which no rate or size can be."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} {value}: expected a finite number > 0 ({unit})")


SEED_LIMIT = 2**32  # numpy's and Optuna's samplers take seeds in [0, 2**32)


def check_seed(seed: int, flag: str = "--seed") -> None:
    """Raise UsageError, naming the flag and the value, unless ``0 <= seed < 2**32`` (what numpy's ``RandomState``,
    hence Optuna's samplers, accept; torch's generators take the same range). Call it before any work or output."""
    if not 0 <= seed < SEED_LIMIT:
        raise UsageError(f"{flag} {seed}: expected an integer in [0, 2**32)")


def check_out_folder(out, command: str, flag: str = "--out") -> None:
    """Raise UsageError before any work if ``command`` cannot write ``out`` whole (``pulseinfer.outdir.check_writable``:
    a file, a symbolic link, a folder another command wrote, a foreign non-empty folder, or an unwritable parent).
    Creates nothing."""
    from pulseinfer.outdir import check_writable

    check_writable(out, command, flag)
