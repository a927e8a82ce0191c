"""Metrics: records of a run → per-request, per-step and per-layer tables → one summary row per policy."""

from sim.metrics.recorder import Recorder, StepTotals
from sim.metrics.tables import (
    LAYER_COLUMNS,
    LAYER_RECALL_COLUMNS,
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
    TIMELINE_COLUMNS,
    layer_recall_table,
    layers_table,
    meets_slo,
    rejected_by_reason,
    requests_table,
    steps_table,
    summarize,
    timeline_table,
    unfinished_counts,
)

__all__ = [
    "LAYER_COLUMNS", "LAYER_RECALL_COLUMNS", "REQUEST_COLUMNS", "STEP_COLUMNS", "SUMMARY_COLUMNS", "TIMELINE_COLUMNS",
    "Recorder", "StepTotals", "layer_recall_table", "layers_table", "meets_slo", "rejected_by_reason",
    "requests_table", "steps_table", "summarize", "timeline_table", "unfinished_counts",
]  # fmt: skip
