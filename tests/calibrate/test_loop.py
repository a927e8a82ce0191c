"""The calibrate → profile → simulate → validate loop on a CPU, small enough for CI.

A tiny grid calibrates a 2-layer, width-8-scaled Qwen3-14B; the tests check what the loop writes and refuses, never
how fast the machine ran (no test may depend on machine load). The wall-clock comparison of simulated and measured
TPOT is a benchmark, scripts/bench_validation_loop.py; validate's comparison logic is tested on recorded timings
in tests/calibrate/test_validate_logic.py and the fits on synthetic timings in tests/calibrate/test_fit.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibrate.bench import TINY_GRID  # noqa: E402
from calibrate.run import CalibrationSettings, run_calibration  # noqa: E402
from pulseinfer.cli import main  # noqa: E402
from sim.config.profiles import load_profile  # noqa: E402

TINY = TINY_GRID


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("calibration")
    settings = CalibrationSettings(device="cpu", model="qwen3-14b", layers=2, scale=8)
    profile = run_calibration(settings, out, grid=TINY)
    return out, profile


def test_calibration_writes_tables_and_a_profile_the_simulator_reads(calibrated):
    out, profile = calibrated
    for name in ("copy", "recall", "compute", "selection", "matmul"):
        assert (out / f"{name}.csv").stat().st_size > 0
    meta = (out / "metadata.yaml").read_text()
    for key in ("device_name", "torch_version", "pinned", "commit", "date", "speed_ref_layer_s"):
        assert key in meta
    loaded = load_profile(out)
    assert loaded == profile
    assert loaded.model.name == "qwen3-14b-2l-w8-fp32" and loaded.compute.model == loaded.model.name
    assert loaded.hardware.measured and not loaded.hardware.io_overlaps_compute
    assert loaded.compute.layer_per_token_ns > 0 and loaded.selection.per_block_ns >= 0


def test_validate_cli_writes_csv_and_plot(calibrated, tmp_path, capsys):
    out, _ = calibrated
    rc = main(
        [
            "validate", "--profile", str(out), "--policy", "pulseinfer", "--contexts", "1024,2048",
            "--output-tokens", "4", "--repeats", "1", "--out", str(tmp_path), "--report",
        ]
    )  # fmt: skip
    assert rc == 0
    assert (tmp_path / "validation_steps.png").stat().st_size > 0
    page = (tmp_path / "report.html").read_text()  # the engine-validation report page (pulseinfer/page/checks.py)
    assert 'id="verdict">The simulator is ' in page and "fig-validation_steps" in page
    header = (tmp_path / "validation.csv").read_text().splitlines()[0]
    assert header == "policy,metric,simulated,measured,error_pct"
    out_text = capsys.readouterr().out
    assert "tpot_mean_ms" in out_text and "engine speed now vs at calibration" in out_text


def test_validate_cli_rejects_bad_input(calibrated, tmp_path, capsys):
    out, _ = calibrated
    assert main(["validate", "--profile", str(out), "--policy", "vllm", "--out", str(tmp_path)]) == 2
    assert "--policy 'vllm'" in capsys.readouterr().err
    assert main(["validate", "--profile", str(out), "--contexts", "1024,x", "--out", str(tmp_path)]) == 2
    assert "--contexts" in capsys.readouterr().err
    assert main(["validate", "--profile", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert "profile: no such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "--device tpu"),
        (["--layers", "0"], "--layers 0"),
        (["--model", "gpt-9"], "unknown card 'gpt-9'"),
        (["--model", "qwen3-30b-a3b", "--device", "cpu"], "is MoE"),
    ],
)
def test_calibrate_cli_rejects_bad_input(tmp_path, capsys, argv, message):
    assert main(["calibrate", "--out", str(tmp_path / "c"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_validate_refuses_a_profile_the_simulator_cannot_run_before_the_engine_runs(calibrated, tmp_path, capsys):
    import yaml

    out, _ = calibrated
    data = yaml.safe_load((out / "profile.yaml").read_text())
    data["hardware"]["hbm_gib"] = 0.001
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(data))
    assert (
        main(
            [
                "validate",
                "--profile",
                str(small),
                "--contexts",
                "512",
                "--output-tokens",
                "4",
                "--out",
                str(tmp_path / "v"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "does not fit" in err and "Traceback" not in err


def test_calibrate_selection_takes_the_parent_out_and_refuses_hardware_flags(tmp_path, capsys):
    from pulseinfer.cli import build_parser

    args = build_parser().parse_args(["calibrate", "--out", str(tmp_path / "x"), "selection"])
    assert (args.selection_out or args.out) == tmp_path / "x"
    args = build_parser().parse_args(["calibrate", "selection", "--out", str(tmp_path / "y")])
    assert (args.selection_out or args.out) == tmp_path / "y"
    assert main(["calibrate", "--model", "llama-3.1-8b", "selection", "--out", str(tmp_path)]) == 2
    assert "--model: options of the hardware calibration" in capsys.readouterr().err
    assert main(["calibrate", "selection", "--context", "100", "--out", str(tmp_path)]) == 2
    assert "--context 100: must be >= 1120" in capsys.readouterr().err


def test_a_calibration_folder_has_a_report_page(calibrated, tmp_path):
    """The engine calibration's page (pulseinfer/page/checks.py): the verdict gives the profile's measured figures."""
    import shutil

    from pulseinfer.marker import write_marker, written_claims
    from pulseinfer.page import build_page

    out = tmp_path / "cal"
    shutil.copytree(calibrated[0], out)
    write_marker(out, "calibrate", written_claims(out), provenance={})
    page = build_page(out)
    assert page.verdict.startswith("Profile of ") and "n/a" not in page.verdict, page.verdict
    assert "ns per layer and token" in page.verdict and any(name == "profile.yaml" for name, _ in page.texts)
