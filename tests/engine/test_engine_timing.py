"""Timer: CPU spans from perf_counter_ns, exported in seconds; disabled timers record nothing."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from engine.timing import TIMING_COLUMNS, Timer  # noqa: E402


def test_cpu_spans_are_exported_in_seconds():
    timer = Timer("cpu")
    with timer.span("recall", step=3, layer=1):
        time.sleep(0.002)
    table = timer.table()
    assert list(table.columns) == TIMING_COLUMNS
    assert table.iloc[0][["step", "layer", "name"]].tolist() == [3, 1, "recall"]
    assert 0.002 <= table.iloc[0]["seconds"] < 1.0


def test_disabled_timer_records_nothing():
    timer = Timer("cpu", enabled=False)
    with timer.span("step", 0):
        pass
    assert timer.table().empty
