"""The report page of each kind of results folder (issue 49): self-contained (no script, nothing from the network,
figures inline), a verdict that answers the command's question, the key table, captions, provenance; `pulseinfer
report` and `--report`; the page is the folder's (listed in its marker, replaced by a re-run)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from pulseinfer.cli import main
from pulseinfer.marker import MARKER, write_marker, written_claims
from pulseinfer.page import build_page
from tests.page.conftest import COMMANDS

IMG = re.compile(r'<img src="([^"]*)"')
VERDICT = re.compile(r'<p class="verdict[^"]*" id="verdict">([^<]+)</p>')


def _html(folder: Path) -> str:
    return (folder / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_each_kind_gets_a_self_contained_page(kind, report_folders):
    folder = report_folders[kind]
    html = _html(folder)
    assert VERDICT.search(html) and VERDICT.search(html).group(1).strip()
    assert "<script" not in html.lower()
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html)  # nothing loaded from the network
    images = IMG.findall(html)
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    figure_files = [p for p in [*folder.glob("*.png"), *folder.glob("plots/*.png")]]
    assert len(images) >= len(figure_files)  # every figure file of the folder is on the page
    assert html.count("<figcaption>") == len(images)
    marker = json.loads((folder / MARKER).read_text())
    assert "report.html" in marker["files"]
    argv = COMMANDS[kind]
    assert f"pulseinfer {argv[0]}" in marker["provenance"]["command_line"]
    assert marker["provenance"]["version"] and marker["provenance"]["written_at"].endswith("Z")
    assert '<section id="provenance">' in html and "not recorded</dd>" not in html.split("commit")[0]


def test_simulate_verdict_names_the_policy_with_the_most_goodput(report_folders):
    folder = report_folders["simulate"]
    summary = pd.read_csv(folder / "summary.csv")
    best = summary.loc[summary["goodput_requests_per_s"].idxmax()]
    verdict = VERDICT.search(_html(folder)).group(1)
    assert verdict.startswith(f"{best['policy']} serves the most goodput on one replica")
    assert f"{best['goodput_requests_per_s']:.3g} req/s" in verdict
    html = _html(folder)
    assert "<h3>Service</h3>" in html and "tpot_cdf" in html  # the key table, and figures drawn from the tables


def test_fleet_page_shows_replicas(report_folders):
    html = _html(report_folders["fleet"])
    assert "2 replicas behind round_robin" in VERDICT.search(html).group(1)
    assert "<h3>Replicas</h3>" in html


def test_validate_verdict_is_the_mean_error(report_folders):
    folder = report_folders["validate"]
    table = pd.read_csv(folder / "validation.csv")
    verdict = VERDICT.search(_html(folder)).group(1)
    assert verdict.startswith("The simulator is ")
    expected = table["error_pct"].abs().mean()
    assert f"{expected:.3g} % off on average" in verdict or f"{expected:,.0f} % off on average" in verdict


def test_report_command_and_rerun(report_folders, tmp_path, capsys):
    """`pulseinfer report` rewrites the page in place; a re-run of the command without --report removes the old
    page (it is listed in the marker as pulseinfer's), and keeps a file of the user's."""
    src = report_folders["cases"]
    out = tmp_path / "cases"
    assert main([*COMMANDS["cases"], "--out", str(out)]) == 0
    assert not (out / "report.html").exists()
    assert main(["report", str(out)]) == 0
    assert (out / "report.html").is_file() and f"wrote {out / 'report.html'}" in capsys.readouterr().out
    (out / "mine.txt").write_text("notes")
    assert main([*COMMANDS["cases"], "--out", str(out)]) == 0
    assert (out / "mine.txt").is_file()
    assert (src / "report.html").is_file()


def test_rerun_of_a_staged_command_replaces_its_page(report_folders, tmp_path):
    out = tmp_path / "sim"
    argv = [*COMMANDS["simulate"], "--summary-only", "--out", str(out)]
    assert main([*argv, "--report"]) == 0 and (out / "report.html").is_file()
    assert main(argv) == 0
    assert not (out / "report.html").exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p / "none", "no such folder"),
        (lambda p: (p / "plain").mkdir() or p / "plain", "not a results folder"),
    ],
)
def test_report_refuses_what_is_not_a_results_folder(setup, message, tmp_path, capsys):
    assert main(["report", str(setup(tmp_path))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_report_of_a_figure_folder_points_at_its_results_folder(report_folders, tmp_path, capsys):
    figures = tmp_path / "figs"
    assert main(["plot", str(report_folders["simulate"]), "--out", str(figures)]) == 0
    assert main(["report", str(figures)]) == 2
    assert "report the results folder it belongs to" in capsys.readouterr().err


def _hand_made(folder: Path, command: str, tables: dict[str, pd.DataFrame]) -> Path:
    folder.mkdir()
    for name, table in tables.items():
        table.to_csv(folder / name, index=False)
    write_marker(folder, command, written_claims(folder), provenance={})
    return folder


def test_engine_validation_and_suite_fit_verdicts(tmp_path):
    rows = pd.DataFrame(
        {"policy": ["pulseinfer"] * 2, "metric": ["tpot_mean_ms", "throughput_tok_s"], "simulated": [11.0, 90.0],
         "measured": [10.0, 100.0], "error_pct": [10.0, -10.0]}
    )  # fmt: skip
    page = build_page(_hand_made(tmp_path / "v", "validate", {"validation.csv": rows}))
    assert page.verdict.startswith("The simulator is 10 % off on average (mean |error| over 2 metrics); TPOT 10 % off")
    assert page.provenance.get("command_line") is None  # a folder that recorded none says so
    report = pd.DataFrame(
        {"set": ["fit", "check"], "group": ["per_token", "per_token"], "compared": [10, 5], "left_out": [0, 0],
         "mape_pct": [12.0, 20.5], "mean_signed_pct": [-1.0, 3.0], "worst_case": ["a (tpot)", "b (tpot)"],
         "worst_pct": [40.0, -55.0]}
    )  # fmt: skip
    page = build_page(_hand_made(tmp_path / "c", "calibrate serving", {"serving_report.csv": report}))
    assert page.verdict.startswith("Per-token time 20.5 % MAPE (check) over 5 compared rows") and page.warn


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    (dst / "report.html").unlink(missing_ok=True)
    marker = json.loads((dst / MARKER).read_text())
    marker["files"] = [f for f in marker["files"] if f != "report.html"]  # as the command left it, before --report
    (dst / MARKER).write_text(json.dumps(marker))
    return dst


@pytest.mark.parametrize(
    ("table", "text"),
    [
        ("summary.csv", "foo,bar\n1,2\n"),  # other columns
        ("summary.csv", None),  # cut off mid-row
        ("plan.csv", "hardware,policy\nh200,sglang\n"),
    ],
)
def test_a_damaged_table_is_one_line_not_a_traceback(table, text, report_folders, tmp_path, capsys):
    kind = "plan" if table == "plan.csv" else "simulate"
    folder = _copy(report_folders[kind], tmp_path / kind)
    path = folder / table
    whole = path.read_text()
    path.write_text(text if text is not None else whole[: len(whole.splitlines()[0]) + 40])  # cut inside a row
    status = main(["report", str(folder)])
    err = capsys.readouterr().err.strip()
    if text is None and status == 0:  # a row cut short reads as blanks: a page that says n/a is fine too
        assert not err
        return
    assert status == 2
    assert err.startswith(f"error: {folder}: its tables are not what") and len(err.splitlines()) == 1
    assert not (folder / "report.html").exists() and not list(folder.glob(".report.html*"))


def test_a_report_html_of_yours_is_never_replaced(report_folders, tmp_path, capsys):
    folder = _copy(report_folders["cases"], tmp_path / "c")
    (folder / "report.html").write_text("my notes")
    assert main(["report", str(folder)]) == 2
    assert "not written by pulseinfer" in capsys.readouterr().err
    assert (folder / "report.html").read_text() == "my notes"
    (folder / "report.html").unlink()
    (folder / "report.html").mkdir()
    assert main(["report", str(folder)]) == 2
    assert "is not a file" in capsys.readouterr().err and not list(folder.glob(".report.html*"))


def test_only_whole_figures_pulseinfer_wrote_are_embedded(report_folders, tmp_path):
    folder = _copy(report_folders["sweep"], tmp_path / "s")
    secret = tmp_path / "secret.txt"
    secret.write_text("a password")
    (folder / "leak.png").symlink_to(secret)
    (folder / "mine.png").write_bytes((folder / "pareto.png").read_bytes())  # a file of yours: not in the marker
    json_marker = json.loads((folder / MARKER).read_text())
    json_marker["files"].append("broken.png")  # listed, but not a whole PNG
    (folder / MARKER).write_text(json.dumps(json_marker))
    (folder / "broken.png").write_bytes((folder / "pareto.png").read_bytes()[:2000])
    page = build_page(folder)
    names = {f.name for f in page.figures}
    assert "pareto" in names and not names & {"leak", "mine", "broken"}
    assert any(n.startswith("broken.png: not a whole PNG") for n in page.notes)


def test_a_rerun_in_place_removes_the_old_page_and_a_legacy_marker_is_upgraded(report_folders, tmp_path):
    out = tmp_path / "cases"
    assert main([*COMMANDS["cases"], "--out", str(out), "--report"]) == 0 and (out / "report.html").is_file()
    assert main([*COMMANDS["cases"], "--out", str(out)]) == 0  # cases writes in place
    assert not (out / "report.html").exists()
    legacy = _copy(report_folders["simulate"], tmp_path / "legacy")
    (legacy / MARKER).write_text("written by pulseinfer simulate; do not edit\n")
    assert main(["report", str(legacy)]) == 0
    assert main(["report", str(legacy)]) == 0  # its own page, listed now: replaced, not refused
    assert "report.html" in json.loads((legacy / MARKER).read_text())["files"]


def test_ties_and_no_goodput_are_said(report_folders, tmp_path):
    folder = _copy(report_folders["simulate"], tmp_path / "t")
    summary = pd.read_csv(folder / "summary.csv")
    summary["goodput_requests_per_s"] = 2.5
    summary.to_csv(folder / "summary.csv", index=False)
    assert " tie, serving the most goodput" in build_page(folder).verdict
    summary["goodput_requests_per_s"] = 0.0
    summary.to_csv(folder / "summary.csv", index=False)
    page = build_page(folder)
    assert page.verdict.startswith("No policy has goodput") and page.warn


def test_a_folder_name_that_is_not_utf8_is_shown_not_a_traceback(report_folders, tmp_path):
    import os

    name = os.fsdecode(b"r\xe9sults")
    folder = _copy(report_folders["cases"], tmp_path / name)
    assert main(["report", str(folder)]) == 0
    assert "r?sults" in (folder / "report.html").read_text(encoding="utf-8")


def test_accuracy_and_engine_bench_verdicts(tmp_path):
    accuracy = pd.DataFrame(
        {"selection": ["solohead", "headwise", "solohead", "headwise"], "budget_tokens": [256, 256, 1024, 1024],
         "mass_mean": 0.9, "mass_worst_head": 0.8, "rel_l2": 0.1, "argmax_agreement": [0.91, 0.95, 0.99, 0.98],
         "kl_nats": [0.2, 0.1, 0.01, 0.02]}
    )  # fmt: skip
    page = build_page(_hand_made(tmp_path / "a", "accuracy", {"accuracy.csv": accuracy}))
    assert page.verdict == (
        "Sparse against dense attention: at 256 budget tokens headwise agrees best, 95.0 % next-token argmax "
        "agreement, KL 0.1 nats; at 1,024 budget tokens solohead agrees best, 99.0 % next-token argmax agreement, "
        "KL 0.01 nats."
    )
    bench = pd.DataFrame(
        {"mode": ["per_fragment", "gather_scatter", "per_fragment", "gather_scatter", "plain_copy"],
         "fragment_bytes": [8192, 8192, 65536, 65536, 1 << 26], "num_fragments": [10, 10, 2, 2, 1],
         "gbps": [2.0, 10.0, 8.0, 12.0, 20.0]}
    )  # fmt: skip
    page = build_page(_hand_made(tmp_path / "b", "engine-bench", {"engine_bench.csv": bench}))
    assert page.verdict == (
        "gather_scatter moves 5x the GB/s of one copy per fragment at 8 KiB fragments and 1.5x at 64 KiB; a plain "
        "copy reaches 20 GB/s."
    )


def test_an_in_place_run_that_does_not_succeed_leaves_the_page_and_provenance(report_folders, tmp_path):
    """sweep, search and cases write in place: their marker is written before the work, yet a run refused or
    stopped after that leaves the previous run's provenance and page; only success settles them."""
    from pulseinfer.in_place import mark_results, settle_in_place
    from pulseinfer.provenance import invocation

    folder = _copy(report_folders["cases"], tmp_path / "c")
    assert main(["report", str(folder)]) == 0
    before = json.loads((folder / MARKER).read_text())["provenance"]
    with invocation(["cases", "--only", "other", "--out", str(folder)]) as written:
        mark_results(folder, "cases", files=["cases.csv"])  # ... and the run then fails: nothing settles it
    assert written == [folder] and (folder / "report.html").is_file()
    assert json.loads((folder / MARKER).read_text())["provenance"] == before
    with invocation(["cases", "--only", "other", "--out", str(folder)]):
        settle_in_place(folder)  # it succeeded
    marker = json.loads((folder / MARKER).read_text())
    assert "--only other" in marker["provenance"]["command_line"] and not (folder / "report.html").exists()


def test_report_flag_refuses_a_page_of_yours_before_the_run(tmp_path, capsys, monkeypatch):
    out = tmp_path / "c"
    assert main([*COMMANDS["cases"], "--out", str(out)]) == 0
    (out / "report.html").write_text("mine")
    monkeypatch.setattr("calibrate.cases.run_case", lambda *a, **k: pytest.fail("ran before the refusal"))
    assert main([*COMMANDS["cases"], "--out", str(out), "--report"]) == 2
    assert "not written by pulseinfer" in capsys.readouterr().err and (out / "report.html").read_text() == "mine"
    assert main(["report", ""]) == 2 and "an empty path" in capsys.readouterr().err


def test_an_out_name_that_is_not_utf8_is_one_line(tmp_path, capsys):
    import os

    out = tmp_path / os.fsdecode(b"v\xffx")
    assert main([*COMMANDS["simulate"], "--summary-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not valid UTF-8" in err and len(err.splitlines()) == 1 and not out.exists()


def test_sweep_verdict_takes_the_highest_load_and_the_seed_rule(tmp_path):
    rows = []
    for scale, base in ((1, 3.0), (4, 0.9)):  # time_scale 4 stretches the arrival gaps: the lower load
        for seed, met in enumerate((True, False, False)):
            rows.append(
                {
                    "workload.time_scale": scale,
                    "policy": "sglang",
                    "seed": seed,
                    "slo_met": met,
                    "goodput_requests_per_s": base + 1,
                    "decode_tokens_per_s": 100.0,
                    "tpot_p99_s": 0.01,
                }
            )
            rows.append({"workload.time_scale": scale, "policy": "pulseinfer", "seed": seed, "slo_met": True,
                         "goodput_requests_per_s": base, "decode_tokens_per_s": 90.0, "tpot_p99_s": 0.01})  # fmt: skip
    page = build_page(_hand_made(tmp_path / "s", "sweep", {"sweep.csv": pd.DataFrame(rows)}))
    # sglang has more goodput but met the SLO on 1 of 3 seeds: as the Pareto figure, it does not count
    assert page.verdict == "Most goodput at the highest load (workload.time_scale=1): pulseinfer, 3 req/s."


def test_plan_verdict_names_a_tie(report_folders, tmp_path):
    folder = _copy(report_folders["plan"], tmp_path / "p")
    table = pd.read_csv(folder / "plan.csv")
    for col in ("usd_per_hour", "usd_per_million_output_tokens", "replicas_for_target", "gpus_billed"):
        table[col] = table[col].iloc[0]
    table["meets_slo"] = True
    table.to_csv(folder / "plan.csv", index=False)
    verdict = build_page(folder).verdict
    assert verdict.startswith("For 3 req/s under tpot_p99_ms=50, cheapest: ") and "; tied with " in verdict
    assert verdict.count(" on h") == 4  # the pick and the three other card × policy pairs
