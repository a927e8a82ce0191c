"""Timing spans per decode step and layer: CUDA events on a GPU, `time.perf_counter_ns` on a CPU.

`start` and `stop` only record (an event on the given stream, or a clock reading), so they cost
microseconds and never synchronise; `table()` resolves CUDA events once, at export, and converts to
seconds there (elapsed_time is in milliseconds). Spans on a side stream (the I/O engine's copy stream)
measure from issue to completion on that stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import torch

TIMING_COLUMNS = ["step", "layer", "name", "seconds"]


class Timer:
    """Collects (step, layer, name) spans; layer is -1 for whole-step spans."""

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled
        self._open: list[tuple[int, int, str, object]] = []  # handle -> (step, layer, name, start)
        self._spans: list[tuple[int, int, str, object, object]] = []

    def start(self, name: str, step: int, layer: int = -1, stream: torch.cuda.Stream | None = None) -> int:
        """Open a span and return its handle (-1 when disabled)."""
        if not self.enabled:
            return -1
        self._open.append((step, layer, name, self._mark(stream)))
        return len(self._open) - 1

    def stop(self, handle: int, stream: torch.cuda.Stream | None = None) -> None:
        """Close the span `handle`; on CUDA the end event is recorded on `stream` (default: current)."""
        if handle < 0:
            return
        step, layer, name, begin = self._open[handle]
        self._spans.append((step, layer, name, begin, self._mark(stream)))

    @contextmanager
    def span(self, name: str, step: int, layer: int = -1, stream: torch.cuda.Stream | None = None) -> Iterator[None]:
        """`start` on entry and `stop` on exit (also on an exception); same arguments as `start`."""
        handle = self.start(name, step, layer, stream)
        try:
            yield
        finally:
            self.stop(handle, stream)

    def table(self) -> pd.DataFrame:
        """All closed spans as a DataFrame with columns step, layer, name, seconds (float)."""
        if self.cuda and self._spans:
            torch.cuda.synchronize()
        rows = [(step, layer, name, self._seconds(a, b)) for step, layer, name, a, b in self._spans]
        return pd.DataFrame(rows, columns=TIMING_COLUMNS)

    def clear(self) -> None:
        """Drop every open and closed span."""
        self._open.clear()
        self._spans.clear()

    def _mark(self, stream: torch.cuda.Stream | None) -> object:
        if not self.cuda:
            return time.perf_counter_ns()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream if stream is not None else torch.cuda.current_stream())
        return event

    def _seconds(self, begin: object, end: object) -> float:
        if self.cuda:
            return begin.elapsed_time(end) * 1e-3  # elapsed_time is in milliseconds
        return (end - begin) * 1e-9
