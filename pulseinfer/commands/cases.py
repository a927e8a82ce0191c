"""``pulseinfer cases``: the shipped published cases, simulated and compared with their published values."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pulseinfer.commands import check_out_folder
from pulseinfer.errors import UsageError
from pulseinfer.in_place import mark_results
from pulseinfer.progress import Bar

EPILOG = """\
Each case in scenarios/cases/<name>.yaml names a published measurement, its source, the tolerance stated
before the simulator was run, and how the simulator computes the same metric (one small simulation per
point, or a closed-form link figure). Verdict: within / outside the tolerance, or not_modelled with the
reason when this build lacks what the case needs. Sources: docs/sources.md §9.
OUT/cases.csv: case, source, metric, published, simulated, error_pct, tolerance_pct, verdict, note.

The serving suite (scenarios/cases/serving/<name>.yaml, docs/sources.md §11-13) is ~160 public real-GPU serving
benchmarks (vLLM, SGLang, TensorRT-LLM, LMDeploy; TPOT or ITL with its statistic, TTFT, throughput), each rebuilt as
a scenario on its declared engine release. The shipped compute model is fitted on all of them, so its plain
figures are in-sample; --cv source|card|model|engine refits without each group of cases
(calibrate/serving_cv.py) and scores each left-out group with values fitted without it: the held-out figures
(OUT/cv.csv, OUT/cv_report.csv, OUT/cv_params.csv: every fold's fitted values, those at a bound flagged).
OUT/serving.csv: case, set, engine (the release line it ran on), metric, stat, measured, simulated, error_pct,
by_construction, verdict, note; OUT/serving_report.csv: per set and metric group the MAPE, the mean signed error and
the worst case; OUT/plots/serving_scatter.png: simulated vs measured, log-log.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "cases",
        help="compare the simulator with published measurements (shipped cases)",
        description="Run the shipped suite of published cases and print simulated vs published values.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("results/cases"), help="results folder (default results/cases)")
    p.add_argument("--only", default=None, metavar="NAME,...", help="run only these cases (file names without .yaml)")
    p.add_argument(
        "--suite", choices=("all", "published", "serving"), default="all", help="which cases to run (default all)"
    )
    p.add_argument(
        "--cv",
        choices=("source", "card", "model", "engine"),
        default=None,
        help="serving suite: cross-validate, leaving out each publisher, GPU, model family or engine in turn",
    )
    p.add_argument("--folds", type=int, default=None, help="--cv: at most this many folds (default: one per group)")
    p.add_argument("--iterations", type=int, default=4, help="--cv: least-squares iterations per fold (default 4)")
    p.add_argument("--jobs", type=int, default=2, help="--cv: worker processes simulating cases (default 2)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    from calibrate.cases import case_names, cases_table, load_case, run_case, select_cases
    from calibrate.serving_cases import serving_case_names

    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only is not None else None
    if only is not None and not only:
        raise UsageError(f"--only {args.only!r}: no case named; give case names, comma-separated (or leave --only out)")
    if args.cv is not None:
        return _run_cv(args, only)
    published = args.suite in ("all", "published")
    serving = args.suite in ("all", "serving")
    if only is not None:  # names pick their suite
        known = set(case_names()) | set(serving_case_names())
        unknown = [n for n in only if n not in known]
        if unknown:
            raise UsageError(f"--only: unknown case {unknown[0]!r}; see scenarios/cases/ and scenarios/cases/serving/")
    pub_only = [n for n in only if n in case_names()] if only is not None else None
    srv_only = [n for n in only if n in serving_case_names()] if only is not None else None
    published = published and (only is None or bool(pub_only))
    serving = serving and (only is None or bool(srv_only))
    specs = [load_case(path) for path in select_cases(pub_only)] if published else []
    check_out_folder(args.out, "cases")
    files = (["cases.csv"] if published else []) + (["serving.csv", "serving_report.csv"] if serving else [])
    mark_results(args.out, "cases", files=files, trees=["plots"] if serving else [])
    started = time.perf_counter()
    if published:
        rows = []
        with Bar(len(specs), "cases", "case", hidden=args.no_progress) as bar:
            for spec in specs:
                bar.note(spec.name)
                rows.append(run_case(spec, on_sim=lambda point, name=spec.name: bar.note(f"{name}: {point}")))
                bar.advance()
        table = cases_table(rows)
        table.to_csv(args.out / "cases.csv", index=False)
        print(f"\npublished cases ({time.perf_counter() - started:.0f} s wall)")
        print(format_cases(table))
        print(f"\nwrote {args.out / 'cases.csv'}")
    if serving:
        _run_serving(args, srv_only)
    return 0


def _run_serving(args: argparse.Namespace, only: list[str] | None) -> None:
    from calibrate.serving_cases import load_suite, run_serving_case, suite_report, suite_table

    started = time.perf_counter()
    cases = load_suite(only)
    rows: list[dict] = []
    with Bar(len(cases), "serving", "case", hidden=args.no_progress) as bar:
        for case in cases:
            bar.note(case.name)
            rows += run_serving_case(case)
            bar.advance()
    table = suite_table(rows)
    report = suite_report(table, {c.name for c in cases if c.offloaded})
    table.to_csv(args.out / "serving.csv", index=False)
    report.to_csv(args.out / "serving_report.csv", index=False)
    print(f"\nserving suite ({time.perf_counter() - started:.0f} s wall): simulated vs measured on real GPUs")
    shown = table.drop(columns=["note", "by_construction"]).copy()
    for col in ("measured", "simulated"):
        shown[col] = shown[col].map(lambda v: "-" if v != v else f"{v:.4g}")
    shown["error_pct"] = shown["error_pct"].map(lambda v: "-" if v != v else f"{v:+.1f}")
    print(shown.to_string(index=False))
    print(
        "\nper set and metric group, IN-SAMPLE: the shipped compute model was fitted on every modelled case (not "
        "modelled, by-construction and cache-hit rows left out; saturation: all at once or a closed loop; *_tail: "
        "medians and p99s; held-out figures: --cv source):"
    )
    print(report.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    try:
        from plots.validation import serving_scatter

        (args.out / "plots").mkdir(exist_ok=True)
        fig = serving_scatter(table)
        fig.savefig(args.out / "plots" / "serving_scatter.png", dpi=110)
        print(f"\nwrote {args.out / 'serving.csv'}, serving_report.csv and plots/serving_scatter.png")
    except ValueError as exc:  # MissingData: nothing compared
        print(f"\nwrote {args.out / 'serving.csv'} and serving_report.csv (no figure: {exc})")


def _run_cv(args: argparse.Namespace, only: list[str] | None) -> int:
    """``cases --suite serving --cv BY``: held-out errors by leaving each group out in turn."""
    from calibrate.serving_cases import load_suite, serving_case_names
    from calibrate.serving_cv import cross_validate, cv_report, make_folds

    if args.suite != "serving":
        raise UsageError(f"--cv {args.cv}: needs --suite serving, got --suite {args.suite}")
    for flag, value in (("--folds", args.folds), ("--iterations", args.iterations), ("--jobs", args.jobs)):
        if value is not None and value < (2 if flag == "--folds" else 1):
            raise UsageError(f"{flag} {value}: must be >= {2 if flag == '--folds' else 1}")
    unknown = [n for n in only or [] if n not in serving_case_names()]
    if unknown:
        raise UsageError(f"--only: unknown serving case {unknown[0]!r}; see scenarios/cases/serving/")
    cases = [c for c in load_suite(only) if not c.not_modelled]
    folds = make_folds(cases, args.cv, args.folds)
    if len(folds) < 2:
        raise UsageError(f"--cv {args.cv}: the cases form one group; cross-validation needs two or more")
    check_out_folder(args.out, "cases")
    mark_results(args.out, "cases", files=["cv.csv", "cv_report.csv", "cv_params.csv"], trees=[])
    started = time.perf_counter()
    with Bar(len(folds), f"cv by {args.cv}", "fold", hidden=args.no_progress) as bar:

        def on_fold(i: int, groups: list[str], fit) -> None:
            bar.note(f"fold {i}: {','.join(groups)[:40]} (fit loss {fit.loss:.3f})")
            bar.advance()

        rows, params = cross_validate(args.cv, args.folds, args.iterations, args.jobs, on_fold, only)
    report = cv_report(rows, {c.name for c in cases if c.offloaded})
    rows.to_csv(args.out / "cv.csv", index=False)
    report.to_csv(args.out / "cv_report.csv", index=False)
    params.to_csv(args.out / "cv_params.csv", index=False)
    wall = time.perf_counter() - started
    print(f"\nleave-one-{args.cv}-out over {len(folds)} folds ({wall:.0f} s wall): every figure is HELD OUT")
    print(report.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    flagged = params[params["at_bound"]].groupby("parameter")["fold"].apply(list)
    for name, in_folds in flagged.items():
        print(f"  at a bound: {name} in folds {in_folds}")
    print(f"\nwrote {args.out / 'cv.csv'}, cv_report.csv and cv_params.csv")
    return 0


def format_cases(table) -> str:
    """cases.csv for the terminal: numbers rounded, the note last."""
    shown = table.copy()
    shown["simulated"] = shown["simulated"].map(lambda v: "-" if v != v else f"{v:.3g}")
    shown["error_pct"] = shown["error_pct"].map(lambda v: "-" if v != v else f"{v:+.1f}")
    shown["tolerance_pct"] = shown["tolerance_pct"].map(lambda v: f"{v:g}")
    return shown.drop(columns=["note"]).to_string(index=False) + _notes(table)


def _notes(table) -> str:
    notes = [f"  {row.case}: {row.note}" for row in table.itertuples() if row.note]
    return "\n\nnotes:\n" + "\n".join(notes) if notes else ""
