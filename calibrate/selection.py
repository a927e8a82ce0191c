"""Selection statistics of SmolLM2-135M -> ``recall_stats`` of a profile (the simulator's recall model).

Flow of `run_selection_calibration` (behind ``pulseinfer calibrate selection``):
  1. Load SmolLM2-135M (engine/weights.py) unless a `LoadedModel` is given; take the first
     context_tokens + steps tokens of the shipped text (engine/text.py).
  2. One dense prefill and one teacher-forced pass (calibrate.accuracy.teacher_forced_trace), then
     calibrate.selection_stats.collect_selection_stats for every budget (SoloHead and head-wise sets of every
     layer and step, an LRU recall buffer).
  3. Fit the recall statistics at one budget (the middle one of ``budgets`` by default) with
     calibrate/selection_fit.py, and summarise every budget.
  4. Write ``selection_stats.csv`` (all budgets), ``selection_summary.yaml`` (per budget: measured per-layer
     miss fractions, head-wise union ratio, fragments; plus the run's settings) and merge ``recall_stats``
     and ``recall_stats_source`` into ``profile.yaml`` (other sections of an existing profile are kept).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import yaml

from calibrate.selection_fit import fit_recall_stats, selection_summary
from sim.config.files import parse_yaml

if TYPE_CHECKING:
    from engine.weights import LoadedModel

MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF de-quantised, fp32)"


@dataclass
class SelectionCalibration:
    """What `run_selection_calibration` measured and wrote."""

    stats: pd.DataFrame  # calibrate.selection_stats.STATS_COLUMNS, every budget
    recall_stats: dict  # valid for sim.config.RecallStatsSpec, fitted at fit_budget
    summaries: dict[int, dict]  # budget_tokens -> calibrate.selection_fit.selection_summary
    fit_budget: int  # budget_tokens the recall_stats were fitted at
    source: str  # recall_stats_source written to the profile
    profile_path: Path


def run_selection_calibration(
    budgets: Sequence[int] = (256, 512, 1024),
    context_tokens: int = 2048,
    steps: int = 128,
    buffer_blocks: int | None = None,
    out_dir: str | Path = "results/calibrate_selection",
    model: LoadedModel | None = None,
    fit_budget: int | None = None,
    working_set_steps: int = 12,
) -> SelectionCalibration:
    """Measure selection statistics on SmolLM2 and write them into ``out_dir/profile.yaml`` (module docstring).

    Args:
        budgets: budget_tokens to measure, each >= 16 (one 16-token block).
        context_tokens: prefilled tokens N; N + steps must fit the shipped text (about 24K tokens).
        steps: teacher-forced decode steps measured, > working_set_steps.
        buffer_blocks: LRU recall buffer per layer in blocks; None: twice each budget's blocks.
        out_dir: output folder (created).
        model: an already loaded model; None loads SmolLM2 (4-8 s).
        fit_budget: the budget the recall_stats are fitted at; None: the middle of ``budgets`` (sorted).
        working_set_steps: w of the returning-block count.

    Returns:
        A SelectionCalibration.

    Raises:
        ValueError: bad budgets, fit_budget not among them, steps <= working_set_steps, buffer too small.
        engine.weights.ModelNotInstalled: model is None and SmolLM2 is not installed.
    """
    from calibrate.accuracy import DEFAULT_LAYOUT

    budgets = sorted(budgets)
    fit_budget = budgets[len(budgets) // 2] if fit_budget is None else fit_budget
    _check(budgets, fit_budget, context_tokens, steps, working_set_steps)
    if model is None:
        from engine.weights import load_smollm2

        model = load_smollm2()
    stats = _measure(model, budgets, context_tokens, steps, buffer_blocks, working_set_steps)
    num_layers = model.config.num_layers
    per_budget = {b: stats[stats["budget_tokens"] == b] for b in budgets}
    recall_stats = fit_recall_stats(per_budget[fit_budget], num_layers, working_set_steps, DEFAULT_LAYOUT.block_size)
    summaries = {b: selection_summary(df, num_layers) for b, df in per_budget.items()}
    layout, buffer = DEFAULT_LAYOUT, summaries[fit_budget]["buffer_blocks"]
    source = (
        f"{MODEL_NAME}, engine/data/python_reference.txt, context {context_tokens} tokens, {steps} teacher-forced "
        f"steps, SoloHead (Quest bounds) at budget {fit_budget} tokens, block {layout.block_size}, sink "
        f"{layout.sink_tokens}, recent {layout.recent_tokens}, LRU buffer {buffer} blocks, "
        f"{datetime.date.today().isoformat()}"
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats.to_csv(out / "selection_stats.csv", index=False)
    _write_summary(out / "selection_summary.yaml", source, recall_stats, summaries)
    profile_path = merge_recall_stats(out / "profile.yaml", recall_stats, source)
    return SelectionCalibration(stats, recall_stats, summaries, fit_budget, source, profile_path)


def _measure(
    model: LoadedModel,
    budgets: list[int],
    context_tokens: int,
    steps: int,
    buffer_blocks: int | None,
    working_set_steps: int,
) -> pd.DataFrame:
    """Step 2 of the module docstring: STATS_COLUMNS rows of every budget, on DEFAULT_LAYOUT."""
    import torch

    from calibrate.accuracy import DEFAULT_LAYOUT, teacher_forced_trace
    from calibrate.selection_stats import collect_selection_stats
    from engine.text import corpus_tokens

    tokens = corpus_tokens(model.tokenizer, context_tokens + steps).to(model.weights.embed.device)
    with torch.no_grad():
        trace = teacher_forced_trace(model.config, model.weights, tokens, context_tokens, DEFAULT_LAYOUT)
        return collect_selection_stats(trace, budgets, DEFAULT_LAYOUT, buffer_blocks, working_set_steps)


def _check(budgets: list[int], fit_budget: int, context_tokens: int, steps: int, working_set_steps: int) -> None:
    """Raises ValueError naming the argument that does not fit."""
    if not budgets or budgets[0] < 16:
        raise ValueError(f"budgets={budgets} must be non-empty, each >= 16 tokens (one block)")
    if fit_budget not in budgets:
        raise ValueError(f"fit_budget={fit_budget} must be one of budgets={budgets}")
    if context_tokens < 1:
        raise ValueError(f"context_tokens={context_tokens} must be >= 1")
    if working_set_steps < 1 or steps <= working_set_steps:
        raise ValueError(f"steps={steps} must exceed working_set_steps={working_set_steps} >= 1")


def _write_summary(path: Path, source: str, recall_stats: dict, summaries: dict[int, dict]) -> None:
    data = {
        "source": source,
        "recall_stats": recall_stats,
        "budgets": {int(b): s for b, s in summaries.items()},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def merge_recall_stats(path: str | Path, recall_stats: dict, source: str, name: str = "smollm2-selection") -> Path:
    """Set the top-level ``recall_stats`` and ``recall_stats_source`` of a profile YAML, keeping everything else.

    Args:
        path: the profile file; created (with ``name``) if it does not exist.
        recall_stats: a RecallStatsSpec-valid dict of plain lists and numbers.
        source: what the statistics were measured on.
        name: ``name`` of a new profile.

    Returns:
        The path written.

    Raises:
        ValueError: if an existing file is not a YAML mapping.
    """
    path = Path(path)
    if path.exists():
        data = parse_yaml(path.read_text(encoding="utf-8"), str(path))  # bounded: size, nesting, aliases
        if data is None:
            data = {"name": name}
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a YAML mapping of profile sections, got {type(data).__name__}")
    else:
        data = {"name": name}
    data["recall_stats"] = recall_stats
    data["recall_stats_source"] = source
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
