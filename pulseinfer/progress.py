"""Progress bars for every ``pulseinfer`` command: tqdm on stderr, or nothing with ``--no-progress``.

Libraries take plain callbacks (``on_progress(n)``, ``progress(stage_name)``, ``on_finish(request)``); a
:class:`Bar` supplies them, so no library imports tqdm:

- ``advance(n=1)``: n more units done (accuracy passes, plan cells, simulated requests);
- ``reach(n)``: n units done in all (search's finished-trial count, which may jump or repeat);
- ``note(text)``: what is running now, shown after the bar (plan's last simulation);
- ``stage(name)``: a named stage starts; every call after the first completes one unit (calibrate, validate).

A bar closes when its ``with`` block ends; on a clean end it first fills up to ``total``. :class:`TaskBars`
gives one bar per task for ``sim.run.simulate``'s per-policy ``(name, total) -> on_finish`` factory.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class Bar:
    """One tqdm bar on stderr over ``total`` units; with ``hidden`` every method does nothing."""

    def __init__(self, total: int, desc: str, unit: str, hidden: bool = False) -> None:
        self.total = total
        self._bar = None
        self._staged = False
        if not hidden:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=True)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.reach(self.total)
        self.close()

    @property
    def n(self) -> int:
        """Units done so far (0 when hidden)."""
        return self._bar.n if self._bar is not None else 0

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def reach(self, n: int) -> None:
        if self._bar is not None and min(n, self.total) != self._bar.n:
            self._bar.n = min(n, self.total)
            self._bar.refresh()

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def stage(self, name: str) -> None:
        if self._staged:
            self.advance()
        self._staged = True
        self.note(name)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class TaskBars:
    """Context manager yielding ``start(name, total) -> on_item(item)``: one :class:`Bar` per task, closed at its
    last item, or ``None`` (no progress callback at all) when hidden. Leaving the block closes a task cut short."""

    def __init__(self, unit: str, hidden: bool = False) -> None:
        self.unit, self.hidden = unit, hidden
        self._open: list[Bar] = []

    def __enter__(self) -> Callable[[str, int], Callable[[Any], None]] | None:
        return None if self.hidden else self.start

    def __exit__(self, *exc: object) -> None:
        for bar in self._open:
            bar.close()

    def start(self, name: str, total: int) -> Callable[[Any], None]:
        bar = Bar(total, f"{name:>10}", self.unit)
        self._open.append(bar)

        def on_item(_item: object) -> None:
            bar.advance()
            if bar.n >= total:
                bar.close()

        if total <= 0:
            bar.close()
        return on_item
