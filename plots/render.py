"""Draw every figure a results folder has data for: ``plot_results(results_dir, out_dir, formats)``.

``FIGURES`` lists each figure's file name, the tables it reads and how to draw it. A figure whose table is
missing, unreadable, holds impossible values (±inf, NaN where none can be, a negative time) or lacks what it needs
is skipped with a one-line note; nothing is simulated here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from matplotlib.figure import Figure

from plots.ablation import ablation_bars
from plots.fleet import fleet_latency_cdf, prefill_pool, replica_batch, replica_kv, replica_load
from plots.latency import tpot_cdf, ttft_cdf
from plots.recall import layer_recall_heatmap, recall_per_step
from plots.style import MissingData
from plots.tables import read_table, table_path, value_problem
from plots.timeline import layer_pipeline_gantt
from plots.timeseries import link_utilisation, memory_over_time, throughput_over_time

FORMATS = ("png", "svg", "pdf")
MIN_ABLATION_POLICIES = 3
WINDOW_ARRIVALS = 2.0  # time axes run to this multiple of the last arrival
MAX_FIGURE_PIXELS = 100_000_000  # a PNG above this (400 MB of RGBA while drawing) is written at a lower dpi
MAX_SCENARIO_BYTES = 1 << 20  # a results folder's scenario.yaml larger than this was not written by pulseinfer


@dataclass(frozen=True)
class FigureSpec:
    name: str  # output file stem
    tables: tuple[str, ...]  # CSV files in the results folder, passed to draw in this order
    draw: Callable[..., Figure]  # (*tables, context) -> Figure; raises MissingData to skip
    caption: str  # one sentence: what the figure shows and what to look for (a report page shows it)


def _ablation(summary: pd.DataFrame, _ctx: dict) -> Figure:
    if len(summary) < MIN_ABLATION_POLICIES:
        raise MissingData(f"summary.csv has {len(summary)} policies; ablation bars need >= {MIN_ABLATION_POLICIES}")
    return ablation_bars(summary)


FIGURES = [
    FigureSpec(
        "tpot_cdf", ("requests.csv",), lambda r, c: tpot_cdf(r, c["slo_tpot_s"]),
        "Per-request TPOT distribution, one line per policy, with the TPOT SLO dotted: a curve further left is "
        "faster decoding, and the height where it crosses the SLO line is the share of requests that met it.",
    ),
    FigureSpec(
        "ttft_cdf", ("requests.csv",), lambda r, c: ttft_cdf(r, c["slo_ttft_s"]),
        "Per-request TTFT distribution, one line per policy, with the TTFT SLO dotted where one is set: a long "
        "right tail means requests queued for prefill or for a decode slot.",
    ),
    FigureSpec(
        "throughput_over_time", ("steps.csv",), lambda s, c: throughput_over_time(s, until_s=c["until_s"]),
        "Decode tokens per second and the mean decode batch over simulated time, per policy: a policy that keeps "
        "a larger batch at a similar step time delivers more tokens; a dip marks prefill or recall stalls.",
    ),
    FigureSpec(
        "link_utilisation", ("steps.csv",), lambda s, c: link_utilisation(s, until_s=c["until_s"]),
        "Share of each time bin the host-to-GPU link is busy recalling KV, per offloading policy: near 100 % the "
        "link, not compute, bounds decoding.",
    ),
    FigureSpec(
        "recall_per_step", ("steps.csv",), lambda s, c: recall_per_step(s),
        "Distribution over decode steps of the KV volume recalled from host per step (GB), per recalling policy: "
        "a curve further left moves fewer bytes per step.",
    ),
    FigureSpec(
        "memory_over_time", ("steps.csv",),
        lambda s, c: memory_over_time(s, hbm_gib=c["hbm_gib"], until_s=c["until_s"]),
        "HBM in use (weights plus KV, capacity dotted) and host DRAM holding offloaded KV over simulated time, per "
        "policy: HBM flat at the capacity means admission is memory-bound.",
    ),
    FigureSpec(
        "layer_recall_heatmap",
        ("layer_recall.csv",),
        lambda t, c: layer_recall_heatmap(t, c["until_s"], bin_s=c["layer_bin_s"]),
        "Recalled KV per layer and time bin, one panel per recalling policy: bright rows are the layers whose "
        "recall dominates, bright columns the busy periods.",
    ),
    FigureSpec(
        "ablation_bars", ("summary.csv",), _ablation,
        "Decode throughput per policy with its ratio to the first: how much each mechanism adds over the baseline.",
    ),
    FigureSpec(
        "layer_pipeline", ("timeline.csv",), lambda t, c: layer_pipeline_gantt(t),
        "Compute, gather and transfer intervals of one typical recalling decode step, per layer: gaps in the "
        "compute row are the GPU waiting on a layer's recall.",
    ),
    FigureSpec(
        "replica_load", ("requests.csv",), lambda r, c: replica_load(r, c["until_s"]),
        "Outstanding requests (arrived, not finished) on each replica of a fleet over time, one panel per policy: "
        "lines that drift apart mean the router leaves some replicas more loaded than others.",
    ),
    FigureSpec(
        "replica_batch", ("replica_series.csv",), lambda s, c: replica_batch(s, c["until_s"]),
        "Decode batch on each replica of a fleet over time, sampled, one panel per policy: replicas pinned at the "
        "batch cap are saturated, replicas well below it are under-used.",
    ),
    FigureSpec(
        "replica_kv", ("replica_series.csv",), lambda s, c: replica_kv(s, c["until_s"]),
        "Device KV cache in use on each replica of a fleet over time, sampled, with the KV pool dotted: a replica "
        "at the pool line admits no more requests (or offloads them).",
    ),
    FigureSpec(
        "fleet_latency_cdf", ("requests.csv", "summary.csv"),
        lambda r, s, c: fleet_latency_cdf(r, s, c["slo_ttft_s"], c["slo_tpot_s"]),
        "TTFT and TPOT distributions over every request of a fleet, one line per policy labelled with its "
        "replicas and router, the SLOs dotted where set: compare the tails against the SLO lines.",
    ),
    FigureSpec(
        "prefill_pool", ("requests.csv",), lambda r, c: prefill_pool(r, c["prefill"], c["num_prefill_gpus"]),
        "Requests in remote prefill (from arrival to first token: queued or computing) on each replica of a fleet "
        "with disaggregated prefill, the replica's prefill GPUs dotted: above the line requests wait for a prefill "
        "GPU, so TTFT grows.",
    ),
]  # fmt: skip
KNOWN_TABLES = sorted({t for spec in FIGURES for t in spec.tables})


def parse_formats(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"png,svg"`` -> ``("png", "svg")``; ValueError naming the bad entry and the choices."""
    items = [f.strip().lower().lstrip(".") for f in (text.split(",") if isinstance(text, str) else text)]
    bad = [f for f in items if f not in FORMATS]
    if bad or not items:
        raise ValueError(f"--format {','.join(items)!r}: expected a comma list of {', '.join(FORMATS)}")
    return tuple(dict.fromkeys(items))


def plot_results(
    results_dir: str | Path,
    out_dir: str | Path,
    formats: Sequence[str] = ("png",),
    *,
    dpi: int = 100,
    note: Callable[[str], None] = print,
) -> list[Path]:
    """Write ``out_dir/<figure>.<format>`` for every figure the folder has data for; return the written paths.

    Raises NotADirectoryError when ``results_dir`` is not a folder and FileNotFoundError when it holds none
    of the result tables; every other gap skips one figure and calls ``note`` with the reason.
    """
    import matplotlib

    matplotlib.use("Agg")  # headless: saving never needs a display
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    formats = parse_formats(formats)
    if not results_dir.is_dir():
        raise NotADirectoryError(f"{results_dir}: {'not a folder' if results_dir.exists() else 'no such folder'}")
    if not any((results_dir / t).is_file() for t in KNOWN_TABLES):
        raise FileNotFoundError(f"{results_dir}: holds none of {', '.join(KNOWN_TABLES)}")
    tables = _TableCache(results_dir)
    context = {**_scenario_context(results_dir / "scenario.yaml"), "until_s": _window_s(tables)}
    written: list[Path] = []
    for spec in FIGURES:
        try:
            fig = spec.draw(*(tables[t] for t in spec.tables), context)
        except MissingData as exc:
            note(f"skipped {spec.name}: {exc}")
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        written += [_save(fig, out_dir / f"{spec.name}.{fmt}", dpi) for fmt in formats]
    return written


class _TableCache:
    """Reads each table once (``name.csv`` or its ``.parquet``, plots.tables); a missing or unreadable one, or one
    holding values no run writes (:func:`plots.tables.value_problem`: ±inf, NaN where a value is always defined, a
    negative time), raises MissingData for the figure that asked."""

    def __init__(self, folder: Path) -> None:
        self.folder, self._tables = folder, {}

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self._tables:
            if table_path(self.folder, name) is None:
                self._tables[name] = MissingData(f"{name} not in {self.folder}")
            else:
                try:
                    table = read_table(self.folder, name)
                except (ValueError, UnicodeDecodeError, ImportError, OSError) as exc:  # ParserError, pyarrow's too
                    self._tables[name] = MissingData(f"cannot read {name}: {str(exc).splitlines()[0]}")
                else:
                    problem = value_problem(name, table)  # no figure can draw an infinite or NaN time
                    self._tables[name] = MissingData(f"cannot draw {name}: {problem}") if problem else table
        value = self._tables[name]
        if isinstance(value, MissingData):
            raise value
        return value


def _window_s(tables: _TableCache) -> float | None:
    """Time axes end at twice the last arrival: long enough to show the drain, short enough that a policy
    that falls hopelessly behind does not squash the others into a corner. None: the whole run."""
    try:
        last_arrival = float(tables["requests.csv"]["arrival_s"].max())
    except (MissingData, KeyError, ValueError, TypeError):
        return None
    return WINDOW_ARRIVALS * last_arrival if last_arrival > 0 else None


def _scenario_context(scenario_yaml: Path) -> dict:
    """SLO bounds, HBM capacity and the prefill deployment from the resolved scenario, when it is there (lines on
    the figures; the prefill pool figure needs ``serving.prefill: disaggregated``)."""
    try:
        if scenario_yaml.stat().st_size > MAX_SCENARIO_BYTES:  # not one pulseinfer wrote: no context lines
            return _scenario_context_of(None)
        scenario = yaml.safe_load(scenario_yaml.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        scenario = None
    return _scenario_context_of(scenario)


def _scenario_context_of(scenario: object) -> dict:
    slo, hardware, serving = _section(scenario, "slo"), _section(scenario, "hardware"), _section(scenario, "serving")
    tpot_ms, ttft_s, hbm_gib = slo.get("tpot_ms"), slo.get("ttft_s"), hardware.get("hbm_gib")
    prefill, prefill_gpus = serving.get("prefill"), serving.get("num_prefill_gpus")
    bin_s = _section(scenario, "run").get("layer_bin_s")
    number = (int, float)
    return {
        "slo_tpot_s": tpot_ms * 1e-3 if isinstance(tpot_ms, number) else None,
        "slo_ttft_s": ttft_s if isinstance(ttft_s, number) else None,
        "hbm_gib": hbm_gib if isinstance(hbm_gib, number) else None,
        "prefill": prefill if isinstance(prefill, str) else None,  # colocated, disaggregated or none
        "num_prefill_gpus": prefill_gpus if isinstance(prefill_gpus, int) and prefill_gpus > 0 else None,
        "layer_bin_s": float(bin_s) if isinstance(bin_s, number) and bin_s > 0 else None,  # layer_recall's bin
    }


def _section(scenario: object, key: str) -> dict:
    value = scenario.get(key) if isinstance(scenario, dict) else None
    return value if isinstance(value, dict) else {}


def _save(fig: Figure, path: Path, dpi: int) -> Path:
    """Write ``fig``; a raster figure whose size × ``dpi`` would exceed :data:`MAX_FIGURE_PIXELS` is written at the
    highest dpi that fits, with a warning naming the figure and both dpi values (figures grow with policies and
    grid values, so a dpi fine for one figure can ask gigabytes of another)."""
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(path.suffix[1:])
    width_in, height_in = fig.get_size_inches()
    if path.suffix == ".png" and width_in * height_in * dpi * dpi > MAX_FIGURE_PIXELS:
        fitted = max(1, int((MAX_FIGURE_PIXELS / (width_in * height_in)) ** 0.5))
        warnings.warn(
            f"{path.name}: {width_in:.1f} x {height_in:.1f} in at --dpi {dpi} would be more than "
            f"{MAX_FIGURE_PIXELS:,} pixels; written at dpi {fitted}",
            stacklevel=2,
        )
        dpi = fitted
    fig.savefig(path, dpi=dpi, metadata=metadata)
    return path
