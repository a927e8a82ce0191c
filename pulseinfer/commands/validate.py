"""``pulseinfer validate``: the engine's decode loop against the simulator on the same requests and profile; with
``--measured FILE``, a real server's benchmark output against the simulator on the same load."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pulseinfer.commands import add_overrides, check_out_folder, check_seed, import_torch, int_list, resolve_device
from pulseinfer.commands.measured import add_measured_options, run_validate
from pulseinfer.errors import UsageError, usage_errors
from pulseinfer.helpfmt import DefaultsHelpFormatter
from pulseinfer.outdir import results_folder
from pulseinfer.progress import Bar


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "validate",
        help="run the engine and the simulator on the same requests; print the TPOT and throughput error",
        description="Decode a small workload (default: 8 requests, contexts 2K-16K tokens, 64-36 output tokens) "
        "with the real engine on the profile's model, simulate the same requests with the same policy and "
        "profile, and print the error of mean TPOT, p99 TPOT and decode throughput per policy. Writes "
        "validation.csv, validation_steps.csv and validation_steps.png to --out. Needs torch. "
        "With --measured FILE instead (no torch): read a real server's benchmark output (SGLang bench_serving "
        "--output-details JSONL, vllm bench serve --save-detailed JSON, guidellm report, inference-perf per-request "
        "lifecycle metrics, vLLM request spans, AIPerf profile_export.jsonl, MLCommons endpoints result_summary.json, "
        "requests.jsonl + meta.json; traces/README.md), rebuild its load (lengths; send times, else the recorded "
        "rate or concurrency; prefix-cache hits from recorded cached tokens, prompt texts or --prefix-share), "
        "simulate it on SCENARIO's model, card, TP and serving mode with --set overrides, and write validation.csv "
        "(metric, measured, simulated, error_pct: mean/p50/p99 TTFT, TPOT, ITL, E2E, throughput), requests.csv and "
        "CDF overlays of TTFT and TPOT; with --run all, every run of the file and validation_sweep.png. A file of "
        "per-iteration ForwardPassMetrics (SGLang, Dynamo) is checked step by step instead: step_check.csv, "
        "step_check_summary.csv, step_check.png.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "scenario", nargs="?", default=None, help="with --measured: scenario name or YAML (default: default)"
    )
    p.add_argument(
        "--profile", default=None, help="profile.yaml, a `pulseinfer calibrate --out` folder or a shipped profile"
    )
    p.add_argument("--measured", type=Path, default=None, metavar="FILE", help="a real server's benchmark output")
    p.add_argument(
        "--format", dest="measured_format", default="auto", help="with --measured: the file's format (default auto)"
    )
    add_measured_options(p)
    add_overrides(p, "serving.prefill=colocated")
    p.add_argument(
        "--policy",
        default=None,
        help="policies, comma-separated (sglang, pulseinfer, headwise); default sglang,pulseinfer, or with "
        "--measured the one policy to replay on (default sglang)",
    )
    p.add_argument(
        "--contexts", default=None, help="context tokens per request, comma-separated (default 2048,...,16384)"
    )
    p.add_argument(
        "--output-tokens", default=None, help="output tokens per request, comma-separated (default 64,60,...,36)"
    )
    p.add_argument("--repeats", type=int, default=3, help="engine runs per policy; each step's fastest run is compared")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the profile's device)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the profile's)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and KV (engine) and of the simulation")
    p.add_argument("--out", type=Path, default=Path("results/validation"), help="folder for the tables and the plot")
    return p


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    if args.measured is not None:
        return run_validate(args)
    if args.profile is None:
        raise UsageError("--profile: required to validate against the engine (or give --measured FILE)")
    if args.scenario is not None or args.overrides:
        raise UsageError("SCENARIO and --set: only with --measured FILE (the engine runs the profile's own model)")
    args.policy = args.policy or "sglang,pulseinfer"
    torch = import_torch()
    from calibrate.validate import prepare, speed_drift, validate
    from sim.config.profiles import load_profile

    profile = load_profile(args.profile)
    missing = [k for k in ("hardware", "model", "compute") if getattr(profile, k) is None]
    if missing:
        raise UsageError(f"--profile {args.profile}: has no {', '.join(missing)}; run `pulseinfer calibrate` first")
    device = resolve_device(args.device or str(profile.metadata.get("device") or "") or None, torch)
    check_out_folder(args.out, "validate")
    policies, workload = _policies_and_workload(args)
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads {args.threads}: must be >= 1")
    torch.set_num_threads(args.threads or int(profile.metadata.get("threads") or 1))
    started = time.perf_counter()
    with results_folder(args.out, command="validate") as stage:  # written whole, only when complete
        # the simulator refuses a profile (ScenarioError, CapacityError: ValueErrors), a request it cannot finish
        # or an engine run too large for memory before any engine run
        with usage_errors(f"--profile {args.profile}: "):
            simulated = prepare(profile, policies, workload, device, args.seed)
        drift = speed_drift(profile, device, seed=args.seed)
        with usage_errors(f"--profile {args.profile}: "), Bar(len(policies), "validate", "policy") as bar:
            table, steps = validate(
                profile, policies, workload, device, args.repeats, args.seed, progress=bar.stage, simulated=simulated
            )
        subject = (
            f"model {profile.model.name} · card {profile.hardware.name} · device {device} · profile {args.profile}"
        )
        _write(stage, table, steps, subject)
    contexts = workload.contexts
    print(
        f"\n{profile.model.name} on {device}: {len(contexts)} requests, contexts {min(contexts)}-{max(contexts)} "
        f"tokens, {args.repeats} engine runs per policy, {time.perf_counter() - started:.0f} s"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.2f}"))
    print(f"\nengine speed now vs at calibration (one dense grid point, layer time now / then): {drift:.2f}")
    if abs(drift - 1) > 0.15:
        print(
            f"note: the machine runs {abs(drift - 1):.0%} {'slower' if drift > 1 else 'faster'} than when the profile "
            "was calibrated; the errors above include that drift. Calibrate again on a quiet machine, then validate."
        )
    print(f"\ntables and plot in {args.out}/ (validation.csv, validation_steps.csv, validation_steps.png)")
    return 0


def _policies_and_workload(args: argparse.Namespace):
    """The ``--policy`` names and the ValidationWorkload of ``--contexts``/``--output-tokens``. Raises UsageError."""
    from calibrate.harness import ENGINE_POLICIES
    from calibrate.validate import ValidationWorkload

    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: must be >= 1")
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in ENGINE_POLICIES]
    if unknown or not policies:
        raise UsageError(f"--policy {args.policy!r}: expected names from {', '.join(ENGINE_POLICIES)}")
    default = ValidationWorkload()
    contexts = int_list(args.contexts, "--contexts") if args.contexts else default.contexts
    outputs = int_list(args.output_tokens, "--output-tokens", 2) if args.output_tokens else None
    if outputs is None:
        outputs = default.output_tokens if len(contexts) == len(default.contexts) else (64,) * len(contexts)
    if len(outputs) == 1:
        outputs = outputs * len(contexts)
    with usage_errors():  # ValidationWorkload checks that the lists pair up
        return policies, ValidationWorkload(contexts, outputs)


def _write(out: Path, table, steps, subject: str = "") -> None:
    """validation.csv, validation_steps.csv and validation_steps.png (``subject`` under its title) into ``out``."""
    from plots import validation_steps

    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "validation.csv", index=False)
    steps.to_csv(out / "validation_steps.csv", index=False)
    validation_steps(steps, subject).savefig(out / "validation_steps.png", dpi=120)
