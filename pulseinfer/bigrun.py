"""Big runs are announced and confirmed with ``--yes``: the size at once, the time once it has been measured.

``sweep``, ``search`` and ``plan`` call :func:`check_size` before any simulation and before writing anything (a
sweep before it resolves its points, which alone takes ~16 ms a point):

- more than :data:`CONFIRM_SIMULATIONS` simulations without ``--yes``: refused at once (``UsageError``, one line
  naming the size and ``--yes``);
- more than :data:`ANNOUNCE_SIMULATIONS`: the size is printed on stderr (:func:`announce`, once the command's
  input is checked, so bad input still gets exactly one line).

The time is not guessed from the size: a simulation's cost depends on the policy, the prompt and output lengths
and how the batch evolves (0.8 to 80 µs per output token on the same machine), so no formula of the request count
is right within 10×. A :class:`Pace` measures it instead, cheaply: the run's own first units of work (they are
kept: a sweep's cache, a search's journal). Once a second full wave of ``jobs`` tasks has finished, it prints
``sweep: roughly 11 min in all (6.3 s a point on 2 jobs, measured on the first 6)`` when the run takes more than
:data:`ANNOUNCE_S`, and stops a run estimated above :data:`CONFIRM_S` that has no ``--yes`` (one line saying so;
a rerun with ``--yes`` continues from what was kept).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from pulseinfer.errors import UsageError

ANNOUNCE_SIMULATIONS = 50
CONFIRM_SIMULATIONS = 500
ANNOUNCE_S = 60.0
CONFIRM_S = 600.0


def add_yes(p: argparse.ArgumentParser, measured: bool = True) -> None:
    """The shared ``--yes`` flag into ``args.yes``; ``measured``: the command also stops a run its :class:`Pace`
    measures as too long."""
    measured_help = (
        f" or longer than {CONFIRM_S / 60:.0f} min as measured on its first ones (stopped there without it; what "
        "finished is kept)"
        if measured
        else ""
    )
    p.add_argument(
        "--yes",
        action="store_true",
        help=f"run even a big run: more than {CONFIRM_SIMULATIONS} simulations (refused at once without it)"
        f"{measured_help}",
    )


def check_size(what: str, size: str, num_simulations: int, yes: bool) -> str | None:
    """Refuse a run of more than :data:`CONFIRM_SIMULATIONS` simulations unless ``yes``; the line announcing a
    big one.

    Args:
        what: the command (``sweep``), leading the line.
        size: the run's size in its own units, e.g. ``10,000 points (100 × 100 grid values × 1 policy × 1 seed)``.
        num_simulations: simulations the run needs (an estimate for plan).
        yes: the user gave ``--yes``.

    Returns:
        ``"<what>: <size>; ..."`` when more than :data:`ANNOUNCE_SIMULATIONS` simulations, else None.

    Raises:
        UsageError: more than :data:`CONFIRM_SIMULATIONS` simulations and not ``yes``.
    """
    if num_simulations > CONFIRM_SIMULATIONS and not yes:
        raise UsageError(
            f"{what}: {size}: a run of more than {CONFIRM_SIMULATIONS} simulations needs --yes; add --yes to run "
            "it, or make it smaller"
        )
    if num_simulations > ANNOUNCE_SIMULATIONS:
        return f"{what}: {size}; the time follows once the first ones are measured"
    return None


def announce(line: str | None) -> None:
    """Print :func:`check_size`'s line on stderr (nothing for None)."""
    if line:
        write(line)


def write(line: str) -> None:
    """One line on stderr, above a progress bar when one is drawn (tqdm moves it)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


class Pace:
    """Measures how fast a run goes on its own first units and acts on the estimate once (see the module docstring).

    Feed it :meth:`update` with the count of units done (any count of the run's own, e.g. a sweep's points
    including cached ones): the first call is the baseline. Work is done in tasks of ``per_task`` units (a
    sweep's point group: one point per policy), ``jobs`` tasks at a time. The first wave of tasks carries the
    workers' start-up, so the rate is measured from the first finished task on, over the next whole wave, and the
    first wave's other tasks are not counted in it: with every task taking ``u`` seconds it comes out as
    ``jobs × per_task / u`` exactly.
    """

    def __init__(self, what: str, unit: str, total: int, jobs: int, yes: bool, per_task: int = 1) -> None:
        """``total``: the count :meth:`update` reaches at the end; ``jobs``: tasks in progress at once."""
        self.what, self.unit, self.total, self.yes = what, unit, total, yes
        self.jobs, self.per_task = max(1, jobs), max(1, per_task)
        self.started = time.monotonic()
        self._baseline: int | None = None
        self._first_s: float | None = None  # when the first task finished
        self.estimate_s: float | None = None

    def update(self, done: int) -> None:
        """Record the units done so far.

        Raises:
            UsageError: the measured estimate exceeds :data:`CONFIRM_S` and ``yes`` was not given.
        """
        if self._baseline is None:
            self._baseline = done
            return
        done -= self._baseline
        if self.estimate_s is not None or done <= 0:
            return
        now = time.monotonic()
        if self._first_s is None:
            self._first_s = now
            return
        wave = self.jobs * self.per_task  # the first wave, which finished at about _first_s
        if done < 2 * wave or now <= self._first_s:  # measure over one whole wave after it
            return
        rate = (done - wave) / (now - self._first_s)  # units per second with every worker busy
        self.estimate_s = (now - self.started) + (self.total - self._baseline - done) / rate
        self._act(done, rate)

    def _act(self, done: int, rate: float) -> None:
        line = (
            f"{self.what}: roughly {_duration(self.estimate_s)} in all ({_duration(self.jobs / rate)} a {self.unit} "
            f"on {self.jobs} job{'s' if self.jobs > 1 else ''}, measured on the first {done})"
        )
        if self.estimate_s > CONFIRM_S and not self.yes:
            raise UsageError(
                f"{line}: a run longer than {_duration(CONFIRM_S)} needs --yes; the {done} finished are kept, "
                "add --yes to run the rest, or make it smaller"
            )
        if self.estimate_s > ANNOUNCE_S:
            write(line)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    if seconds < 90:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
