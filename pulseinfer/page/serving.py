"""Report pages of the serving studies: ``simulate`` (one replica or a fleet), ``plan``, ``sweep`` and ``search``.

Each ``*_page(folder)`` returns the :class:`~pulseinfer.page.html.Page` content of its kind: the verdict (the
answer to the question the command answers), the key table and the notes; figures and provenance are added by
pulseinfer/page/__init__.py.
"""

from __future__ import annotations

import re

import pandas as pd

from pulseinfer.marker import read_provenance
from pulseinfer.page.folder import Folder, fmt, number, slo_of
from pulseinfer.page.html import Page, Table
from study.slo import TailSlo


def tail_slo(slo: dict) -> TailSlo:
    """A scenario's ``slo`` mapping (``tpot_ms``, ``ttft_s``; blank or absent: unbounded) as the p99 bounds plan and
    search check (study/slo.py ``TailSlo``, seconds)."""
    tpot_ms, ttft_s = number(slo.get("tpot_ms")), number(slo.get("ttft_s"))
    return TailSlo(tpot_ms * 1e-3 if tpot_ms == tpot_ms else None, ttft_s if ttft_s == ttft_s else None)


def slo_text(slo: dict) -> str:
    """``TPOT p99 ≤ 50 ms, TTFT p99 ≤ 10 s`` from a scenario's slo mapping; "no SLO" without bounds."""
    bounds = tail_slo(slo).bounds()
    parts = [f"TPOT p99 ≤ {fmt(bounds['tpot_p99_s'] * 1e3)} ms"] if "tpot_p99_s" in bounds else []
    parts += [f"TTFT p99 ≤ {fmt(bounds['ttft_p99_s'])} s"] if "ttft_p99_s" in bounds else []
    return ", ".join(parts) or "no SLO"


def meets(row: pd.Series, slo: dict) -> bool | None:
    """Whether a summary row's p99 TPOT and TTFT meet the scenario's SLO (None: no SLO; a missing value misses)."""
    bounds = tail_slo(slo).bounds()
    return all(number(row.get(col)) <= bound for col, bound in bounds.items()) if bounds else None


def simulate_page(folder: Folder) -> Page:
    """``pulseinfer simulate``: which policy serves this trace best. Verdict: the policy with the most goodput
    (requests per second that met the SLO), its throughput against the SGLang-like baseline, who meets the SLO."""
    from pulseinfer.report import BILL, MEMORY_IO, REPLICAS, SERVICE, display_frame, summary_notes

    scenario = folder.yaml("scenario.yaml")
    slo = slo_of(scenario)
    summary = folder.table("summary.csv")
    replicas = folder.table("replicas.csv")
    fleet = replicas is not None
    name = scenario.get("name", folder.path.name)
    if fleet:
        first = summary.iloc[0] if summary is not None and len(summary) else {}
        shape = f"{fmt(first.get('num_replicas'))} replicas behind {first.get('router', '?')}"
    else:
        shape = "one replica"
    subtitle = f"scenario {name}: {_model_line(scenario)}, {shape}"
    page = Page(f"pulseinfer simulate — {folder.path.name}", subtitle, "")
    if summary is None or not len(summary):
        page.verdict, page.warn = "summary.csv is missing or empty: nothing to compare", True
        return page
    page.verdict, page.warn = _simulate_verdict(summary, slo, shape)
    page.tables.append(Table("Service", display_frame(summary, SERVICE), f"SLO: {slo_text(slo)}", ("policy",)))
    page.tables.append(Table("Memory and I/O", display_frame(summary, MEMORY_IO), "", ("policy",)))
    page.tables.append(Table("The bill", display_frame(summary, BILL), "", ("policy", "router")))
    if fleet:
        page.tables.append(Table("Replicas", display_frame(replicas, REPLICAS), "", ("policy",)))
    page.notes += summary_notes(summary) + _rejections(folder, scenario)
    return page


def _rejections(folder: Folder, scenario: dict) -> list[str]:
    """``POLICY rejected N requests: why`` per policy and reason (requests that can never run here: the console's
    ``rejected:`` lines, sim.metrics.rejected_by_reason), from the requests table."""
    from pulseinfer.report import REJECTION_REASONS
    from sim.metrics import rejected_by_reason

    requests = folder.table("requests.csv")
    if requests is None or not {"policy", "unfinished_reason"} <= set(requests.columns):
        return []
    model = scenario.get("model") if isinstance(scenario.get("model"), dict) else {}
    lines = []
    for policy, rows in requests.groupby("policy", sort=False):
        for reason, count in rejected_by_reason(rows).items():
            why = REJECTION_REASONS.get(reason, reason)
            why = why.split(" of {kv_pool_gib", 1)[0].format(max_seq_len=model.get("max_seq_len", "?"))
            lines.append(f"{policy} rejected {count} request(s): {why}")
    return lines


TIE_REL = 1e-6  # goodputs this close (relative) are a tie: the verdict names every policy that has it


def _simulate_verdict(summary: pd.DataFrame, slo: dict, shape: str) -> tuple[str, bool]:
    goodput = summary["goodput_requests_per_s"].map(number).fillna(-1.0)
    top = float(goodput.max())
    if top <= 0:
        return f"No policy has goodput on {shape}: no request met the SLO ({slo_text(slo)}).", True
    tied = summary.loc[goodput >= top * (1 - TIE_REL), "policy"].tolist()
    best = summary.loc[goodput.idxmax()]
    who = f"{best['policy']} serves" if len(tied) == 1 else f"{' and '.join(tied)} tie, serving"
    line = (
        f"{who} the most goodput on {shape}: {fmt(best['goodput_requests_per_s'])} req/s within "
        f"the SLO, {fmt(best['decode_tokens_per_s'])} decode tok/s, TPOT p99 {fmt(number(best['tpot_p99_s']) * 1e3)} ms"
    )
    if "sglang" in set(summary["policy"]) and "sglang" not in tied:
        base = summary.loc[summary["policy"] == "sglang"].iloc[0]
        ratio = number(best["decode_tokens_per_s"]) / number(base["decode_tokens_per_s"])
        line += f" ({ratio:.2f}x sglang's decode tok/s)"
    verdicts = {p: meets(r, slo) for p, r in zip(summary["policy"], (r for _, r in summary.iterrows()))}
    met = [p for p, ok in verdicts.items() if ok]
    missed = [p for p, ok in verdicts.items() if ok is False]
    if met or missed:
        line += f". {slo_text(slo)}: met by {', '.join(met) or 'none'}"
        line += f"; missed by {', '.join(missed)}" if missed else ""
    return line + ".", not met and bool(missed)


def _model_line(scenario: dict) -> str:
    model = scenario.get("model", {}) if isinstance(scenario.get("model"), dict) else {}
    hardware = scenario.get("hardware", {}) if isinstance(scenario.get("hardware"), dict) else {}
    engine = scenario.get("engine")
    engine = engine.get("name") if isinstance(engine, dict) else engine
    line = f"{model.get('name', '?')} on {hardware.get('name', '?')}"
    return line + (f", engine {engine}" if engine else "")


def plan_page(folder: Folder) -> Page:
    """``pulseinfer plan``: how many GPUs. Verdict: with a target rate, the fewest GPUs (or the cheapest fleet when
    priced) meeting the SLO; without, the highest rate one replica sustains."""
    from pulseinfer.commands.plan import plan_display

    table = folder.table("plan.csv")
    page = Page(f"pulseinfer plan — {folder.path.name}", "capacity under a tail SLO, per card × policy", "")
    if table is None or not len(table):
        page.verdict, page.warn = "plan.csv is missing or empty: no plan to show", True
        return page
    page.tables.append(Table("Plan", plan_display(table), "", ("hardware", "policy", "router")))
    page.notes += [
        f"{r.hardware}/{r.policy}: {r.note}" for r in table.itertuples() if isinstance(r.note, str) and r.note
    ]
    ok = table[table["meets_slo"].astype(str).str.lower() == "true"]
    target = number(table["target_rate_per_s"].iloc[0])
    slo = f" under {table['slo'].iloc[0]}" if "slo" in table and isinstance(table["slo"].iloc[0], str) else ""
    page.subtitle += f"; SLO {table['slo'].iloc[0]}" if slo else ""
    if target == target:
        if ok.empty:
            page.verdict, page.warn = (
                f"No card and policy meets the SLO{slo} at {fmt(target)} req/s within the replica cap.",
                True,
            )
            return page
        priced = ok[ok["usd_per_hour"].map(number).notna()]
        if len(priced):
            from study.plan import cheapest_fleets

            best = cheapest_fleets(table).iloc[0]  # the console's "cheapest fleet" table, same order and tie-break
            tied = _ties(priced, best, ["usd_per_hour", "usd_per_million_output_tokens"])
            cost = (
                f", {fmt(best['gpus_billed'])} GPUs billed, ${fmt(best['usd_per_hour'])}/h, "
                f"${fmt(best['usd_per_million_output_tokens'])} per M output tokens"
            )
            how = "cheapest"
        else:
            gpus = "gpus_billed" if ok["gpus_billed"].map(number).notna().all() else "gpus_for_target"
            best = ok.loc[ok[gpus].map(number).idxmin()]
            tied = _ties(ok, best, [gpus])
            what = "GPUs billed" if gpus == "gpus_billed" else "decode GPUs"
            cost, how = f", {fmt(best[gpus])} {what}", "fewest GPUs"
        page.verdict = (
            f"For {fmt(target)} req/s{slo}, {how}: {best['policy']} on {best['hardware']}, "
            f"{fmt(best['replicas_for_target'])} "
            f"replica(s) of TP{fmt(best['tp_size'])} behind {best['router']}{cost} "
            f"(one replica sustains {fmt(best['max_rate_per_s'])} req/s){_tie_text(tied, best)}."
        )
    else:
        if ok.empty:
            page.verdict, page.warn = f"No card and policy meets the SLO{slo} even at the lowest rate tried.", True
            return page
        best = ok.loc[ok["max_rate_per_s"].map(number).idxmax()]
        tied = _ties(ok, best, ["max_rate_per_s"])
        page.verdict = (
            f"Highest rate one replica sustains{slo or ' under the SLO'}: {best['policy']} on {best['hardware']}, "
            f"{fmt(best['max_rate_per_s'])} req/s ({fmt(best['decode_tokens_per_s'])} decode tok/s)"
            f"{_tie_text(tied, best)}."
        )
    return page


def _ties(rows: pd.DataFrame, best: pd.Series, columns: list[str]) -> list[str]:
    """``policy on hardware`` of the other rows (cards × policies, routers folded) equal to ``best`` on ``columns``."""
    same = pd.Series(True, index=rows.index)
    for col in columns:
        values, ref = rows[col].map(number), number(best[col])
        same &= (values - ref).abs() <= 1e-9 * max(1.0, abs(ref))
    names = dict.fromkeys(f"{r['policy']} on {r['hardware']}" for _, r in rows[same].iterrows())
    return [n for n in names if n != f"{best['policy']} on {best['hardware']}"]


def _tie_text(tied: list[str], best: pd.Series) -> str:
    return f"; tied with {', '.join(tied)}" if tied else ""


def sweep_page(folder: Folder) -> Page:
    """``pulseinfer sweep``: which grid point is best. Verdict: the row (seeds averaged) with the most goodput that
    met the SLO, and, with ``--compare``, the range of the A/B ratio over the grid."""
    table = folder.table("sweep.csv")
    page = Page(f"pulseinfer sweep — {folder.path.name}", "a grid of simulations", "")
    if table is None or not len(table):
        page.verdict, page.warn = "sweep.csv is missing or empty: no grid to show", True
        return page
    keys = [c for c in table.columns if "." in c]  # the grid's dotted scenario keys
    group = [*keys, "policy"]
    metrics = [c for c in ("goodput_requests_per_s", "decode_tokens_per_s", "tpot_p99_s", "ttft_p99_s") if c in table]
    mean = table.groupby(group, sort=False, dropna=False)[metrics].mean().reset_index()
    if "slo_met" in table:  # the fraction of seeds that met the SLO (True/False read back from the CSV)
        met = table["slo_met"].astype(str).str.lower().eq("true")
        mean["slo_met"] = met.groupby([table[c] for c in group], sort=False, dropna=False).mean().to_numpy()
    shown = mean[group].astype(str)
    for col, header, scale in (
        ("goodput_requests_per_s", "goodput req/s", 1), ("decode_tokens_per_s", "decode tok/s", 1),
        ("tpot_p99_s", "TPOT p99 ms", 1e3), ("ttft_p99_s", "TTFT p99 s", 1), ("slo_met", "SLO met (of seeds)", 1),
    ):  # fmt: skip
        if col in mean:
            shown[header] = [fmt(number(v) * scale) for v in mean[col]]
    page.tables.append(Table("Grid (mean over seeds)", shown, f"{len(table)} rows in sweep.csv", tuple(group)))
    metric = "goodput_requests_per_s" if "goodput_requests_per_s" in mean else None
    page.verdict, page.warn = _sweep_verdict(mean, keys, metric)
    compare = folder.table("compare.csv")
    if compare is not None and "ratio" in compare and len(compare):
        ratio = compare["ratio"].map(number)
        compared = next((c[2:] for c in compare.columns if c.startswith("a_") and not c.endswith("_frac")), "metric")
        page.verdict += (
            f" {_compared_pair(folder)} {compared} over the grid: {fmt(ratio.min())} to {fmt(ratio.max())}"
            f" ({'lower' if compared.startswith(LOWER_IS_BETTER) else 'higher'} is better for A)."
        )
    return page


LOWER_IS_BETTER = ("tpot", "ttft", "itl", "e2e", "kl", "decode_queue", "stall", "peak_hbm", "duration")


def _compared_pair(folder: Folder) -> str:
    """``A/B`` of the ``--compare`` the folder's run was given (its recorded command line, read by ``sweep``'s own
    parser, pulseinfer/commands/sweep.py), else ``A/B``."""
    import argparse
    import contextlib
    import io
    import shlex

    from pulseinfer.commands import sweep

    parser = argparse.ArgumentParser(prog="pulseinfer")
    sweep.add_parser(parser.add_subparsers())
    try:
        words = shlex.split(read_provenance(folder.path).get("command_line") or "")
        with contextlib.redirect_stderr(io.StringIO()):  # a line argparse refuses: no usage text on the console
            args, _ = parser.parse_known_args(words[1:])
    except (ValueError, SystemExit):
        return "A/B"
    return getattr(args, "compare", None) or "A/B"


LOAD_SUFFIXES = ("rate_per_s", "max_concurrency", "time_scale")  # grid keys that set the offered load


def _sweep_verdict(mean: pd.DataFrame, keys: list[str], metric: str | None) -> tuple[str, bool]:
    """The sweep's answer: at the highest offered load of the grid (a key in :data:`LOAD_SUFFIXES`; goodput grows
    with load, so ranking across loads only finds the highest), the policy and settings with the most goodput among
    the points that met the SLO on at least half of their seeds (as the Pareto figure counts them); each setting
    named only for the policy it applies to (``policy.P.*``)."""
    if metric is None:
        return "sweep.csv has no goodput column: no grid point to rank.", True
    loads = [k for k in keys if k.endswith(LOAD_SUFFIXES)]
    where = ""
    if loads:  # time_scale stretches the arrival gaps: its smallest value is the highest load
        top = mean[loads[0]].min() if loads[0].endswith("time_scale") else mean[loads[0]].max()
        mean, where = mean[mean[loads[0]] == top], f" at the highest load ({loads[0]}={top})"
    pool = mean[mean["slo_met"] >= 0.5] if "slo_met" in mean else mean  # as the Pareto figure: half the seeds
    values = pool[metric].map(number)
    if pool.empty or values.isna().all():
        return f"No grid point met the SLO{where}.", True

    def settings(row: pd.Series) -> str:  # the grid values that apply to the row's policy
        def applies(key: str) -> bool:
            parts = key.split(".")
            return key not in loads and not (parts[0] == "policy" and len(parts) > 2 and parts[1] != row["policy"])

        return ", ".join(f"{k.split('.')[-1]}={row[k]}" for k in keys if applies(k))

    best = pool.loc[values.idxmax()]
    tied = {(r["policy"], settings(r)) for _, r in pool[values >= values.max() * (1 - TIE_REL)].iterrows()}
    named = settings(best)
    line = f"Most goodput{where}: {best['policy']}{' with ' + named if named else ''}, {fmt(best[metric])} req/s"
    if len(tied) > 1:
        line += f"; {len(tied) - 1} other setting(s) tie: " + "; ".join(
            f"{policy}{' with ' + named if named else ''}" for policy, named in sorted(tied - {(best["policy"], named)})
        )
    return line + ".", False


def search_page(folder: Folder) -> Page:
    """``pulseinfer search``: which knob settings. Verdict: best.yaml's first comment line (the best trial, its
    objective and whether it meets the SLO), and the count of trials."""
    trials = folder.table("trials.csv")
    page = Page(f"pulseinfer search — {folder.path.name}", "Optuna search over a policy's knobs under an SLO", "")
    best_text = folder.text("best.yaml") or ""
    header = [line.lstrip("# ").strip() for line in best_text.splitlines() if line.startswith("#")]
    n = 0 if trials is None else len(trials)
    feasible = 0 if trials is None or "feasible" not in trials else int(trials["feasible"].astype(str).eq("True").sum())
    if header:
        page.verdict = f"{header[0]} ({feasible} of {n} trials feasible)."
        found = re.search(r"best trial (\d+)", header[0])
        row = trials[trials["trial"] == int(found.group(1))] if found is not None and trials is not None else None
        if row is not None and len(row):
            r = row.iloc[0]
            page.verdict = (
                f"Best of {n} trials ({feasible} feasible): trial {int(r['trial'])}, goodput "
                f"{fmt(r.get('goodput_requests_per_s'))} req/s, {fmt(r.get('decode_tokens_per_s'))} decode tok/s, TPOT "
                f"p99 {fmt(number(r.get('tpot_p99_s')) * 1e3)} ms{_objective(header[0])}. Its settings: best.yaml."
            )
        page.notes += header[1:2]
        page.warn = feasible == 0
    else:
        page.verdict, page.warn = f"No best trial recorded ({feasible} of {n} trials feasible).", True
    for name, title in (("pareto.csv", "Pareto front of the feasible trials"), ("trials.csv", "Trials")):
        t = folder.table(name)
        if t is not None and len(t):
            page.tables.append(_trials_table(t, title))
    if best_text:
        page.texts.append(("best.yaml", best_text))
    return page


def _objective(header: str) -> str:
    """``; objective goodput, SLO tpot_p99_ms=60: meets the SLO`` from best.yaml's first line ("" if not there)."""
    found = re.search(r"\((objective [^)]*)\): (.*?)\.?$", header)
    return f"; {found.group(1)}: {found.group(2)}" if found else ""


def _trials_table(trials: pd.DataFrame, title: str, rows: int = 25) -> Table:
    knobs = [c for c in trials.columns if c.startswith("policy.")]
    shown = pd.DataFrame({"trial": trials["trial"].astype(str)}) if "trial" in trials else pd.DataFrame()
    for col, header, scale in (
        ("goodput_requests_per_s", "goodput req/s", 1), ("decode_tokens_per_s", "tok/s", 1),
        ("tpot_p99_s", "TPOT p99 ms", 1e3), ("ttft_p99_s", "TTFT p99 s", 1),
    ):  # fmt: skip
        if col in trials:
            shown[header] = [fmt(number(v) * scale) for v in trials[col]]
    for knob in knobs:
        shown[knob.split(".")[-1]] = [fmt(v) if number(v) == number(v) else str(v) for v in trials[knob]]
    if "feasible" in trials:
        shown["feasible"] = trials["feasible"].astype(str)
    order = (
        trials["goodput_requests_per_s"].map(number).fillna(-1).sort_values(ascending=False).index
        if "goodput_requests_per_s" in trials
        else trials.index
    )
    note = f"best {rows} of {len(trials)} by goodput" if len(trials) > rows else ""
    return Table(title, shown.loc[order[:rows]], note, ("trial",))
