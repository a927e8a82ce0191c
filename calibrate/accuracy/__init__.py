"""Accuracy of sparse block attention against dense attention on a real model (behind ``pulseinfer accuracy``).

    trace.py       dense teacher-forced pass (prefill, then M true tokens) + attention arithmetic on it
    selections.py  the compared block selections (headwise, solohead and variants, streaming, oracle)
    evaluate.py    AccuracySettings, evaluate_accuracy: per (selection, budget) mass, rel_l2, argmax, KL

calibrate/selection_stats.py reuses the trace and the selections for the simulator's recall statistics.
"""

from calibrate.accuracy.evaluate import (
    ACCURACY_COLUMNS,
    DEFAULT_STEPS,
    AccuracySettings,
    dense_stream_metrics,
    evaluate_accuracy,
    format_accuracy,
    next_token_agreement,
    num_work_units,
    sparse_forward,
)
from calibrate.accuracy.selections import (
    ACCURACY_SELECTIONS,
    SHARED_SELECTIONS,
    LayerScores,
    block_scores,
    box_scores,
    select_attended,
)
from calibrate.accuracy.trace import (
    DEFAULT_LAYOUT,
    TeacherForcedTrace,
    attention_probs,
    block_masks,
    block_mass,
    dense_output,
    sparse_output,
    teacher_forced_trace,
    token_mask,
)

__all__ = [
    "ACCURACY_COLUMNS",
    "ACCURACY_SELECTIONS",
    "DEFAULT_LAYOUT",
    "DEFAULT_STEPS",
    "SHARED_SELECTIONS",
    "AccuracySettings",
    "LayerScores",
    "TeacherForcedTrace",
    "attention_probs",
    "block_masks",
    "block_mass",
    "block_scores",
    "box_scores",
    "dense_output",
    "dense_stream_metrics",
    "evaluate_accuracy",
    "format_accuracy",
    "next_token_agreement",
    "num_work_units",
    "select_attended",
    "sparse_forward",
    "sparse_output",
    "teacher_forced_trace",
    "token_mask",
]
