"""``pulseinfer search``: tune a policy's knobs over a scenario's trace under a tail SLO (Optuna TPE)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pulseinfer.bigrun import Pace, add_yes, announce, check_size
from pulseinfer.commands import add_overrides, check_out_folder, check_seed
from pulseinfer.errors import EXIT_FAILED, UsageError, flag_names, usage_errors
from pulseinfer.in_place import mark_results
from pulseinfer.progress import Bar

# run_search argument or SearchConfig field → the flag that sets it (study.search.SearchError names the field)
FLAGS = {"total_trials": "--trials", "jobs": "--jobs", "study_name": "--study", "accuracy": "--accuracy",
         "slo": "--slo", "objective": "--objective", "storage": "--storage"}  # fmt: skip

EPILOG = """\
The space file names dotted scenario keys with {low, high[, log, step]} or {choices: [...]}; the
shipped example is scenarios/spaces/pulseinfer.yaml (--space pulseinfer). Each trial simulates the
searched policy once with the scenario's seed. OUT receives trials.csv (one row per trial), pareto.csv
(feasible trials not dominated in decode tokens/s vs TPOT p99) and best.yaml: the whole scenario with
the best trial's knobs and all of its policies, the tuned one first (so it reproduces the trial), runnable
as `pulseinfer simulate OUT/best.yaml`.

Accuracy: --slo kl_nats=0.005 (or rel_l2, mass_pct, worst_head_pct, argmax_pct) bounds the accuracy
interpolated from --accuracy (default scenarios/accuracy/smollm2-2k.csv) at the policy's selection and budget;
a budget outside the measured ones fails the trial (never extrapolated). docs/search.md has the details.

Resume: run the same command again; the study lives in --storage (default OUT/study.journal) and
--trials is the total the study should reach, so an interrupted search continues where it stopped.

Many machines, one study (PostgreSQL; `pip install -e '.[dev]'` brings the driver, psycopg, on each machine):
  createdb -h dbhost pulseinfer            # once
  # on every machine, same scenario, space, SLO and objective; a different --seed per machine:
  pulseinfer search default --space pulseinfer --trials 200 --jobs 8 --seed $MACHINE_ID --yes \\
      --storage postgresql+psycopg://user:pw@dbhost/pulseinfer --study qwen3-h200 --out results/search
Every worker asks the database for its next trial, so trials are never duplicated or lost; workers
stop once the study holds --trials finished trials (trials in flight on other machines may take it a
few past). Each machine writes its OUT from the whole study; rerunning the command once the study is
full runs nothing and rewrites OUT. A journal file on a shared file system (--storage
/nfs/study.journal) works the same way without a database.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "search",
        help="search a policy's knobs under an SLO (Optuna)",
        description="Search a policy's knobs over a scenario's workload with Optuna (TPE): one simulation "
        "per trial, the tail SLO as constraints, goodput or throughput as the objective, or a Pareto front of "
        "throughput vs TPOT p99.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", default=None, help="scenario YAML path or shipped name (default: default)")
    p.add_argument("--space", required=True, help="search space YAML, or a shipped space name (e.g. pulseinfer)")
    p.add_argument(
        "--slo",
        default=None,
        metavar="KEY=VALUE,...",
        help="p99 targets over requests, e.g. tpot_p99_ms=50,ttft_p99_s=10 (default: the scenario's slo block), "
        "and accuracy bounds read from --accuracy: kl_nats, rel_l2 (upper), mass_pct, worst_head_pct, argmax_pct "
        "(lower), e.g. tpot_p99_ms=50,kl_nats=0.01",
    )
    p.add_argument(
        "--objective",
        choices=["goodput", "throughput", "pareto", "pareto_kl"],
        default="goodput",
        help="goodput (req/s meeting the SLO), throughput (decode tok/s), pareto (tok/s up, TPOT p99 down) or "
        "pareto_kl (tok/s up, interpolated KL down)",
    )
    p.add_argument(
        "--accuracy",
        type=Path,
        default=None,
        help="accuracy.csv of `pulseinfer accuracy` (default with accuracy bounds or pareto_kl: the shipped SmolLM2 "
        "2K table); adds the interpolated accuracy to trials.csv",
    )
    p.add_argument("--trials", type=int, default=40, help="finished trials the study should hold (default 40)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes on this machine (default 1)")
    p.add_argument(
        "--storage",
        default=None,
        help="journal file path or RDB URL, e.g. postgresql://user:pw@host/db (default OUT/study.journal)",
    )
    p.add_argument("--study", default=None, help="study name (default <scenario>-<policy>-<objective>)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed; give each machine its own (default 0)")
    p.add_argument("--out", type=Path, required=True, help="results folder")
    add_overrides(p, "workload.max_requests=800")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_yes(p)
    return p


def run(args: argparse.Namespace) -> int:
    from study.search import check_run_args, run_search
    from study.search_results import collect_results

    check_seed(args.seed)
    with flag_names(FLAGS):
        check_run_args(args.trials, args.jobs)  # before the scenario loads and OUT is made
        cfg = _config(args)
        started = time.perf_counter()
        with Bar(args.trials, "trials", "trial", hidden=args.no_progress) as bar:
            pace = Pace("search", "trial", args.trials, args.jobs, args.yes)

            def on_progress(n: int) -> None:
                bar.reach(n)
                pace.update(n)  # a search measured too long stops here without --yes (the journal keeps its trials)

            study = run_search(cfg, args.trials, args.jobs, on_progress=on_progress)
    result = collect_results(study, cfg, args.out)
    if _draw_trials(result.trials, cfg.slo.tpot_p99_s, args.out / "trials.png"):
        result.files.append(args.out / "trials.png")
    _print_report(cfg, result, time.perf_counter() - started)
    if result.best is None:
        print("error: no trial completed; see the error column of trials.csv", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _config(args: argparse.Namespace):
    """Validate every input (scenario, SLO, space, storage) before any trial runs."""
    from sim.config.loader import DEFAULT_SCENARIO, load_scenario
    from study.accuracy import AccuracySlo, load_accuracy_table, split_slo
    from study.search import SearchConfig, check_journal_file
    from study.slo import parse_slo, slo_from_scenario
    from study.space import check_space, load_space

    scenario = args.scenario or DEFAULT_SCENARIO
    base = load_scenario(scenario, args.overrides)
    tail, bounds = split_slo(args.slo)
    with usage_errors():  # parse_slo's messages name --slo
        slo = parse_slo(tail) if tail is not None else slo_from_scenario(base)
    accuracy = None
    if bounds or args.accuracy is not None or args.objective == "pareto_kl":
        accuracy = AccuracySlo(load_accuracy_table(args.accuracy), bounds)
    space = load_space(args.space)
    check_space(space, scenario, [*args.overrides, *slo.scenario_overrides()])
    study_name = args.study or f"{base.name}-{space.policy}-{args.objective}"
    if args.storage and "://" not in args.storage:
        check_journal_file(args.storage)  # a file that is not a journal: refused untouched, before OUT is made
    big = _check_size(args, study_name)  # a big search is refused before OUT is made
    check_out_folder(args.out, "search")  # the study journal in OUT resumes: a re-run of search uses OUT again
    storage = args.storage or str(args.out / "study.journal")
    if args.storage:  # opened before OUT is made: a refused --storage leaves nothing behind
        _open_storage(storage)
    journal = [] if args.storage else ["study.journal", "study.journal.lock"]  # .lock: while a worker writes
    files = ["trials.csv", "pareto.csv", "best.yaml", "trials.png", *journal]
    mark_results(args.out, "search", files=files)  # creates OUT
    if not args.storage:
        _open_storage(storage)
    announce(big)  # every input checked: the size, before any trial runs
    return SearchConfig(
        scenario=str(scenario),
        space=space,
        slo=slo,
        storage=storage,
        study_name=study_name,
        objective=args.objective,
        overrides=tuple(args.overrides),
        seed=args.seed,
        accuracy=accuracy,
    )


def _draw_trials(trials, tpot_p99_bound_s: float | None, path: Path) -> bool:
    """Write ``trials.png`` (plots/search.py: goodput per trial, throughput against p99 TPOT) and return True; a note
    and False when the study has no trial to draw (an earlier trials.png is removed: it would show another study)."""
    import matplotlib

    from plots.search import search_trials
    from plots.style import MissingData

    matplotlib.use("Agg")
    try:
        search_trials(trials, tpot_p99_bound_s).savefig(path, dpi=100)
    except MissingData as exc:
        path.unlink(missing_ok=True)
        print(f"note: no trials.png: {exc}", file=sys.stderr)
        return False
    return True


def _open_storage(storage: str) -> None:
    """Open (a journal file: create) the study storage; UsageError naming --storage if it cannot be opened."""
    from study.search import SearchError, open_storage

    try:
        open_storage(storage)
    except SearchError:
        raise  # names --storage through FLAGS
    except Exception as exc:  # noqa: BLE001 -- drivers raise many types; all mean "cannot open"
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UsageError(f"--storage {storage}: cannot open ({exc.__class__.__name__}: {first})") from None


def _check_size(args: argparse.Namespace, study_name: str) -> str | None:
    """Refuse a search above the limit without --yes; the line announcing a big one (pulseinfer.bigrun). Trials a
    resumed study already finished do not count."""
    from study.search import trials_to_run

    storage = args.storage or str(args.out / "study.journal")
    try:
        n = trials_to_run(storage, study_name, args.trials)
    except Exception:  # noqa: BLE001 -- an unusable --storage gets its own error line just after
        n = args.trials
    size = f"{n:,} trial{'s' if n != 1 else ''} to run" + (f" (of --trials {args.trials})" if n != args.trials else "")
    return check_size("search", size, n, args.yes)


def _print_report(cfg, result, wall_s: float) -> None:
    from study.search import OBJECTIVES

    trials = result.trials
    states = trials["state"].value_counts().to_dict()
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
    accuracy = f" and accuracy {cfg.accuracy.describe()}" if cfg.accuracy and cfg.accuracy.bounds else ""
    print(
        f"\nstudy {cfg.study_name}: {len(trials)} trials ({counts}); {int(trials['feasible'].sum())} meet "
        f"the SLO {cfg.slo.describe()}{accuracy}; objective {cfg.objective}; {wall_s:.0f} s wall"
    )
    keys = [p.key for p in cfg.space.params]
    if result.best is not None:
        verdict = "best" if result.best_feasible else "no trial met the SLO; least violating"
        print(f"\n{verdict}: trial {int(result.best['trial'])}")
        print(_table(result.best.to_frame().T, keys))
    feasible = trials[trials["feasible"]]
    if len(feasible) > 1:
        col = OBJECTIVES[cfg.objective][0][0]
        top = feasible.sort_values([col, "trial"], ascending=[False, True]).head(5)
        print(f"\ntop {len(top)} of {len(feasible)} trials meeting the SLO, by {col}:")
        print(_table(top, keys))
    lower = "interpolated KL" if cfg.objective == "pareto_kl" else "TPOT p99"
    print(f"\nPareto front (decode tok/s vs {lower}, feasible trials): {len(result.pareto)} trials")
    if len(result.pareto):
        print(_table(result.pareto, keys))
    print(f"\nwrote {', '.join(str(f) for f in result.files)}")


def _table(rows, keys: list[str]) -> str:
    """Metrics in display units, then the parameters with short names."""
    shown = rows[["trial"]].astype(int).copy()
    shown["tok/s"] = rows["decode_tokens_per_s"].astype(float).round(0)
    shown["goodput/s"] = rows["goodput_requests_per_s"].astype(float).round(3)
    shown["TPOT p99 ms"] = (rows["tpot_p99_s"].astype(float) * 1e3).round(1)
    shown["TTFT p99 s"] = rows["ttft_p99_s"].astype(float).round(2)
    if "kl_nats" in rows.columns:
        shown["KL nats"] = rows["kl_nats"].astype(float).round(4)
        shown["mass %"] = rows["mass_pct"].astype(float).round(2)
    for key in keys:
        shown[key.rsplit(".", 1)[-1]] = rows[key].map(lambda v: f"{v:.3g}" if isinstance(v, float) else v)
    return shown.to_string(index=False)
