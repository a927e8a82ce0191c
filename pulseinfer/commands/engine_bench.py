"""``pulseinfer engine-bench``: recall throughput of per_fragment vs gather_scatter, next to a plain copy
(calibrate/bench_recall.py, the same measurement ``pulseinfer calibrate`` fits)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pulseinfer.commands import check_out_folder, check_seed, import_torch, resolve_device
from pulseinfer.errors import UsageError, usage_errors
from pulseinfer.helpfmt import DefaultsHelpFormatter
from pulseinfer.outdir import results_folder


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "engine-bench",
        help="measure KV recall: per_fragment vs gather_scatter vs a plain copy",
        description="Recall the same selected KV blocks with per_fragment (one copy each) and gather_scatter "
        "(gather, one copy, scatter) for fragment sizes 4-64 KiB, interleaved, next to a plain large copy; "
        "print GB/s and ratios and write engine_bench.csv. Needs torch (pip install -e '.[engine]').",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("results/engine_bench"), help="folder for engine_bench.csv")
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller pools (seconds on a CPU)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats per point (default: 15, quick 5)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 when the device is the CPU, as per_fragment's small copies run on one "
        "thread anyway; torch's choice on CUDA, where more threads speed up the host-side gather)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the host and device block choice")
    return p


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    torch = import_torch()
    from calibrate.bench_recall import format_table, run_bench

    settings = _settings(args, torch)
    threads = args.threads or (1 if settings.device == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    with results_folder(args.out, command="engine-bench") as stage:  # written whole, only when complete
        results = run_bench(settings)
        results.to_csv(stage / "engine_bench.csv", index=False)
    print(_header(settings, torch))
    print(format_table(results))
    print(f"\nrows in {args.out / 'engine_bench.csv'}")
    return 0


def _settings(args: argparse.Namespace, torch):
    """BenchSettings from the arguments. Raises UsageError naming the bad argument."""
    import dataclasses

    from calibrate.bench_recall import BenchSettings, quick_settings

    check_out_folder(args.out, "engine-bench")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads {args.threads}: must be >= 1")
    device = resolve_device(args.device, torch)
    with usage_errors():  # BenchSettings checks its fields (repeats >= 1, ...)
        settings = quick_settings(device) if args.quick else BenchSettings(device=device)
        settings = dataclasses.replace(settings, seed=args.seed)
        if args.repeats is not None:
            settings = dataclasses.replace(settings, repeats=args.repeats)
    return settings


def _header(settings, torch) -> str:
    where = (
        f"on {torch.cuda.get_device_name(settings.device)} (host pool pinned)"
        if settings.device.startswith("cuda")
        else "on CPU: the 'device' pool is a separate preallocated CPU tensor standing in for device memory, so "
        "every copy 'to the device' is a memory-to-memory copy into it (gather_scatter: gather into staging, then "
        "one scatter from staging into it)"
    )
    return (
        f"engine-bench {where}; torch {torch.__version__}, {torch.get_num_threads()} CPU threads; "
        f"{settings.recall_bytes >> 20} MiB recalled per measurement from a {settings.host_pool_bytes >> 20} MiB "
        f"host pool, median of {settings.repeats} interleaved repeats\n"
    )
