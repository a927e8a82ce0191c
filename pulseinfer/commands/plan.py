"""``pulseinfer plan``: max sustainable rate per replica and replicas for a target rate, per hardware × policy."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from pulseinfer.bigrun import add_yes, announce, check_size
from pulseinfer.commands import add_overrides, check_out_folder, check_positive
from pulseinfer.errors import UsageError, flag_names, usage_errors
from pulseinfer.outdir import results_folder
from pulseinfer.progress import Bar

# PlanConfig field or run_plan argument → the flag that sets it (study.plan.PlanError names the field)
FLAGS = {
    "routers": "--routers",
    "target_rate_per_s": "--target-rate",
    "max_requests": "--max-requests",
    "rel_tol": "--rel-tol",
    "max_replicas": "--max-replicas",
    "jobs": "--jobs",
    "backend": "--backend",
    "ray_address": "--ray-address",
}

EPILOG = """\
For each hardware × policy: the highest request rate one replica sustains under the SLO, found by
bisection on the trace's time scale (workload.target_rate_per_s), simulating the first --max-requests
requests each time; a rate counts only when the SLO holds and the run reached steady state (>= 20 requests
finished; over the middle 80 % of the sample, requests finished at >= 90 % of the rate they arrived), so a
short sample cannot report more than it delivers (a note says when the sample, not the SLO, set the
answer); with --target-rate, the fewest replicas that meet the SLO at that rate, checked by simulating
that many replicas behind each router on --max-requests × N requests (not by dividing), and never fewer
than the single-replica maximum supports (a note says why a fleet needs more).
OUT/plan.csv has one row per hardware × policy (× router with --target-rate). OUT/plan_points.csv has one
row per single-replica simulation (every rate the bisection tried), and OUT/pareto.png plots them: decode
tokens/s per GPU against tokens/s per user (1 / mean TPOT), the TPOT SLO, the Pareto front of the points that
meet the SLO and, with prices, $ per million output tokens.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan",
        help="capacity planning: max rate per replica and replicas for a target rate",
        description="Capacity planning under a tail SLO for each hardware card × policy.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", default=None, help="scenario YAML path or shipped name (default: default)")
    p.add_argument(
        "--slo",
        default=None,
        metavar="KEY=VALUE,...",
        help="p99 targets over requests, e.g. tpot_p99_ms=50,ttft_p99_s=10 (default: the scenario's slo block)",
    )
    p.add_argument("--hardware", default=None, help="hardware cards, e.g. h100-sxm,h200,a100-80gb (default: its own)")
    p.add_argument("--policies", default=None, help="policies, e.g. sglang,pulseinfer (default: the scenario's)")
    p.add_argument("--target-rate", type=float, default=None, help="requests/s the fleet must serve (finite, > 0)")
    p.add_argument("--routers", default="round_robin,least_tokens", help="routers to check (default: both)")
    p.add_argument(
        "--max-requests",
        default="600",
        help="requests per replica simulated, >= 20, or 'all' for the scenario's whole workload (default 600)",
    )
    p.add_argument("--rel-tol", type=float, default=0.05, help="bisection stops at hi/lo - 1 <= this (default 0.05)")
    p.add_argument("--max-replicas", type=int, default=64, help="give up above this many replicas (default 64)")
    p.add_argument(
        "--gpu-hour-usd",
        default=None,
        metavar="CARD=PRICE,...",
        help="price per GPU-hour, e.g. h100-sxm=2.5,h200=3.5 (adds to the scenario's cost.gpu_hour_usd): adds "
        "GPUs billed, $/h and $ per million output tokens, and the cheapest SLO-meeting fleet per card",
    )
    p.add_argument("--jobs", type=int, default=1, help="cells planned in parallel worker processes (default 1)")
    p.add_argument(
        "--backend", choices=["local", "ray"], default="local", help="where cells run (ray: pip install -e '.[ray]')"
    )
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (e.g. auto); default: a local Ray")
    p.add_argument("--out", type=Path, required=True, help="results folder (plan.csv, plan_points.csv, pareto.png)")
    add_overrides(p, "workload.max_requests=800")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_yes(p, measured=False)
    return p


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from study.executors import check_backend
    from study.plan import POINT_COLUMNS, check_plan, run_plan

    check_positive(args.target_rate, "--target-rate", "requests/s the fleet must serve")
    cfg = _config(args)
    with flag_names(FLAGS):
        check_plan(cfg, args.jobs)
        check_backend(args.backend, args.jobs, args.ray_address)
    big = _check_size(cfg, args)  # a big plan is refused before --out is touched
    check_out_folder(args.out, "plan")  # results_folder checks it too: an unusable --out fails before the announcement
    announce(big)
    started = time.perf_counter()
    points: list[dict] = []
    with (
        results_folder(args.out, command="plan") as stage,  # checks --out before planning; writes it whole
        Bar(len(cfg.hardware) * len(cfg.policies), "plan", "cell", hidden=args.no_progress) as bar,
    ):
        table = run_plan(
            cfg,
            args.jobs,
            on_sim=lambda hardware, policy, what, met: bar.note(
                f"{hardware}/{policy}: {what} {'ok' if met else 'miss'}"
            ),
            on_cell=lambda hardware, policy: bar.advance(),
            backend=args.backend,
            ray_address=args.ray_address,
            points=points,
        )
        table.to_csv(stage / "plan.csv", index=False)
        point_table = pd.DataFrame(points, columns=POINT_COLUMNS)
        point_table.to_csv(stage / "plan_points.csv", index=False)
        names = ["plan.csv", "plan_points.csv"]
        skipped = _write_pareto(point_table, cfg, stage / "pareto.png")
        if not skipped:
            names.append("pareto.png")
    print(f"\nplan under SLO {cfg.slo.describe()} ({time.perf_counter() - started:.0f} s wall)")
    print(format_plan(table))
    cheapest = format_cheapest(table)
    if cheapest:
        print("\n" + cheapest)
    for row in table.itertuples():
        if row.note:
            where = "/".join(x for x in (row.hardware, row.policy, row.router) if x)
            print(f"note: {where}: {row.note}")
    sample = _sample_note(cfg)
    if sample:
        print(sample)
    replicas_note = _replicas_note(cfg)
    if replicas_note:
        print(replicas_note)
    if skipped:
        print(f"skipped pareto.png: {skipped}")
    print(f"\nwrote {', '.join(str(args.out / name) for name in names)}")
    return 0


def _write_pareto(points, cfg, path: Path) -> str | None:
    """Draw plan_points.csv as the Pareto figure (plots/pareto.py) into ``path``; why not, when it cannot be
    drawn (no point with a finite TPOT), else None."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from plots.pareto import pareto_figure, slo_text
    from plots.style import MissingData

    cards, policies = len(cfg.hardware), len(cfg.policies)
    title = (
        f"plan: {cards} card{'s' if cards != 1 else ''} x {policies} polic{'ies' if policies != 1 else 'y'}, "
        f"SLO {slo_text(cfg.slo.bounds())}; one point per single-replica simulation"
    )
    try:
        fig = pareto_figure(points, cfg.slo.tpot_p99_s, title=title, met_text="meets the SLO in a steady-state run")
    except MissingData as exc:
        return str(exc)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=130)
    return None


def _sample_note(cfg) -> str | None:
    """A note when each replica was planned on a sample shorter than the scenario's workload: a longer sample can
    move an answer either way (on the default trace, ``--max-requests all`` moves SGLang's H200 count at 5.3 req/s
    and a 50 ms TPOT p99 from 3 to 2, docs/search.md), so the user is told how to check a decision."""
    if cfg.max_requests is None:
        return None
    from sim.config.loader import load_scenario
    from sim.workload import load_workload

    total = len(load_workload(load_scenario(cfg.scenario, cfg.overrides)))
    if total <= cfg.max_requests:
        return None
    return (
        f"note: each replica was planned on the first {cfg.max_requests:,} of the workload's {total:,} requests "
        "(--max-requests); a longer sample can change an answer either way: check a decision with "
        "--max-requests all"
    )


def _replicas_note(cfg) -> str | None:
    """A note when the scenario deploys several replicas: plan searches the count itself (no double counting)."""
    from sim.config.loader import load_scenario

    replicas = load_scenario(cfg.scenario, cfg.overrides).serving.replicas
    if replicas <= 1:
        return None
    return (
        f"note: plan sets the replica count itself (one replica, then fleets behind --routers); the scenario's "
        f"serving.replicas ({replicas}) and serving.router are not used"
    )


def _check_size(cfg, args: argparse.Namespace) -> str | None:
    """Refuse a plan above the limit without --yes; the line announcing a big one (pulseinfer.bigrun). A cell's
    simulations are estimated: ~8 of one replica (bracketing, then bisection to --rel-tol) and ~4 fleets per
    router with --target-rate. A plan is not stopped on its measured pace (it writes plan.csv only at the end)."""
    cells = len(cfg.hardware) * len(cfg.policies)
    per_cell = 8 + (4 * len(cfg.routers) if cfg.target_rate_per_s is not None else 0)
    size = f"{cells:,} cell{'s' if cells != 1 else ''} (hardware × policies), ~{per_cell} simulations each"
    return check_size("plan", size, cells * per_cell, args.yes)


def _config(args: argparse.Namespace):
    from sim.config.loader import DEFAULT_SCENARIO, load_scenario
    from study.plan import PlanConfig
    from study.slo import parse_slo, slo_from_scenario

    scenario = args.scenario or DEFAULT_SCENARIO
    base = load_scenario(scenario, args.overrides)
    with usage_errors():  # parse_slo's messages name --slo
        slo = parse_slo(args.slo) if args.slo is not None else slo_from_scenario(base)
    return PlanConfig(
        scenario=str(scenario),
        slo=slo,
        hardware=tuple(_names(args.hardware, "--hardware") if args.hardware else [base.hardware.name]),
        policies=tuple(_names(args.policies, "--policies") if args.policies else base.policies),
        overrides=tuple(args.overrides),
        target_rate_per_s=args.target_rate,
        routers=tuple(_names(args.routers, "--routers")),
        max_requests=_max_requests(args.max_requests),
        rel_tol=args.rel_tol,
        max_replicas=args.max_replicas,
        gpu_hour_usd={**base.cost.gpu_hour_usd, **parse_prices(args.gpu_hour_usd, base.hardware.name)}
        if args.gpu_hour_usd
        else dict(base.cost.gpu_hour_usd),
        swap_hardware=bool(args.hardware),
    )


def _max_requests(text: str) -> int | None:
    """``--max-requests``: an integer (checked >= 20 by check_plan) or ``all`` (None: the whole workload)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"--max-requests {text}: expected a positive number of requests per replica, or 'all'")
    return value


def _names(text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{flag}: expected comma-separated names, got {text!r}")
    return names


def parse_prices(text: str, own_card: str | None = None) -> dict[str, float]:
    """``--gpu-hour-usd CARD=PRICE[,CARD=PRICE]``: hardware card name → US$ per GPU-hour (finite, > 0). The cards
    must be shipped ones (scenarios/hardware/, any case) or ``own_card``, each named once.

    Raises:
        UsageError: a malformed item, a price that is not a positive number, an unknown or repeated card.
    """
    from sim.config.loader import card_names

    known = sorted({*card_names("hardware"), *([own_card] if own_card else [])})
    prices: dict[str, float] = {}
    for item in _names(text, "--gpu-hour-usd"):
        card, _, raw = (x.strip() for x in item.partition("="))
        try:
            price = float(raw)
        except ValueError:
            price = math.nan
        if not (math.isfinite(price) and price > 0):
            raise UsageError(f"--gpu-hour-usd {card}: expected CARD=PRICE with a positive price, got {item!r}")
        name = card if card in known else card.lower()
        if name not in known:
            raise UsageError(f"--gpu-hour-usd {card}: unknown card {card!r} (cards: {', '.join(known)})")
        if name in prices:
            raise UsageError(f"--gpu-hour-usd {card}: priced twice, got {text!r}; give each card one price")
        prices[name] = price
    return prices


def format_plan(table) -> str:
    """plan.csv in display units (:func:`plan_display`) as console text."""
    return plan_display(table).to_string(index=False)


def plan_display(table):
    """plan.csv in display units: one row per hardware × policy (× router), rounded, with units in the headers."""
    shown = table[["hardware", "policy"]].copy()
    shown["max rate/s"] = table["max_rate_per_s"].round(3)
    shown["TPOT p99 ms"] = (table["tpot_p99_s"].astype(float) * 1e3).round(1)
    shown["TTFT p99 s"] = table["ttft_p99_s"].astype(float).round(2)
    shown["delivered"] = table["delivered_frac"].astype(float).round(2)  # of offered, middle 80 % of the run
    shown["tok/s"] = table["decode_tokens_per_s"].astype(float).round(0)
    if table["target_rate_per_s"].notna().any():
        shown["router"] = table["router"]
        shown["replicas"] = table["replicas_for_target"].map(lambda n: "-" if n is None or n != n else int(n))
        shown["GPUs"] = table["gpus_for_target"].map(lambda n: "-" if n is None or n != n else int(n))
        shown["meets"] = table["meets_slo"]
        shown["fleet TPOT p99 ms"] = (table["cluster_tpot_p99_s"].astype(float) * 1e3).round(1)
        shown["fleet TTFT p99 s"] = table["cluster_ttft_p99_s"].astype(float).round(2)
    if table["usd_per_million_output_tokens"].notna().any():
        shown["GPUs billed"] = table["gpus_billed"].map(lambda n: "-" if n is None or n != n else int(n))
        shown["$/h"] = table["usd_per_hour"].astype(float).round(2)
        shown["$/M out tok"] = table["usd_per_million_output_tokens"].astype(float).round(2)
    shown["sims"] = table["num_simulations"]
    return shown


def format_cheapest(table) -> str | None:
    """Per priced card, the cheapest row meeting the SLO, cheapest first (study.plan.cheapest_fleets); None
    without prices."""
    from study.plan import cheapest_fleets

    if not table["usd_per_hour"].notna().any():
        return None
    best = cheapest_fleets(table)
    fleet = table["target_rate_per_s"].notna().any()
    title = (
        "cheapest fleet meeting the SLO at the target rate, per card"
        if fleet
        else ("cheapest replica meeting the SLO, per card (one replica at its max rate)")
    )
    if best.empty:
        return f"{title}: none (no priced row meets the SLO)"
    shown = best[["hardware", "policy"]].copy()
    if fleet:
        shown["router"] = best["router"]
        shown["replicas"] = best["replicas_for_target"].astype(int)
    else:
        shown["max rate/s"] = best["max_rate_per_s"].astype(float).round(3)
    shown["GPUs billed"] = best["gpus_billed"].astype(int)
    shown["$/GPU-h"] = best["gpu_hour_usd"].astype(float)
    shown["$/h"] = best["usd_per_hour"].astype(float).round(2)
    shown["$/M out tok"] = best["usd_per_million_output_tokens"].astype(float).round(2)
    return f"{title}:\n{shown.to_string(index=False)}"
