"""Figures from result tables: DataFrames in, matplotlib Figures out (no simulation here; see README.md)."""

from plots.ablation import ablation_bars
from plots.latency import tpot_cdf, ttft_cdf
from plots.recall import layer_recall_heatmap, recall_per_step
from plots.render import FIGURES, plot_results
from plots.step_check import step_check_figure
from plots.timeline import layer_pipeline_gantt
from plots.timeseries import link_utilisation, memory_over_time, throughput_over_time
from plots.validation import validation_steps

__all__ = [
    "FIGURES",
    "ablation_bars",
    "layer_pipeline_gantt",
    "layer_recall_heatmap",
    "link_utilisation",
    "memory_over_time",
    "plot_results",
    "recall_per_step",
    "step_check_figure",
    "throughput_over_time",
    "tpot_cdf",
    "ttft_cdf",
    "validation_steps",
]
