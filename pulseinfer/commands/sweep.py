"""``pulseinfer sweep``: grids × policies × seeds, one cached simulation per point; sweep.csv, the Pareto figure and
a ratio heatmap."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from pulseinfer.bigrun import CONFIRM_SIMULATIONS, Pace, add_yes, announce, check_size, write
from pulseinfer.commands import add_overrides, check_out_folder
from pulseinfer.errors import UsageError, flag_names
from pulseinfer.in_place import mark_results
from pulseinfer.progress import Bar

# SweepConfig field / run_sweep argument → flag (SweepError, ExecutorError and AccuracyError name the field)
FLAGS = {
    "grids": "--grid",
    "policies": "--policies",
    "num_seeds": "--seeds",
    "jobs": "--jobs",
    "backend": "--backend",
    "ray_address": "--ray-address",
    "compare": "--compare",
    "metric": "--metric",
    "accuracy": "--accuracy",
    "slo": "--slo",
}
METRIC_ALIASES = {"goodput": "goodput_requests_per_s", "throughput": "decode_tokens_per_s", "tpot_p99": "tpot_p99_s"}
# A grid key whose last part is one of these sets the load: the Pareto figure joins a configuration's points along it.
LOAD_KEYS = ("target_rate_per_s", "rate_per_s", "session_rate_per_s", "max_concurrency", "time_scale")

EPILOG = """\
Each point (grid values × policy × seed) is one simulation of one policy on its resolved scenario, a pure
function of that scenario; results are cached under OUT/cache by a hash of the resolved scenario, policy,
seed and code version, so rerunning with one more grid value simulates only the new points.
OUT/sweep.csv: one row per point (grid values, policy, seed, slo_met, every summary column, GPUs billed
and, where the card has a price, $ per million output tokens, the interpolated accuracy of the policy's
selection and budget, error). OUT/pareto.png: decode tokens/s per GPU against tokens/s per user (1 / mean
TPOT), seeds averaged, one configuration per policy × the grid values that are not a load, its points
joined along the load key (a rate, workload.synthetic.max_concurrency or workload.time_scale) if one is
swept, the Pareto front of the points meeting the SLO (on at least half of the seeds). With --compare A/B
and two grid keys (three: the first makes panels): OUT/compare.csv and OUT/compare_<metric>.png, a heatmap
of A / B.

Example (a 3 x 3 grid, two policies, on Ray):
  pulseinfer sweep default --grid workload.synthetic.prompt_tokens_mean=8192,32768,131072 \\
      --grid workload.synthetic.rate_per_s=0.5,1,2 --set workload.trace=null ... \\
      --policies sglang,pulseinfer --compare pulseinfer/sglang --backend ray --out results/sweep
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sweep",
        help="grid sweep: grids x policies x seeds, cached; sweep.csv and an A/B heatmap",
        description="Simulate every combination of grid values, policies and seeds once (cached by content) "
        "on local processes or Ray.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", default=None, help="scenario YAML path or shipped name (default: default)")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="a dotted scenario key and its values (repeatable; the product is swept)",
    )
    p.add_argument("--policies", default=None, help="policies to simulate at each point (default: the scenario's)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per point: the scenario's seed + 0..N-1 (default 1)")
    p.add_argument(
        "--slo",
        default=None,
        metavar="KEY=VALUE,...",
        help="p99 targets (tpot_p99_ms, ttft_p99_s) and accuracy bounds (kl_nats, rel_l2, mass_pct, worst_head_pct, "
        "argmax_pct) for slo_met; default: the scenario's slo block",
    )
    p.add_argument("--accuracy", type=Path, default=None, help="accuracy.csv (default: the shipped SmolLM2 2K table)")
    p.add_argument("--compare", default=None, metavar="A/B", help="heatmap of policy A / policy B (two grid keys)")
    p.add_argument(
        "--metric",
        default="goodput",
        help="compared sweep.csv column, or goodput / throughput / tpot_p99 (default goodput)",
    )
    p.add_argument("--jobs", type=int, default=1, help="worker processes (local) or CPUs of a local Ray (default 1)")
    p.add_argument("--backend", choices=["local", "ray"], default="local", help="where simulations run")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (e.g. auto, ray://host:10001)")
    p.add_argument("--out", type=Path, required=True, help="results folder (cache/, sweep.csv, pareto.png, compare.*)")
    add_overrides(p, "workload.synthetic.num_requests=40")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_yes(p)
    return p


def run(args: argparse.Namespace) -> int:
    from study.executors import check_backend
    from study.sweep import compare_table, num_points, resolve_points, run_sweep

    with flag_names(FLAGS):
        check_backend(args.backend, args.jobs, args.ray_address)
        cfg, compare = _config(args)
        big = _check_size(cfg, args)  # before resolving: a big grid is refused at once
        if big and num_points(cfg) > CONFIRM_SIMULATIONS:  # let through by --yes: say so before resolving,
            announce(big)  # which alone takes ~16 ms a point
            big = None
        points = resolve_points(cfg)  # every point's scenario validated before anything runs or is written
        if cfg.accuracy is not None:
            cfg.accuracy.check_points([(p.scenario, p.policy) for p in points])
        total = len(points)
        check_out_folder(args.out, "sweep")
        announce(big)  # every input checked: the size, before anything runs
        # a results folder pulseinfer writes in place: a re-run uses it again (its cache/ is what makes re-runs cheap)
        tables = ["sweep.csv", "pareto.png", *(["compare.csv", f"compare_{compare[2]}.png"] if compare else [])]
        mark_results(args.out, "sweep", files=tables, trees=["cache"])
        started = time.perf_counter()
        with Bar(total, "sweep", "point", hidden=args.no_progress) as bar:
            pace = Pace("sweep", "point", total, args.jobs, args.yes, per_task=len(cfg.policies))

            def on_point(n: int) -> None:
                bar.reach(n)
                pace.update(n)  # a run measured too long stops here without --yes (its points stay cached)

            result = run_sweep(
                cfg, args.out, args.backend, args.jobs, args.ray_address, on_point, points, on_invalid=_warn
            )
        wall_s = time.perf_counter() - started
        outputs = {"sweep.csv": lambda path: result.table.to_csv(path, index=False)}
        pareto, skipped = _pareto(result.table, cfg)
        if pareto is not None:
            outputs["pareto.png"] = lambda path: _save(pareto, path)
        if compare:
            a, b, metric = compare
            cells = compare_table(result.table, cfg.keys, a, b, metric)
            outputs["compare.csv"] = lambda path: cells.to_csv(path, index=False)
            outputs[f"compare_{metric}.png"] = lambda path: _heatmap(cells, cfg.keys, a, b, metric, path)
    files = write_whole(args.out, outputs)
    _remove_stale(args.out, set(outputs))
    print(
        f"\nsweep: {total} points ({result.num_simulated} simulated, {result.num_cached} from the cache), "
        f"backend {args.backend}, {args.jobs} job(s), {wall_s:.1f} s wall"
    )
    if compare:
        print(f"\n{compare[0]} / {compare[1]}, {compare[2]} (mean over seeds):")
        print(cells.to_string(index=False))
    if skipped:
        print(f"skipped pareto.png: {skipped}")
    print(f"\nwrote {', '.join(str(f) for f in files)}")
    return 0


def load_key(keys: list[str]) -> str | None:
    """The first grid key that sets the load (its last dotted part in :data:`LOAD_KEYS`), or None."""
    return next((k for k in keys if k.rsplit(".", 1)[-1] in LOAD_KEYS), None)


def pareto_points(table, keys: list[str]):
    """sweep.csv averaged over seeds, one row per grid values × policy (grid order): the Pareto figure's points
    (plots/pareto.py), ``meets_slo`` where at least half of the seeds met the SLO."""
    means = [c for c in ("decode_tokens_per_s", "tpot_mean_s", "gpus", "usd_per_million_output_tokens") if c in table]
    grouped = table.groupby([*keys, "policy"], sort=False, dropna=False)
    points = grouped[means].mean().join(grouped["slo_met"].mean().rename("slo_met_frac")).reset_index()
    points["meets_slo"] = points["slo_met_frac"] >= 0.5
    return points


def _pareto(table, cfg):
    """(the Pareto figure of the sweep, None), or (None, why it cannot be drawn)."""
    from plots.pareto import pareto_figure, slo_text
    from plots.style import MissingData

    load = load_key(cfg.keys)
    others = [k for k in cfg.keys if k != load]
    grid = " x ".join(f"{k.rsplit('.', 1)[-1]} ({len(v)})" for k, v in cfg.grids)
    seeds = f", mean of {cfg.num_seeds} seeds" if cfg.num_seeds > 1 else ""
    title = f"sweep: {grid} x {len(cfg.policies)} polic{'ies' if len(cfg.policies) != 1 else 'y'}, SLO "
    title += slo_text(cfg.slo.bounds()) + seeds
    met_text = "meets the SLO" + (" on at least half of the seeds" if cfg.num_seeds > 1 else "")
    try:
        fig = pareto_figure(
            pareto_points(table, cfg.keys),
            cfg.slo.tpot_p99_s,
            label_columns=["policy", *others],
            order_column=load,
            title=title,
            met_text=met_text,
        )
    except MissingData as exc:
        return None, str(exc)
    return fig, None


def _save(fig, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=130)


def _config(args: argparse.Namespace):
    """SweepConfig and (A, B, metric) or None; every input checked before anything runs."""
    from sim.config.loader import DEFAULT_SCENARIO, load_scenario
    from study.accuracy import OUTPUTS, AccuracySlo, load_accuracy_table, split_slo
    from study.slo import parse_slo, slo_from_scenario
    from study.sweep import METRIC_COLUMNS, SweepConfig, SweepError, parse_grid

    scenario = args.scenario or DEFAULT_SCENARIO
    grids = tuple(parse_grid(g) for g in args.grid)
    # The first value of each grid completes the scenario (a synthetic workload may need a swept key).
    base = load_scenario(scenario, [*args.overrides, *(f"{k}={v[0]}" for k, v in grids)])
    tail, bounds = split_slo(args.slo)
    try:
        slo = parse_slo(tail) if tail else slo_from_scenario(base)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip()) if args.policies else base.policies
    cfg = SweepConfig(
        scenario=str(scenario),
        grids=grids,
        policies=tuple(policies),
        num_seeds=args.seeds,
        overrides=tuple(args.overrides),
        slo=slo,
        accuracy=AccuracySlo(load_accuracy_table(args.accuracy), bounds),
    )
    if args.compare is None:
        return cfg, None
    a, sep, b = (s.strip() for s in args.compare.partition("/"))
    if not sep or not a or not b or a == b:
        raise SweepError(f"{args.compare!r}: expected A/B, two different policies", "compare")
    missing = [p for p in (a, b) if p not in cfg.policies]
    if missing:
        raise SweepError(f"{args.compare}: {missing} not among the swept policies {list(cfg.policies)}", "compare")
    if len(grids) not in (2, 3):
        raise SweepError(f"needs two grid keys (three: the first makes panels), got {len(grids)}", "compare")
    metric = METRIC_ALIASES.get(args.metric, args.metric)
    if metric not in [*METRIC_COLUMNS, *OUTPUTS]:
        raise SweepError(f"{args.metric!r}: expected one of {', '.join(METRIC_ALIASES)} or a summary column", "metric")
    return cfg, (a, b, metric)


def _remove_stale(out: Path, written: set[str]) -> None:
    """Remove the figures and comparison of an earlier run in ``out`` that this run did not write (no --compare now,
    another --metric, a Pareto figure that could not be drawn): each would be read as this run's. Only files the
    folder's marker lists as pulseinfer's are removed."""
    from pulseinfer.marker import read_claims

    claims = read_claims(out)
    for path in [out / "compare.csv", out / "pareto.png", *out.glob("compare_*.png")]:
        if path.name not in written and claims is not None and claims.owns(path.name, folder=False) and path.is_file():
            path.unlink()


def _warn(message: str) -> None:
    write(f"warning: {message}")


def _check_size(cfg, args: argparse.Namespace) -> str | None:
    """Refuse a sweep above the limit without --yes; the line announcing a big one (pulseinfer.bigrun)."""
    from study.sweep import num_points

    n = num_points(cfg)
    grid = " × ".join(str(len(values)) for _, values in cfg.grids)
    size = (
        f"{n:,} points ({grid} grid values × {len(cfg.policies)} "
        f"polic{'ies' if len(cfg.policies) > 1 else 'y'} × {cfg.num_seeds} seed{'s' if cfg.num_seeds > 1 else ''})"
    )
    return check_size("sweep", size, n, args.yes)


def _heatmap(cells, keys: list[str], a: str, b: str, metric: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from plots.sweep import sweep_ratio_heatmap

    panel, x_key, y_key = (None, *keys) if len(keys) == 2 else keys
    fig = sweep_ratio_heatmap(cells, x_key, y_key, a, b, metric, panel_key=panel)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=130)


def write_whole(out: Path, outputs: dict) -> list[Path]:
    """Write each output into a temp folder inside ``out``, then move them into place (a reader never sees a
    half-written file, and a failed writer leaves the old files). Returns the final paths."""
    tmp = Path(tempfile.mkdtemp(prefix=".sweep-", dir=out))
    try:
        for name, write in outputs.items():
            write(tmp / name)
        paths = []
        for name in outputs:
            os.replace(tmp / name, out / name)
            paths.append(out / name)
        return paths
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
