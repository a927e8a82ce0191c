"""``pulseinfer plot`` and ``simulate --plots``: figures for what a results folder holds, notes for what it lacks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from plots.render import FIGURES, plot_results
from plots.tables import table_path
from pulseinfer.cli import EXIT_BAD_INPUT, main
from pulseinfer.outdir import MARKER

# 20 synthetic requests with 12k-token prompts: pulseinfer offloads and recalls; a run takes well under a second.
# Two policies, so the ablation bars (>= 3 policies) are skipped.
TINY = [
    "policies=sglang,pulseinfer",
    "workload.trace=null",
    "workload.synthetic.num_requests=20",
    "workload.synthetic.rate_per_s=5",
    "workload.synthetic.prompt_tokens_mean=12000",
    "workload.synthetic.output_tokens_mean=30",
]
# Drawn from any simulate run (requests and steps exist); the rest depend on what the run did (recall,
# number of policies, per-layer tables) and are either drawn or skipped with a note.
ALWAYS = ["memory_over_time", "throughput_over_time", "tpot_cdf", "ttft_cdf"]
ALL_FIGURES = sorted(spec.name for spec in FIGURES)


def _skipped(out: str) -> list[str]:
    return sorted(line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("skipped "))


def _assert_drawn_or_noted(figure_dir: Path, out: str, formats: tuple[str, ...] = ("png",)) -> list[str]:
    """Every figure is either written (in each format) or skipped with a note; never both, never neither."""
    files = sorted(p.name for p in figure_dir.iterdir() if p.name != MARKER)  # the marker lists the figures
    drawn = sorted({Path(f).stem for f in files})
    assert files == sorted(f"{name}.{fmt}" for name in drawn for fmt in formats)
    assert set(ALWAYS) <= set(drawn)
    assert sorted(drawn + _skipped(out)) == ALL_FIGURES
    return drawn


def _simulate_args(out: Path, *extra: str) -> list[str]:
    return ["simulate", "--out", str(out), "--no-progress", *[a for s in TINY for a in ("--set", s)], *extra]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "results"
    assert main(_simulate_args(out)) == 0
    return out


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_plot_writes_every_figure_the_tables_allow_and_notes_the_rest(results, tmp_path, capsys):
    capsys.readouterr()
    assert main(["plot", str(results), "--out", str(tmp_path / "figs"), "--format", "png,svg"]) == 0
    out = capsys.readouterr().out
    _assert_drawn_or_noted(tmp_path / "figs", out, ("png", "svg"))
    assert "skipped ablation_bars: summary.csv has 2 policies" in out
    assert all((tmp_path / "figs" / f"{name}.png").stat().st_size > 5000 for name in ALWAYS)


def test_plot_defaults_to_a_plots_folder_inside_the_results(results, tmp_path):
    copy = shutil.copytree(results, tmp_path / "copy")
    assert main(["plot", str(copy)]) == 0
    assert (copy / "plots" / "tpot_cdf.png").stat().st_size > 0


def test_folder_missing_a_table_skips_its_figures_with_a_note(results, tmp_path, capsys):
    copy = shutil.copytree(results, tmp_path / "copy")
    table_path(copy, "steps").unlink()  # steps.csv or steps.parquet
    (copy / "summary.csv").write_text("")  # empty: unreadable, skipped too
    capsys.readouterr()
    assert main(["plot", str(copy), "--out", str(tmp_path / "figs")]) == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir())[-2:] == ["tpot_cdf.png", "ttft_cdf.png"]
    out = capsys.readouterr().out
    for name in ("throughput_over_time", "link_utilisation", "recall_per_step", "memory_over_time"):
        assert f"skipped {name}: steps.csv not in" in out
    assert "skipped ablation_bars: cannot read summary.csv" in out


def test_fixture_tables_of_later_issues_render_through_the_registry(tmp_path, summary_df, layer_recall_df, timeline_df):
    summary_df.to_csv(tmp_path / "summary.csv", index=False)
    layer_recall_df.to_csv(tmp_path / "layer_recall.csv", index=False)
    timeline_df.to_csv(tmp_path / "timeline.csv", index=False)
    notes: list[str] = []
    written = plot_results(tmp_path, tmp_path / "figs", ["png"], note=notes.append)
    assert sorted(p.stem for p in written) == ["ablation_bars", "layer_pipeline", "layer_recall_heatmap"]
    # the two latency CDFs, four steps.csv figures and five fleet figures: requests.csv, steps.csv and replica_series
    # are absent
    assert len(notes) == 11


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda tmp: tmp / "nope", "no such folder"),
        (lambda tmp: tmp, "holds none of"),
        (lambda tmp: (tmp / "file.csv").write_text("x") and tmp / "file.csv", "not a folder"),
    ],
    ids=["missing_folder", "folder_without_tables", "a_file"],
)
def test_bad_results_dir_exits_2_with_one_error_line(tmp_path, capsys, make, needle):
    assert main(["plot", str(make(tmp_path))]) == EXIT_BAD_INPUT
    assert needle in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(("flag", "value"), [("--format", "png,bmp"), ("--dpi", "0")])
def test_bad_format_or_dpi_exits_2(results, tmp_path, capsys, flag, value):
    assert main(["plot", str(results), "--out", str(tmp_path / "f"), flag, value]) == EXIT_BAD_INPUT
    assert flag in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "f").exists()


def test_simulate_with_plots_draws_into_the_results_folder(tmp_path, capsys):
    assert main(_simulate_args(tmp_path / "run", "--plots")) == 0
    _assert_drawn_or_noted(tmp_path / "run" / "plots", capsys.readouterr().out)


def test_simulate_with_a_bad_format_fails_before_simulating(tmp_path, capsys):
    assert main(_simulate_args(tmp_path / "run", "--plots", "--format", "gif")) == EXIT_BAD_INPUT
    assert "--format" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


STEPS_FIGURES = ["link_utilisation", "memory_over_time", "recall_per_step", "throughput_over_time"]
ABLATION, INF = ["ablation_bars"], float("inf")


@pytest.mark.parametrize(
    ("table", "column", "value", "problem", "figures"),
    [
        ("steps", "duration_s", float("nan"), "steps column duration_s holds NaN", STEPS_FIGURES),
        ("steps", "duration_s", INF, "steps column duration_s holds an infinite value", STEPS_FIGURES),
        ("steps", "start_s", -1e308, "steps column start_s holds a negative time (-1e+308 s)", STEPS_FIGURES),
        ("summary", "decode_tokens_per_s", INF, "summary column decode_tokens_per_s holds an infinite value", ABLATION),
        ("requests", "tpot_s", -INF, "requests column tpot_s holds an infinite value", ["tpot_cdf", "ttft_cdf"]),
    ],
)
def test_a_table_with_values_no_run_writes_skips_its_figures_with_a_note(
    tmp_path, requests_df, steps_df, summary_df, table, column, value, problem, figures
):
    """Issue 30: NaN, inf or -1e308 in a table gave Tracebacks (``cannot convert float NaN to integer``, ``Maximum
    allowed size exceeded``, ``Axis limits cannot be NaN or Inf``)."""
    tables = {"requests": requests_df, "steps": steps_df, "summary": summary_df}
    tables[table].loc[:, column] = value
    for name, df in tables.items():
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    notes: list[str] = []
    written = plot_results(tmp_path, tmp_path / "figs", ["png"], note=notes.append)
    for figure in figures:
        assert f"skipped {figure}: cannot draw {table}.csv: {problem}" in notes
    assert not {p.stem for p in written} & set(figures)
    assert len(written) + len(notes) == len(FIGURES)


def test_nan_where_a_value_can_be_undefined_is_drawn(tmp_path, requests_df, summary_df):
    # a policy whose run issued nothing has NaN throughput; a request of one token has no TPOT (the fixture's)
    summary_df.loc[1, "decode_tokens_per_s"] = float("nan")
    summary_df.to_csv(tmp_path / "summary.csv", index=False)
    requests_df.to_csv(tmp_path / "requests.csv", index=False)
    written = plot_results(tmp_path, tmp_path / "figs", ["png"], note=lambda _: None)
    assert {"ablation_bars", "tpot_cdf", "ttft_cdf"} <= {p.stem for p in written}
