"""The commands on a real server's benchmark files: ``validate --measured FILE`` (replay and compare) and
``calibrate --from-measured FILE ...`` (fit the card and engine host costs, hold out, write a profile), with the
options both take (``--run``, ``--prefix-share``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pulseinfer.commands import check_out_folder
from pulseinfer.errors import UsageError, usage_errors
from pulseinfer.outdir import results_folder
from pulseinfer.progress import Bar


def add_measured_options(p: argparse.ArgumentParser) -> None:
    """``--run`` and ``--prefix-share``, shared by ``validate --measured`` and ``calibrate --from-measured``."""
    p.add_argument(
        "--run",
        dest="measured_run",
        default=None,
        metavar="N|all",
        help="with a measured file of several runs (SGLang/vLLM results appended per run, a guidellm sweep): which "
        "run, 0 the first and -1 the last, or `all` (a sweep validates as a curve); default the reader's (the last "
        "run appended, guidellm's first benchmark)",
    )
    p.add_argument(
        "--prefix-share",
        type=float,
        default=None,
        metavar="X",
        help="every prompt of the measured run starts with the same prefix: X of its tokens (0 < X < 1) or X tokens "
        "(X >= 1); the replay's prefix cache holds it after its first prefill. Default: what the file records "
        "(cached tokens, prompt texts), else no shared prefix",
    )


def measured_run_choice(value: str | None) -> int | str | None:
    """``--run``'s value: None, ``"all"`` or a run number. Raises UsageError naming the value."""
    if value is None or value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--run {value!r}: expected a run number (0 the first, -1 the last) or 'all'") from None


def check_prefix_share(value: float | None) -> float | None:
    """``--prefix-share``'s value, finite and > 0. Raises UsageError naming the value."""
    import math

    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(
            f"--prefix-share {value}: expected a share of each prompt (0 < X < 1) or a token count (X >= 1)"
        )
    return value


def one_policy(value: str | None) -> str:
    """``--policy``'s one policy name (default sglang). Raises UsageError for an empty value or several names."""
    if value is None:
        return "sglang"
    if not value.strip() or "," in value:
        raise UsageError(f"--policy {value!r}: a measured run is replayed on one policy; give one name (e.g. sglang)")
    return value.strip()


def _file_in(path: Path, flag: str) -> Path:
    """``path``, or for a folder the ``requests.jsonl`` in it (a run committed with its ``meta.json``).
    Raises UsageError for a folder without one."""
    if path.is_dir():
        if (path / "requests.jsonl").is_file():
            return path / "requests.jsonl"
        raise UsageError(f"{flag} {path}: is a folder without a requests.jsonl; give the benchmark's result file")
    return path


def run_validate(args: argparse.Namespace) -> int:
    """``validate --measured FILE``: replay a real server's benchmark run(s) in the simulator and compare."""
    from calibrate.measured import check_replay_overrides, measured_scenario
    from calibrate.measured_server import engine_overrides, recorded_overrides
    from traces.measured import read_measured_runs

    args.measured = _file_in(args.measured, "--measured")
    if not args.measured.is_file():
        raise UsageError(f"--measured {args.measured}: no such file")
    policy = one_policy(args.policy)
    which, prefix_share = measured_run_choice(args.measured_run), check_prefix_share(args.prefix_share)
    overrides = list(args.overrides)
    with usage_errors():
        check_replay_overrides(overrides)
    if args.profile is not None:  # the same as --set profile=PATH (a profile from calibrate --from-measured)
        if any(item.split("=", 1)[0].strip() == "profile" for item in overrides):
            raise UsageError("--profile and --set profile=: give the profile once")
        overrides.append(f"profile={args.profile}")
    check_out_folder(args.out, "validate")
    from traces.measured import detect_iteration_file

    with usage_errors():
        per_iteration = detect_iteration_file(args.measured)
    if per_iteration:
        return _run_step_check(args, overrides, policy, which, prefix_share)
    started = time.perf_counter()
    with usage_errors():  # a file that is not what it claims, a bad override, a model that does not fit: one line
        runs = read_measured_runs(args.measured, args.measured_format, which)
        overrides, engine_note = engine_overrides(runs[0], overrides)
        overrides, recorded = recorded_overrides(runs[0], overrides, policy)
        scenario = measured_scenario(args.scenario, overrides, policy)
    compared = []
    with Bar(len(runs), "replay", "run", hidden=len(runs) == 1) as bar:
        for run in runs:
            with usage_errors(f"{run.source_path}: " if len(runs) > 1 else ""):
                compared.append(_compare(run, scenario, args.seed, prefix_share))
            bar.advance()
    subject = _subject(args.measured, runs, scenario, overrides, policy)
    tables, figures, written = _write_measured(args.out, compared, subject)
    m, hw = scenario.model, scenario.hardware
    print(
        f"\n{args.measured.name} ({runs[0].tool}, {len(runs)} run(s), load {runs[0].load}) replayed on {m.name} / "
        f"{hw.name} x{scenario.serving.tp_size}, prefill {scenario.serving.prefill}, policy {policy}, engine "
        f"{scenario.engine.name} ({engine_note}): {time.perf_counter() - started:.1f} s"
    )
    for note in recorded:
        print(f"note: {note}")
    for run, _, notes, flag in compared:
        for note in dict.fromkeys([*notes, *([flag] if flag else [])]):
            print(f"{'warning' if note is flag else 'note'}: {run.source_path if len(runs) > 1 else ''}"
                  f"{': ' if len(runs) > 1 else ''}{note}")  # fmt: skip
    for note in written:
        print(f"note: {note}")
    print(tables.to_string(index=False, float_format=lambda v: f"{v:,.2f}"))
    files = ["validation.csv", "requests.csv", *figures]
    print(f"\nwrote {args.out}/{', '.join(files[:-1])} and {files[-1]}")
    return 0


def _subject(path: Path, runs, scenario, overrides: list[str], policy: str) -> str:
    """What a validation figure compares, in two lines: the measured file (its base name, and the run or runs of a
    file holding several) and the tool; the model, card, TP, engine line and release, prefill mode, policy and the
    profile the replay ran on."""
    name = Path(path).name
    indices = [run.source_path.rsplit("#", 1)[1] for run in runs if "#" in run.source_path]
    if len(indices) == 1:
        name += f" run {indices[0]}"
    elif indices:
        name += f" runs {indices[0]}–{indices[-1]}"
    engine, version = scenario.engine.name, scenario.engine.version
    if version and not engine.endswith(version):
        engine += f" (release {version})"
    profile = [item.split("=", 1)[1].strip() for item in overrides if item.split("=", 1)[0].strip() == "profile"]
    if profile and profile[-1]:
        parts = Path(profile[-1]).parts
        profile = [str(Path(*parts[-2:])) if len(parts) > 1 else profile[-1]]
    m, hw, serving = scenario.model, scenario.hardware, scenario.serving
    setup = f"model {m.name} · card {hw.name} ×{serving.tp_size} · engine {engine} · prefill {serving.prefill}"
    return (f"{name} ({runs[0].tool}) vs its replay\n{setup} · policy {policy}"
            + (f" · profile {profile[-1]}" if profile and profile[-1] else ""))  # fmt: skip


def _arrivals_reproduced(run) -> bool:
    """Whether the replay sent every measured request at its recorded time, so each simulated request is the
    measured one's twin (same id, same send time, same lengths): the file records a send time for every request
    replayed (``load`` "trace", calibrate/measured.py ``replay_workload``) in the tool's own rows (not rebuilt from
    histograms and shuffled, :data:`calibrate.measured.UNORDERED_TOOL`). A Poisson, closed-loop or all-at-once
    replay reproduces the load, not each request's moment."""
    from calibrate.measured import UNORDERED_TOOL

    req = run.requests[run.requests["success"] & (run.requests["output_tokens"] > 0)]
    return (run.load == "trace" and run.tool != UNORDERED_TOOL and len(req) > 0
            and bool(req["arrival_s"].notna().all()))  # fmt: skip


def _run_step_check(args: argparse.Namespace, overrides: list[str], policy: str, which, prefix_share) -> int:
    """``validate --measured`` on per-iteration ForwardPassMetrics: the simulated step time of every recorded batch
    composition against its wall time (calibrate/step_check.py)."""
    import pandas as pd

    from calibrate.measured import measured_scenario
    from calibrate.step_check import step_check, step_check_summary
    from plots.step_check import step_check_figure
    from traces.measured import read_forward_pass_metrics

    if which is not None or prefix_share is not None:
        flag = "--run" if which is not None else "--prefix-share"
        raise UsageError(f"{flag}: {args.measured} holds per-iteration records (one run, no requests to replay)")
    started = time.perf_counter()
    with usage_errors():
        iterations = read_forward_pass_metrics(args.measured)
        scenario = measured_scenario(args.scenario, overrides, policy)
        table = step_check(iterations, scenario, policy)
    summary = pd.DataFrame(step_check_summary(table)).T.rename_axis("kind").reset_index()
    summary["count"] = summary["count"].astype(int)
    with results_folder(args.out, command="validate") as stage:
        table.to_csv(stage / "step_check.csv", index=False)
        summary.to_csv(stage / "step_check_summary.csv", index=False)
        step_check_figure(table).savefig(stage / "step_check.png", dpi=120)
    m, hw = scenario.model, scenario.hardware
    print(
        f"\n{args.measured.name} ({len(table)} iterations) timed step by step on {m.name} / {hw.name} "
        f"x{scenario.serving.tp_size}, engine {scenario.engine.name}: {time.perf_counter() - started:.1f} s"
    )
    for note in iterations.notes:
        print(f"note: {note}")
    if not any(item.split("=", 1)[0].strip() == "engine" for item in overrides):
        print(f"note: the records name no engine: the scenario's, {scenario.engine.name} (--set engine= to change)")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
    print(f"\nwrote {args.out}/step_check.csv, step_check_summary.csv and step_check.png")
    return 0


def _compare(run, scenario, seed: int, prefix_share: float | None):
    """Replay one measured run: (run, validation table, notes, cache-hit flag or None)."""
    from calibrate.measured import measured_from_result, simulate_measured, validation_table
    from calibrate.measured_server import chunked_stream, pool_note, roofline_check

    result, workload, notes = simulate_measured(run, scenario, seed, prefix_share)
    simulated = measured_from_result(result, workload)
    flag = roofline_check(run, scenario) if workload.attrs.get("hash_block_tokens") is None else None
    extra = (chunked_stream(run, scenario.model.max_seq_len), pool_note(run, scenario, result.kv_pool_gib))
    notes = [*notes, *filter(None, extra)]
    return run, (validation_table(run, simulated), _per_request(run, simulated)), notes, flag


def _write_measured(out: Path, compared: list, subject: str = ""):
    """validation.csv, requests.csv, the CDFs, for a replay that reproduced every request's send time the per-request
    scatter, and, for several runs, the sweep figure; ``subject`` (:func:`_subject`) titles them. Returns (the
    printed table, the figures written, notes on a figure not drawn)."""
    import math

    import numpy as np
    import pandas as pd

    from plots.style import MissingData
    from plots.validation import measured_cdfs, measured_scatter, measured_sweep

    several = len(compared) > 1
    tables, per_request = [], []
    loads = [_load_value(run) for run, *_ in compared]
    label = _load_label([run for run, *_ in compared])
    for (run, (table, requests), _, _), load in zip(compared, loads, strict=True):
        tables.append(table.assign(run=run.source_path, load=load) if several else table)
        per_request.append(requests.assign(run=run.source_path) if several else requests)
    table, requests = pd.concat(tables, ignore_index=True), pd.concat(per_request, ignore_index=True)
    if several:
        table = table[["run", "load", "metric", "measured", "simulated", "error_pct"]]
    figures, notes = ["validation_cdfs.png"], []
    scatter = all(_arrivals_reproduced(run) for run, *_ in compared)
    if not scatter:
        notes.append("no validation_scatter.png (request by request): the replay does not send each request at a "
                     "recorded time, so the two are compared as distributions (validation_cdfs.png)")  # fmt: skip
    with results_folder(out, command="validate") as stage:
        table.to_csv(stage / "validation.csv", index=False)
        gaps = requests["itl_ms"]
        medians = [float(np.median(g)) if g is not None and len(g) else math.nan for g in gaps]
        requests.drop(columns="itl_ms").assign(itl_p50_ms=medians).to_csv(stage / "requests.csv", index=False)
        measured_cdfs(requests, subject).savefig(stage / "validation_cdfs.png", dpi=120)
        if scatter:
            try:
                measured_scatter(requests, subject).savefig(stage / "validation_scatter.png", dpi=120)
                figures.append("validation_scatter.png")
            except MissingData as e:
                notes.append(f"no validation_scatter.png: {e}")
        if several:
            swept = table
            if any(math.isnan(x) for x in loads):  # runs sent all at once: the curve is over the runs, in file order
                order = {run.source_path: i for i, (run, *_) in enumerate(compared)}
                swept, label = table.assign(load=table["run"].map(order)), "run (file order)"
            measured_sweep(swept, label, subject).savefig(stage / "validation_sweep.png", dpi=120)
            figures.append("validation_sweep.png")
    if several:  # one line per run and metric is long: the headline metrics
        keep = ["output_throughput_tok_s", "ttft_mean_ms", "tpot_mean_ms", "itl_p50_ms"]
        return table[table["metric"].isin(keep)], figures, notes
    return table, figures, notes


def _load_value(run) -> float:
    """The swept value of a run: its request rate where finite, else its concurrency, else NaN (sent all at once)."""
    import math

    if math.isfinite(run.request_rate):
        return float(run.request_rate)
    return float(run.max_concurrency) if run.max_concurrency is not None else math.nan


def _load_label(runs) -> str:
    """The sweep's x axis: request rate, concurrency, or both where the runs mix them."""
    import math

    rates = {math.isfinite(run.request_rate) for run in runs}
    if rates == {True}:
        return "request rate [req/s]"
    return "max concurrency [requests]" if rates == {False} else "request rate [req/s] or max concurrency"


def _per_request(measured, simulated):
    """One row per request and source (measured, simulated): TTFT, TPOT and E2E in ms, and ``itl_ms``, the request's
    token gaps in ms (an array, None where absent; the measured side's are left out where its stream sent several
    tokens a chunk, as in the validation table) — the figures' input."""
    import numpy as np
    import pandas as pd

    from calibrate.measured_server import chunked_stream

    replayed = simulated.requests["source_id"].to_numpy() if "source_id" in simulated.requests.columns else None
    chunked = chunked_stream(measured, ids=replayed) is not None  # per chunk, not per token: not the replay's ITL
    frames = []
    for source, run in (("measured", measured), ("simulated", simulated)):
        req = run.requests[run.requests["success"]]
        ids = req["source_id"] if "source_id" in req.columns else req["request_id"]  # the measured request's id
        gaps = [None if g is None or (chunked and source == "measured") else np.asarray(g, dtype=float) * 1e3
                for g in req["itl_s"]]  # fmt: skip
        frames.append(pd.DataFrame({"source": source, "request_id": ids.to_numpy(),
                                    "ttft_ms": req["ttft_s"].to_numpy() * 1e3,
                                    "tpot_ms": req["tpot_s"].to_numpy() * 1e3,
                                    "e2e_ms": req["e2e_s"].to_numpy() * 1e3,
                                    "itl_ms": pd.Series(gaps, dtype=object)}))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


MEASURED_SUFFIXES = (".json", ".jsonl", ".csv")  # benchmark outputs (traces/measured/), never a scenario


def run_calibrate(args: argparse.Namespace) -> int:
    """``calibrate --from-measured FILE ... [SCENARIO]``: fit, hold out, write the profile (or refuse)."""
    import pandas as pd
    import yaml

    from calibrate.measured import check_replay_overrides, measured_scenario
    from calibrate.measured_fit import MAX_HELD_OUT_ERROR_PCT, fit_measured, fitted_bounds, split_runs, verdict
    from calibrate.measured_server import files_engine, recorded_overrides
    from sim.config.loader import resolve_scenario_path
    from traces.measured import detect_iteration_file, read_measured_runs

    if args.fit_trials is not None:
        raise UsageError(f"--trials {args.fit_trials}: the measured fit is least squares, not a search; give "
                         "--iterations N (the most steps, default 8)")  # fmt: skip
    items = list(args.from_measured)
    scenario = None
    last = items[-1] if items else ""
    named = Path(last).is_file() or Path(last).is_dir() or last.endswith(MEASURED_SUFFIXES)
    if last.endswith((".yaml", ".yml")) or not named:
        scenario = items.pop()  # the last item names the scenario (a missing .json/.jsonl/.csv is a measured file)
        with usage_errors("SCENARIO: "):
            resolve_scenario_path(scenario)
    if not items:
        raise UsageError("--from-measured: give at least one benchmark output file")
    items = [str(_file_in(Path(item), "--from-measured")) for item in items]
    for item in items:
        if not Path(item).is_file():
            raise UsageError(f"--from-measured {item}: no such file")
        with usage_errors():
            per_iteration = detect_iteration_file(item)
        if per_iteration:
            raise UsageError(f"--from-measured {item}: holds per-iteration ForwardPassMetrics, not requests to "
                             "replay; check them with `validate --measured`")  # fmt: skip
    args.policy = one_policy(args.policy)
    with usage_errors():
        check_replay_overrides(args.overrides)
    if len(set(map(str, map(Path.resolve, map(Path, items))))) < len(items):
        raise UsageError("--from-measured: a file is given twice; it cannot be both fitted and held out")
    if args.measured_iterations < 1:
        raise UsageError(f"--iterations {args.measured_iterations}: must be >= 1")
    which, prefix_share = measured_run_choice(args.measured_run), check_prefix_share(args.prefix_share)
    out = args.out
    check_out_folder(out, "calibrate")
    started = time.perf_counter()
    with usage_errors():
        runs = [run for item in items for run in read_measured_runs(item, "auto", which)]
        overrides, engine_note = files_engine(runs, args.overrides)
        overrides, recorded = recorded_overrides(runs, overrides, args.policy)
        scn = measured_scenario(scenario, overrides, args.policy)
        split_runs(runs)  # enough requests to fit on some and hold out the rest: said before the fit
    for note in recorded:
        print(f"note: {note}")
    print(f"engine: {scn.engine.name} ({engine_note})")
    most = 2 + (args.measured_iterations + 1) * (len(fitted_bounds(scn)) + 1)  # replays at most (calibrate/lsq.py)
    with Bar(most, "fit", "replay") as bar:

        def on_step(i: int, loss: float) -> None:
            bar.note(f"loss {loss:.4f}")
            bar.advance()

        with usage_errors():
            fit = fit_measured(runs, scn, args.measured_iterations, args.seed, on_step, prefix_share)
    refused = fit.held_out_error_pct > MAX_HELD_OUT_ERROR_PCT and not args.force
    line = verdict(fit)
    with results_folder(out, command="calibrate") as stage:
        frames = [t.reset_index().assign(run=name) for name, t in fit.tables.items()]
        pd.concat(frames, ignore_index=True).to_csv(stage / "fit_validation.csv", index=False)
        fit.moved.to_csv(stage / "moved.csv", index=False)
        if not refused:
            (stage / "profile.yaml").write_text(yaml.safe_dump(_profile(args, items, scn, fit, line), sort_keys=False))
    for note in fit.notes:  # what the replays noted; the roofline flag is a warning
        print(f"{'warning' if 'cache hits: ' in note else 'note'}: {note}")
    print(f"\nfitted to {len(runs)} run(s) of {len(items)} file(s), {fit.evaluations} replays, "
          f"{time.perf_counter() - started:.0f} s; what moved from the card (moved.csv):")  # fmt: skip
    print(fit.moved.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"verdict: {line}")
    for name in fit.at_bound:
        print(f"warning: {name} landed at a bound of its physical range ({fit.params[name]:g}); the profile says so")
    print(f"error (mean |%| over TPOT, TTFT, ITL p50, E2E, throughput), held out: {fit.held_out[0]}")
    print(f"  the card:    fit {fit.card_fit_error_pct:.1f} %, held out {fit.card_held_out_error_pct:.1f} %")
    print(f"  the profile: fit {fit.fit_error_pct:.1f} %, held out {fit.held_out_error_pct:.1f} %")
    if refused:
        print(f"error: held-out error {fit.held_out_error_pct:.1f} % > {MAX_HELD_OUT_ERROR_PCT:g} %: profile.yaml not "
              f"written (see {out}/fit_validation.csv; --force writes it anyway)", file=sys.stderr)  # fmt: skip
        return 2
    print(f"\nwrote {out}/profile.yaml, moved.csv and fit_validation.csv; use it with --set profile={out}/profile.yaml")
    return 0


def _profile(args: argparse.Namespace, items: list[str], scn, fit, line: str) -> dict:
    """The profile a measured fit writes: the card with the fitted hardware values, and, where engine host costs
    were fitted, the engine card with them (sim/config/profiles.py applies both)."""
    hardware_values = {k: v for k, v in fit.params.items() if not k.startswith("engine.")}
    engine_values = {k.split(".", 1)[1]: v for k, v in fit.params.items() if k.startswith("engine.")}
    source = f"{scn.hardware.name} with values fitted by calibrate --from-measured on {', '.join(items)}"
    hardware = {**scn.hardware.model_dump(mode="json"), **hardware_values, "measured": True, "source": source}
    profile = {
        "name": f"{scn.hardware.name}-from-measured",
        "source": "pulseinfer calibrate --from-measured " + " ".join(items),
        "metadata": {
            "files": ", ".join(items), "card": scn.hardware.name, "model": scn.model.name,
            "tp_size": scn.serving.tp_size, "prefill": scn.serving.prefill, "policy": args.policy,
            "engine": scn.engine.name, "engine_version": scn.engine.version,
            "fitted": ", ".join(fit.fitted), "at_bound": ", ".join(fit.at_bound),
            "without_effect": ", ".join(fit.without_effect), "verdict": line,
            "fit_error_pct": round(fit.fit_error_pct, 2), "held_out_error_pct": round(fit.held_out_error_pct, 2),
            "card_held_out_error_pct": round(fit.card_held_out_error_pct, 2),
            "held_out": "; ".join(fit.held_out), "iterations": args.measured_iterations, "seed": args.seed,
            "date": time.strftime("%Y-%m-%d"),
        },
        "hardware": hardware,
    }  # fmt: skip
    # the line the host costs were fitted on, always (the card's catch-alls too are that line's): laid over it, and a
    # scenario of another line is refused (sim/config/profiles.py)
    profile["engine"] = {"name": scn.engine.name, **engine_values}
    return profile
