"""Report pages of the checks against reality: ``validate`` (the engine, or a real server's runs), ``calibrate``
(the engine's microbenchmarks, a real server's runs, the serving suite), ``cases``, ``accuracy`` and
``engine-bench``.

Each ``*_page(folder)`` returns the :class:`~pulseinfer.page.html.Page` content of its kind: the verdict (how far
the simulator is from what was measured, or what the fit moved), the key table and the notes.
"""

from __future__ import annotations

import pandas as pd

from pulseinfer.page.folder import Folder, fmt, number
from pulseinfer.page.html import Page, Table

TARGET_PCT = 10.0  # the error the project aims at (docs/results.md); a verdict above it is shown as a warning


def error_table(table: pd.DataFrame, keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """``metric, measured, simulated, error_pct`` rows (plus ``keys``) as display text (signed % errors)."""
    shown = table[[*keys, "metric"]].astype(str).copy()
    for col in ("measured", "simulated"):
        shown[col] = [fmt(v, 4) for v in table[col]]
    shown["error %"] = [("n/a" if number(v) != number(v) else f"{number(v):+.1f}") for v in table["error_pct"]]
    return shown


def mean_abs(table: pd.DataFrame) -> float:
    """Mean |error_pct| over the rows that have one (NaN when none has)."""
    return float(table["error_pct"].map(number).abs().mean())


def validate_page(folder: Folder) -> Page:
    """``pulseinfer validate``: is the simulator right? Three folders: a real server's runs replayed
    (``validate --measured``: requests.csv beside validation.csv), per-iteration step times (step_check.csv), or
    the torch engine against the simulator (validation_steps.csv)."""
    page = Page(f"pulseinfer validate — {folder.path.name}", "", "")
    if folder.has("step_check.csv"):
        page.subtitle = "each recorded batch's step time, measured against the simulator's step functions"
        summary = folder.table("step_check_summary.csv")
        if summary is not None and len(summary) and {"kind", "count", "mape_pct"} <= set(summary.columns):
            shown = summary.astype(str)
            for col in summary.columns[2:]:
                shown[col] = [fmt(v) for v in summary[col]]
            page.tables.append(
                Table("Per kind of step", shown, "error % = simulated / measured step time − 1", ("kind",))
            )
            rows = {str(k): r for k, r in zip(summary["kind"], summary.itertuples())}
            whole = rows.get("all", next(iter(rows.values())))
            parts = [f"{k.replace('_', '-')} {fmt(r.mape_pct)} %" for k, r in rows.items() if k != "all"]
            page.verdict = (
                f"Recorded step times are {fmt(whole.mape_pct)} % off (MAPE over {fmt(whole.count)} batches)"
                + (f": {', '.join(parts)}" if parts else "")
                + "."
            )
            page.warn = number(whole.mape_pct) > TARGET_PCT
        else:
            page.verdict, page.warn = "step_check_summary.csv is missing: no step check to show", True
        return page
    table = folder.table("validation.csv")
    if table is None or not len(table) or not {"metric", "measured", "simulated", "error_pct"} <= set(table.columns):
        page.verdict, page.warn = "validation.csv is missing or has no metric rows: nothing was compared", True
        return page
    engine = "policy" in table.columns
    page.subtitle = (
        "the torch engine and the simulator on the same requests"
        if engine
        else "a real server's benchmark run replayed in the simulator, request by request"
    )
    keys = tuple(c for c in ("policy", "run", "load") if c in table.columns)
    page.tables.append(
        Table("Simulated against measured", error_table(table, keys), "error % = simulated / measured − 1", keys)
    )
    err = mean_abs(table)
    compared = int(table["error_pct"].map(number).notna().sum())  # metrics that have an error (not n/a)
    tpot = table[table["metric"].astype(str).str.startswith("tpot")]
    head = f"TPOT {fmt(mean_abs(tpot))} % off" if len(tpot) else ""
    page.verdict = (
        f"The simulator is {fmt(err)} % off on average (mean |error| over {compared} metrics)"
        + (f"; {head}" if head else "")
        + (
            f" — above the {fmt(TARGET_PCT)} % target: calibrate a profile (pulseinfer calibrate)"
            if err > TARGET_PCT
            else ""
        )
        + "."
    )
    page.warn = err > TARGET_PCT
    return page


def calibrate_page(folder: Folder) -> Page:
    """``pulseinfer calibrate``: what the fit moved and how well it predicts what it was not fitted on. Three
    folders: a real server's runs (moved.csv, fit_validation.csv), the serving suite (serving_report.csv), the torch
    engine's microbenchmarks (profile.yaml with its metadata)."""
    page = Page(f"pulseinfer calibrate — {folder.path.name}", "", "")
    profile = folder.yaml("profile.yaml")
    if folder.has("moved.csv"):
        page.subtitle = "the compute model fitted to a real server's runs, scored on held-out requests"
        moved = folder.table("moved.csv")
        fit = folder.table("fit_validation.csv")
        meta = profile.get("metadata") if isinstance(profile.get("metadata"), dict) else {}
        said = meta.get("verdict") if isinstance(meta.get("verdict"), str) else ""
        verdict = ""
        held_pct, card_pct = number(meta.get("held_out_error_pct")), number(meta.get("card_held_out_error_pct"))
        if held_pct == held_pct:  # as the console says it: mean |error| over the fit's metrics (FIT_METRICS)
            verdict = f"Held-out error {fmt(held_pct)} % with the profile" + (
                f", {fmt(card_pct)} % with the card" if card_pct == card_pct else ""
            )
        if fit is not None and {"run", "metric", "error_pct"} <= set(fit.columns):
            if not verdict:
                from calibrate.measured_fit import FIT_METRICS

                held = fit[fit["run"].astype(str).str.startswith("held") & fit["metric"].isin(FIT_METRICS)]
                held_pct = mean_abs(held) if len(held) else float("nan")
                verdict = f"Held-out error {fmt(held_pct)} % (mean |error| over {', '.join(FIT_METRICS)})"
            fit = fit.assign(run=[_short_run(r) for r in fit["run"]])
            page.tables.append(Table("Fit and held-out errors", error_table(fit, ("run",)), "", ("run", "metric")))
        if said:
            verdict = f"{verdict}: {said}" if verdict else said
        if moved is not None and len(moved):
            shown = moved.astype(str)
            if "change_pct" in moved:
                shown["change_pct"] = [
                    f"{number(v):+.1f}" if number(v) == number(v) else "n/a" for v in moved["change_pct"]
                ]
            page.tables.insert(
                0, Table("What the fit moved", shown, "change_pct: fitted / card − 1, in %", ("name", "status"))
            )
        page.verdict = (
            (verdict + ".") if verdict else "No verdict recorded (profile.yaml and fit_validation.csv are missing)."
        )
        page.warn = "keep the card" in page.verdict or not profile or number(held_pct) > TARGET_PCT
        if not profile:
            page.notes.append("no profile.yaml: the fit was not written (its held-out error was above the bound)")
    elif folder.has("serving_report.csv"):
        page.subtitle = "the compute model's physical constants fitted to the real-GPU serving suite"
        page = _suite_page(folder, page, "serving_report.csv")
    elif profile:
        page.subtitle = "microbenchmarks of the torch engine fitted into a profile"
        meta = folder.yaml("metadata.yaml")
        compute = profile.get("compute", {}) if isinstance(profile.get("compute"), dict) else {}
        hardware = profile.get("hardware", {}) if isinstance(profile.get("hardware"), dict) else {}
        page.verdict = (
            f"Profile of {meta.get('device_name', 'this device')}: {fmt(compute.get('layer_per_token_ns'))} ns per "
            f"layer and token, host-to-device copies {fmt(hardware.get('h2d_bandwidth_gbps'))} GB/s; use it with "
            f"--set profile={folder.path}/profile.yaml."
        )
        for name in ("copy.csv", "recall.csv", "compute.csv"):
            t = folder.table(name)
            if t is not None and len(t):
                page.tables.append(
                    Table(name, t.head(20).astype(str), f"first 20 of {len(t)} rows" if len(t) > 20 else "")
                )
    else:
        page.verdict, page.warn = "No profile, fit or suite report in this folder.", True
    for name in ("profile.yaml", "metadata.yaml"):
        text = folder.text(name)
        if text:
            page.texts.append((name, text))
    return page


def _short_run(run: object) -> str:
    """``fit:/long/path/run.jsonl`` → ``fit: run.jsonl`` (the side, then the file's name)."""
    side, sep, path = str(run).partition(":")
    return f"{side}: {path.replace(chr(92), '/').rsplit('/', 1)[-1]}" if sep else str(run)


def _suite_page(folder: Folder, page: Page, name: str) -> Page:
    report = folder.table(name)
    if report is None or not len(report) or "mape_pct" not in report:
        page.verdict, page.warn = f"{name} is missing or empty", True
        return page
    per_token = report[report["group"].astype(str) == "per_token"]
    row = per_token.iloc[-1] if len(per_token) else report.iloc[0]
    where = f" ({row['set']})" if "set" in report.columns else ""
    page.verdict = (
        f"Per-token time {fmt(row['mape_pct'])} % MAPE{where} over {fmt(row['compared'])} compared rows, mean signed "
        f"{fmt(row['mean_signed_pct'])} %; worst {row['worst_case']} at {fmt(row['worst_pct'])} %."
    )
    page.warn = number(row["mape_pct"]) > TARGET_PCT
    keys = tuple(c for c in ("set", "group", "worst_case") if c in report.columns)
    shown = report.astype(str).copy()
    for col in ("mape_pct", "mean_signed_pct", "worst_pct"):
        if col in report:
            shown[col] = [fmt(v) for v in report[col]]
    page.tables.append(Table(name, shown, "MAPE = mean |simulated / measured − 1|", keys))
    return page


def cases_page(folder: Folder) -> Page:
    """``pulseinfer cases``: the simulator against published measurements. Verdict: the held-out (``--cv``) or
    in-sample per-token MAPE of the serving suite, and how many published I/O figures fall within tolerance."""
    page = Page(f"pulseinfer cases — {folder.path.name}", "the simulator against published real-GPU measurements", "")
    lines = []
    for name, label in (("cv_report.csv", "held out (--cv)"), ("serving_report.csv", "in-sample")):
        if folder.has(name):
            sub = _suite_page(folder, Page("", "", ""), name)
            lines.append(f"Serving suite, {label}: {sub.verdict}")
            page.tables += sub.tables
            page.warn = page.warn or sub.warn
            break
    cases = folder.table("cases.csv")
    if cases is not None and len(cases) and "verdict" in cases:
        within = int((cases["verdict"].astype(str) == "within").sum())
        lines.append(f"Published I/O figures: {within} of {len(cases)} within their tolerance.")
        page.warn = page.warn or within < len(cases)
        shown = cases.drop(columns=[c for c in ("note",) if c in cases]).astype(str)
        for col in ("simulated", "error_pct", "tolerance_pct"):
            if col in cases:
                shown[col] = [fmt(v) for v in cases[col]]
        page.tables.insert(0, Table("Published figures", shown, "", ("case", "source", "metric", "verdict")))
        page.notes += [
            f"{r.case}: {r.note}" for r in cases.itertuples() if isinstance(getattr(r, "note", None), str) and r.note
        ]
    page.verdict = " ".join(lines) or "No cases table in this folder."
    page.warn = page.warn or not lines
    return page


def table_page(folder: Folder, command: str, name: str, subtitle: str) -> Page:
    """A command whose result is one table (``accuracy``, ``engine-bench``): the table, and a verdict that says how
    many rows it holds and where the figures in docs/results.md come from."""
    page = Page(f"pulseinfer {command} — {folder.path.name}", subtitle, "")
    table = folder.table(name)
    if table is None or not len(table):
        page.verdict, page.warn = f"{name} is missing or empty", True
        return page
    page.verdict = f"{len(table)} measured rows in {name}; the key columns are below."
    page.tables.append(
        Table(name, table.head(40).astype(str), f"first 40 of {len(table)} rows" if len(table) > 40 else "")
    )
    return page


def accuracy_page(folder: Folder) -> Page:
    """``pulseinfer accuracy``: how much sparse attention loses. Verdict: at the smallest and the largest budget,
    the selection whose next-token argmax agrees with dense attention most, with its agreement and KL."""
    page = table_page(folder, "accuracy", "accuracy.csv", "sparse vs dense attention on a real model, per budget")
    table = folder.table("accuracy.csv")
    needed = {"selection", "budget_tokens", "argmax_agreement", "kl_nats"}
    if table is None or not len(table) or not needed <= set(table.columns):
        return page
    lines = []
    for budget in sorted({table["budget_tokens"].min(), table["budget_tokens"].max()}):
        rows = table[table["budget_tokens"] == budget]
        best = rows.loc[rows["argmax_agreement"].map(number).idxmax()]
        lines.append(
            f"at {fmt(budget)} budget tokens {best['selection']} agrees best, "
            f"{number(best['argmax_agreement']) * 100:.1f} % next-token argmax agreement, "
            f"KL {fmt(best['kl_nats'])} nats"
        )
    page.verdict = "Sparse against dense attention: " + "; ".join(lines) + "."
    return page


def engine_bench_page(folder: Folder) -> Page:
    """``pulseinfer engine-bench``: does gather-scatter beat a copy per fragment? Verdict: the speed-up of
    gather_scatter over per_fragment at the smallest and the largest fragment, and against a plain copy."""
    page = table_page(folder, "engine-bench", "engine_bench.csv", "KV recall on the real engine, per fragment size")
    table = folder.table("engine_bench.csv")
    if table is None or not {"mode", "fragment_bytes", "gbps"} <= set(table.columns):
        return page
    wide = table[table["mode"] != "plain_copy"].pivot_table(index="fragment_bytes", columns="mode", values="gbps")
    plain = table.loc[table["mode"] == "plain_copy", "gbps"]
    if not {"per_fragment", "gather_scatter"} <= set(wide.columns) or wide.empty:
        return page
    ends = list(dict.fromkeys([wide.index.min(), wide.index.max()]))
    ratios = [f"{fmt(wide.loc[b, 'gather_scatter'] / wide.loc[b, 'per_fragment'])}x" for b in ends]
    sizes = [f"{fmt(b / 1024)} KiB" for b in ends]
    page.verdict = f"gather_scatter moves {ratios[0]} the GB/s of one copy per fragment at {sizes[0]} fragments" + (
        f" and {ratios[1]} at {sizes[1]}" if len(ends) > 1 else ""
    )
    if len(plain):
        page.verdict += f"; a plain copy reaches {fmt(plain.iloc[0])} GB/s"
    page.verdict += "."
    return page
