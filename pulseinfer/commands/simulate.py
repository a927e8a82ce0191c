"""``pulseinfer simulate``: replay a scenario's workload through each policy and compare them."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pulseinfer.commands import add_overrides, collections_paused, plot
from pulseinfer.errors import UsageError
from pulseinfer.outdir import results_folder
from pulseinfer.progress import TaskBars

EXPECTED_FLEET_SKIP = "not in"  # plots/render.py's note for a table the folder lacks (a fleet's per-step tables)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "simulate",
        help="replay a trace through each policy and compare them",
        description="Replay a scenario's workload through each policy on one simulated GPU and print a "
        "summary table (one row per policy, with ratios to sglang).",
    )
    p.add_argument(
        "scenario",
        nargs="?",
        default=None,
        help="scenario YAML path or shipped scenario name (default: the shipped 'default' scenario)",
    )
    p.add_argument("--out", type=Path, default=None, help="results folder (default: results/<scenario name>)")
    add_overrides(p, "workload.time_scale=0.5 --set policies=sglang,pulseinfer")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument(
        "--summary-only",
        action="store_true",
        help="keep no per-step records and write only summary.csv, the requests table and scenario.yaml "
        "(sets run.tables=summary; the summary is the same)",
    )
    p.add_argument(
        "--gpu-hour-usd",
        default=None,
        metavar="CARD=PRICE,...",
        help="price per GPU-hour, e.g. h200=3.5 (adds to the scenario's cost.gpu_hour_usd): the summary gains "
        "$/h and $ per million output tokens for the scenario's card",
    )
    p.add_argument("--plots", action="store_true", help="draw the figures into OUT/plots after the run")
    plot.add_format_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    with collections_paused():
        from pulseinfer.report import format_bill, format_replicas, format_summary, rejection_lines
        from pulseinfer.tables_io import write_result
        from sim.config import load_scenario
        from sim.config.scenario import CostSpec
        from sim.metrics import unfinished_counts
        from sim.run import simulate, with_ratios
        from traces import trace_notes

    formats = plot.check_format_arguments(args) if args.plots else ()
    overrides = [*args.overrides, "run.tables=summary"] if args.summary_only else args.overrides
    scenario = load_scenario(args.scenario, overrides)
    if args.gpu_hour_usd is not None:
        from pulseinfer.commands.plan import parse_prices

        prices = {**scenario.cost.gpu_hour_usd, **parse_prices(args.gpu_hour_usd, scenario.hardware.name)}
        scenario = scenario.model_copy(update={"cost": CostSpec(gpu_hour_usd=prices)})
        card = scenario.hardware.name
        if card.lower() not in {name.lower() for name in prices}:
            print(
                f"note: --gpu-hour-usd prices {', '.join(sorted(prices))}, not this scenario's card {card}: the "
                "summary has no cost columns",
                file=sys.stderr,
            )
    fleet = scenario.serving.replicas > 1  # a fleet's figures need no per-step tables (plots/fleet.py)
    if args.plots and scenario.run.tables == "summary" and not fleet:
        raise UsageError(
            "--plots: most figures need the per-step tables, which --summary-only (run.tables=summary) does not "
            "keep; drop one of them"
        )
    out = args.out or Path("results") / scenario.name
    started = time.perf_counter()
    figures = []
    with results_folder(out, command="simulate") as stage:  # checks --out before simulating; writes it whole
        with TaskBars("req", hidden=args.no_progress or not scenario.run.progress) as progress:
            result = simulate(scenario, progress=progress)
        rejected = {
            name: rejection_lines(r.requests, scenario.model.max_seq_len, r.kv_pool_gib)
            for name, r in result.policies.items()
        }
        if all(0 < unfinished_counts(r.requests)["rejected"] == len(r.requests) for r in result.policies.values()):
            why = "; ".join(f"{name} {', '.join(lines)}" for name, lines in rejected.items())
            raise UsageError(f"nothing can run, every request was rejected: {why}")  # (before writing results)
        wall_s = time.perf_counter() - started
        written = write_result(result, stage)
        if formats:
            from plots.render import plot_results

            def note(line: str) -> None:  # a figure skipped: said of OUT, not of its staging folder
                if not (fleet and EXPECTED_FLEET_SKIP in line):  # a fleet keeps no per-step tables, by design
                    print(line.replace(str(stage), str(out)))

            figures = plot_results(stage, stage / "plots", formats, dpi=args.dpi, note=note)
    n = len(result.workload)
    noun = "request" if n == 1 else "requests"
    serving = scenario.serving
    where = f"{serving.replicas} replicas x TP{serving.tp_size} behind {serving.router}" if fleet else "one replica"
    engine = scenario.engine
    release = (
        f" ({engine.engine} {engine.version})"
        if engine.version and engine.name != f"{engine.engine}-{engine.version}"
        else ""
    )
    head = f"{scenario.name}: {scenario.model.name} on {scenario.hardware.name} ({where})"
    print(f"\n{head}, engine {engine.name}{release}, {n} {noun}, seed {scenario.seed}")
    if engine.note:
        print(f"  engine: {engine.note}")
    for note in trace_notes(result.workload):
        print(f"  workload: {note}")
    print(format_summary(with_ratios(result.summary)))
    print("\n" + format_bill(result.summary))
    if result.replicas is not None:
        print("\n" + format_replicas(result.replicas))
    refused = [f"{name} {line}" for name, lines in rejected.items() for line in lines]  # requests that can never run
    if refused:
        print("\n" + "\n".join(refused))
    print(f"\nsimulated in {wall_s:.1f} s wall; tables in {out}/ ({', '.join(written)})")
    if formats:
        print(f"{len(figures)} figure file(s) in {out / 'plots'}/")
    return 0
