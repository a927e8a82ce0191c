"""The ``pulseinfer`` CLI: bad input exits 2 with one ``error:`` line naming the field; a good run writes its tables."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from plots.tables import table_path
from pulseinfer.cli import EXIT_BAD_INPUT, main
from sim.config import load_scenario

# Five short synthetic requests: a whole two-policy run takes well under a second.
TINY = [
    "workload.trace=null",
    "workload.synthetic.num_requests=5",
    "workload.synthetic.rate_per_s=10",
    "workload.synthetic.prompt_tokens_mean=1000",
    "workload.synthetic.output_tokens_mean=20",
]

SUMMARY_HEAD = [
    "policy", "finished", "unfinished", "decode_tokens_per_s", "tpot_mean_s", "tpot_p50_s", "tpot_p99_s",
    "ttft_p50_s", "ttft_p99_s", "goodput_requests_per_s", "mean_batch", "link_busy_frac", "peak_hbm_gib",
]  # fmt: skip


def _sets(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def _simulate(tmp_path: Path, *args: str) -> list[str]:
    return ["simulate", *args, "--out", str(tmp_path / "out"), "--no-progress"]


def _assert_one_error_line(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {lines!r}"
    assert lines[0].startswith("error: ") and len(lines[0]) > len("error: ")
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


# (test id, --set overrides, strings the error line must contain)
BAD_OVERRIDES = [
    ("unknown_nested_key", ["workload.time_scal=2"], ["workload.time_scal", "unknown key", "time_scale"]),
    ("unknown_top_key", ["nonsense=1"], ["nonsense", "expected one of", "seed"]),
    ("rate_and_scale", ["workload.target_rate_per_s=4"], ["time_scale is 0.6", "--set workload.time_scale=1"]),
    ("negative_bandwidth", ["hardware.h2d_bandwidth_gbps=-5"], ["hardware.h2d_bandwidth_gbps", "-5"]),
    ("missing_trace_file", ["workload.trace=/nonexistent.jsonl"], ["workload.trace", "/nonexistent.jsonl"]),
    ("unknown_policy", ["policies=sglang,foo"], ["policies", "foo"]),
    ("unknown_model_card", ["model=gpt-9"], ["model", "gpt-9"]),
    ("model_too_big_for_hbm", ["model=llama-3.1-70b", "hardware=h100-sxm"], ["llama-3.1-70b", "hbm"]),
    ("set_without_equals", ["workload.time_scale"], ["--set", "workload.time_scale"]),
]


@pytest.mark.parametrize(("overrides", "needles"), [c[1:] for c in BAD_OVERRIDES], ids=[c[0] for c in BAD_OVERRIDES])
def test_bad_override_exits_2_with_one_error_line_naming_the_field(tmp_path, capsys, overrides, needles):
    code = main(_simulate(tmp_path, *_sets(overrides)))
    assert code == EXIT_BAD_INPUT == 2
    _assert_one_error_line(capsys.readouterr().err, *needles)
    assert not (tmp_path / "out").exists()


def test_unknown_top_level_key_in_yaml_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text("model: qwen3-14b\nhardware: h200\nworklaod:\n  time_scale: 2\n")
    assert main(_simulate(tmp_path, str(path))) == 2
    _assert_one_error_line(capsys.readouterr().err, "worklaod")


def test_missing_scenario_file_exits_2_naming_the_path(tmp_path, capsys):
    missing = tmp_path / "no_such_scenario.yaml"
    assert main(_simulate(tmp_path, str(missing))) == 2
    _assert_one_error_line(capsys.readouterr().err, "no_such_scenario")


def test_yaml_that_is_not_a_mapping_exits_2(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text("- model\n- hardware\n")
    assert main(_simulate(tmp_path, str(path))) == 2
    _assert_one_error_line(capsys.readouterr().err, "list.yaml", "mapping")


def test_scenario_file_that_is_not_utf8_exits_2(tmp_path, capsys):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00model: qwen3-14b\n")
    assert main(_simulate(tmp_path, str(path))) == 2
    _assert_one_error_line(capsys.readouterr().err, "binary.yaml")


def test_out_that_is_an_existing_file_exits_2(tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("")
    assert main(["simulate", *_sets(TINY), "--out", str(out), "--no-progress"]) == 2
    _assert_one_error_line(capsys.readouterr().err, str(out))


def test_console_script_exits_2_without_traceback_on_unknown_key(tmp_path):
    script = Path(sys.executable).parent / "pulseinfer"
    assert script.is_file(), f"console script not installed next to {sys.executable}"
    proc = subprocess.run(
        [str(script), "simulate", "--set", "workload.time_scal=2", "--no-progress"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "workload.time_scal" in proc.stderr


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"]], ids=["top", "simulate"])
def test_help_exits_0(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert "usage: pulseinfer" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("tiny_run")
    code = main(["simulate", *_sets(TINY), "--out", str(out), "--no-progress"])
    return code, out


def test_tiny_run_exits_0(tiny_run):
    code, _ = tiny_run
    assert code == 0


@pytest.mark.parametrize("name", ["summary.csv", "requests.csv", "steps.csv", "scenario.yaml"])
def test_tiny_run_writes_table(tiny_run, name):
    _, out = tiny_run
    path = out / name if name.endswith(".yaml") or name == "summary.csv" else table_path(out, name)  # csv or parquet
    assert path is not None and path.is_file() and path.stat().st_size > 0


def test_summary_csv_starts_with_the_documented_columns(tiny_run):
    _, out = tiny_run
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns[: len(SUMMARY_HEAD)]) == SUMMARY_HEAD
    assert list(summary["policy"]) == load_scenario(None, TINY).policies


def test_written_scenario_yaml_loads_back_equal(tiny_run):
    _, out = tiny_run
    assert load_scenario(out / "scenario.yaml") == load_scenario(None, TINY)


def test_malformed_trace_row_exits_2_naming_file_line_and_field(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 100, "output_length": 5}\n'
        '{"timestamp": 10, "input_length": -3, "output_length": 5}\n'
    )
    assert main(_simulate(tmp_path, "--set", f"workload.trace={trace}")) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, "workload.trace", "bad.jsonl", "line 2", "input_length")


# --- Bounded input (issue 30): an alias bomb, an impossible rate or resolution is one line, before any simulation ---


def _no_simulation(*_args, **_kwargs):
    raise AssertionError("a bad flag must be refused before anything is simulated or drawn")


def test_yaml_alias_bomb_scenario_exits_2_with_one_short_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sim.run.simulate", _no_simulation)
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]  # 9 values, each level 9 x the one before
    lines += [f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")]  # 9^9 in all
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert main(_simulate(tmp_path, str(bomb))) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    _assert_one_error_line(err, "bomb.yaml", "1,000,000")
    assert len(err) < 300


@pytest.mark.parametrize("rate", ["inf", "nan", "-1", "0"])
def test_plan_target_rate_that_is_not_finite_and_positive_exits_2_before_planning(tmp_path, capsys, monkeypatch, rate):
    monkeypatch.setattr("study.plan.check_plan", _no_simulation)
    monkeypatch.setattr("study.plan.run_plan", _no_simulation)
    code = main(["plan", "--target-rate", rate, "--out", str(tmp_path / "plan"), "--no-progress", *_sets(TINY)])
    assert code == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, f"--target-rate {float(rate)}", "finite number > 0")
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("dpi", ["20000", "0", "19", "601"])
def test_simulate_plots_dpi_out_of_range_exits_2_before_simulating(tmp_path, capsys, monkeypatch, dpi):
    monkeypatch.setattr("sim.run.simulate", _no_simulation)
    assert main(_simulate(tmp_path, "--plots", "--dpi", dpi, *_sets(TINY))) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, f"--dpi {dpi}", "20 to 600")
    assert not (tmp_path / "out").exists()


def test_plot_dpi_out_of_range_exits_2_before_drawing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("plots.render.plot_results", _no_simulation)
    (tmp_path / "results").mkdir()
    assert main(["plot", str(tmp_path / "results"), "--dpi", "20000"]) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, "--dpi 20000", "20 to 600")
    assert not (tmp_path / "results" / "plots").exists()


# --- Impossible numbers and requests that can never run (issue 30) ---


def _jsonl_trace(tmp_path: Path, *rows: tuple[int, int, int]) -> str:
    """A Mooncake-style trace of (timestamp ms, prompt tokens, output tokens) rows."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": {i}, "output_length": {o}}}\n' for t, i, o in rows))
    return str(path)


def test_recall_cache_larger_than_the_free_hbm_exits_2_naming_the_key_and_the_gib_left(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sim.run.simulate", _no_simulation)
    cache = ["policies=pulseinfer", "policy.pulseinfer.recall_cache=shared", "policy.pulseinfer.recall_cache_gib=101"]
    cache.append("engine=sglang-0.4")  # its 12.5 GiB reserve on an H200 leaves 100.39 GiB
    assert main(_simulate(tmp_path, *_sets([*TINY, *cache]))) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, "policy.pulseinfer.recall_cache_gib: 101 GiB", "100.39 GiB")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["workload.max_requests=20", "workload.time_scale=1e12"], ["workload.time_scale: 1e+12", "use at most"]),
        ([*TINY, "workload.synthetic.rate_per_s=1e-300"], ["workload.synthetic.rate_per_s: 1e-300", "use at least"]),
        ([*TINY, "hardware.hbm_bandwidth_gbps=1e-9"], ["hardware.hbm_bandwidth_gbps: 1e-09", "physical range"]),
    ],
    ids=["time_scale", "rate", "hbm_bandwidth"],
)
def test_inputs_that_would_lose_clock_precision_exit_2_with_one_line(tmp_path, capsys, overrides, needles):
    assert main(_simulate(tmp_path, *_sets(["policies=sglang", *overrides]))) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, *needles)
    assert not (tmp_path / "out").exists()


def test_rejected_requests_are_counted_by_reason_on_the_console(tmp_path, capsys):
    trace = _jsonl_trace(tmp_path, (0, 1000, 10), (0, 200000, 10), (10, 300000, 5), (20, 900, 10))
    args = _sets([f"workload.trace={trace}", "workload.time_scale=1", "policies=sglang"])
    assert main(_simulate(tmp_path, *args)) == 0
    out = capsys.readouterr().out
    assert "sglang rejected: 2 — prompt + output longer than max_seq_len 131072" in out


def test_run_where_every_request_is_rejected_exits_2_with_the_reason(tmp_path, capsys):
    trace = _jsonl_trace(tmp_path, (0, 1_000_000, 10), (10, 1_000_000, 10))
    args = _sets([f"workload.trace={trace}", "workload.time_scale=1", "policies=sglang,pulseinfer"])
    assert main(_simulate(tmp_path, *args)) == EXIT_BAD_INPUT
    _assert_one_error_line(
        capsys.readouterr().err,
        "every request was rejected",
        "sglang rejected: 2 — prompt + output longer than max_seq_len 131072",
        "pulseinfer rejected: 2",
    )
    assert not (tmp_path / "out").exists()


def test_physics_violation_is_one_bug_report_line_exit_1_not_a_result(tmp_path, capsys, monkeypatch):
    from pulseinfer.cli import BUG_REPORTS
    from sim.metrics.physics import PhysicsBounds, PhysicsError

    assert PhysicsError.__module__.startswith("sim.") and "PhysicsError" in BUG_REPORTS["sim"]
    # a card of 1 GiB as the bound: the run's real peak HBM breaks it, as a simulator bug would
    monkeypatch.setattr("sim.run.bounds_of", lambda policy: PhysicsBounds(1.0, 55.0, 0.0))
    assert main(_simulate(tmp_path, *_sets([*TINY, "policies=sglang"]))) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bug: ") and "Traceback" not in captured.err, lines
    for needle in ("peak_hbm_gib <= hardware.hbm_gib", "(measured ", "bound 1)", "scenario 'default'", "report"):
        assert needle in lines[0], (needle, lines[0])
    assert "decode tok/s" not in captured.out and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["calibrate"], ["calibrate", "selection"], ["calibrate", "serving"], ["validate"],
                                  ["accuracy"], ["engine-bench"], ["plot"]])  # fmt: skip
def test_help_states_each_default_once(argv, capsys):
    """A help text that already says its default gets no second ``(default: ...)``; ``None``/``False`` defaults
    (flags, defaults the text explains) are not printed; a default of 0 is."""
    from pulseinfer.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # unwrap argparse's line breaks
    assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text
    for help_text in re.findall(r"\(default[^)]*\)(?:(?! --)[^(])*\(default", text):
        pytest.fail(f"{' '.join(argv)}: a default stated twice: {help_text!r}")
    if argv == ["calibrate"]:
        assert "seed of weights, KV and block choice (default: 0)" in text


def test_calibrate_serving_has_no_seed_of_its_own():
    """The serving fit is deterministic least squares (no sampler): ``--seed`` after ``serving`` is refused rather than
    silently ignored; calibrate's own ``--seed`` before the word still parses."""
    from pulseinfer.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["calibrate", "serving", "--seed", "3"])
    assert build_parser().parse_args(["calibrate", "--seed", "5", "serving"]).seed == 5
