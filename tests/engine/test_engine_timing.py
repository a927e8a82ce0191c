"""Timer: CPU spans from perf_counter_ns (a fake clock here), exported in seconds; disabled timers record nothing."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from engine.timing import TIMING_COLUMNS, Timer  # noqa: E402


def test_cpu_spans_are_exported_in_seconds(monkeypatch):
    readings = iter([5_000_000_000, 5_002_500_000])  # a fake clock: the span lasts 2.5 ms whatever the load
    monkeypatch.setattr(time, "perf_counter_ns", lambda: next(readings))
    timer = Timer("cpu")
    with timer.span("recall", step=3, layer=1):
        pass
    table = timer.table()
    assert list(table.columns) == TIMING_COLUMNS
    assert table.iloc[0][["step", "layer", "name"]].tolist() == [3, 1, "recall"]
    assert table.iloc[0]["seconds"] == pytest.approx(0.0025)


def test_disabled_timer_records_nothing():
    timer = Timer("cpu", enabled=False)
    with timer.span("step", 0):
        pass
    assert timer.table().empty
