"""Bring your own measurements (calibrate/measured.py, measured_fit.py; `validate --measured`, `calibrate
--from-measured`): a round trip through the real formats, and a known truth the calibration must recover."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from calibrate.measured import measured_from_result, measured_scenario, simulate_measured, validation_table
from calibrate.measured_fit import fit_measured, run_error
from pulseinfer.cli import main
from sim.run import simulate_policy
from sim.workload import load_workload
from traces.measured import read_measured, write_measured

FIXTURES = Path(__file__).resolve().parents[1] / "traces" / "fixtures" / "measured"
CARD = ["serving.prefill=colocated", "model=llama-3.1-8b", "hardware=h100-sxm"]
# the "real" server: an H100 whose figures differ from the shipped card's (chosen away from the fitted values:
# slower reads, less per-step cost, faster prefill; the test checks the card is > 10 % off on mean TPOT)
TRUE = ["hardware.hbm_efficiency=0.75", "hardware.decode_step_overhead_us=500", "hardware.prefill_mfu=0.6"]
GEN = ["workload.trace=null", "workload.time_scale=1", "workload.synthetic.prompt_tokens_cv=0.3",
       "workload.synthetic.output_tokens_cv=0.3"]  # fmt: skip


def _simulated_file(folder: Path, name: str, fmt: str, *settings: str, rate: float = 3.0, n: int = 40) -> Path:
    scn = measured_scenario("default", [*CARD, *GEN, *settings, f"workload.synthetic.num_requests={n}",
                                        f"workload.synthetic.rate_per_s={rate}"], "sglang")  # fmt: skip
    workload = load_workload(scn)
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    return write_measured(run, folder / name, fmt)


@pytest.fixture(scope="module")
def truth(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("truth")
    prompt, output = "workload.synthetic.prompt_tokens_mean", "workload.synthetic.output_tokens_mean"
    shapes = [(f"{prompt}=2000", f"{output}=150", "seed=0"), (f"{prompt}=1000", f"{output}=200", "seed=1")]
    return [_simulated_file(folder, f"run{i}.json", "vllm_bench_serve", *TRUE, *s) for i, s in enumerate(shapes)]


@pytest.mark.parametrize(("fmt", "name"), [("vllm_bench_serve", "run.json"), ("sglang_bench_serving", "run.jsonl")])
def test_a_simulated_run_written_in_a_real_format_validates_at_zero_error(tmp_path, fmt, name):
    # vLLM records send times (replayed as they are); SGLang does not, so its run is sent all at once (arrivals 0)
    shape = ("workload.synthetic.prompt_tokens_mean=1500", "workload.synthetic.output_tokens_mean=100")
    scn = measured_scenario("default", [*CARD, *GEN, *shape, "workload.synthetic.num_requests=30",
                                        "workload.synthetic.rate_per_s=3"], "sglang")  # fmt: skip
    workload = load_workload(scn)
    if fmt == "sglang_bench_serving":
        workload = workload.assign(arrival_s=0.0)
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    path = write_measured(run, tmp_path / name, fmt)
    back = read_measured(path)
    result, replayed, _ = simulate_measured(back, measured_scenario("default", CARD, "sglang"))
    table = validation_table(back, measured_from_result(result, replayed))
    compared = table.dropna(subset=["error_pct"])
    assert len(compared) >= 12
    assert compared["error_pct"].abs().max() < 1.0, compared


def test_the_default_card_is_off_the_true_card_exact_and_a_fitted_profile_holds_out(truth):
    runs = [read_measured(p) for p in truth]
    card, true = measured_scenario("default", CARD, "sglang"), measured_scenario("default", [*CARD, *TRUE], "sglang")
    for run in runs:
        assert abs(run_error(run, card, {})[2].loc["tpot_mean_ms", "error_pct"]) > 10
        assert run_error(run, true, {})[1] < 2
    fit = fit_measured(runs, card, iterations=6)
    assert fit.held_out_error_pct < 5 and fit.fit_error_pct < 5
    assert "run1.json" in fit.held_out[0]


def test_calibrate_from_measured_writes_a_profile_that_validates_the_held_out_file(truth, tmp_path, capsys):
    out = tmp_path / "cal"
    sets = [a for s in CARD for a in ("--set", s)]
    assert main(["calibrate", "--from-measured", str(truth[0]), "--iterations", "6", *sets, "--out", str(out)]) == 0
    profile = yaml.safe_load((out / "profile.yaml").read_text())
    assert profile["metadata"]["card"] == "h100-sxm" and profile["hardware"]["name"] == "h100-sxm"
    assert profile["metadata"]["engine"] == "sglang-0.4"  # the scenario's engine: the file names none
    assert float(profile["metadata"]["held_out_error_pct"]) < 5  # the file's 40 % of requests sent last
    moved = pd.read_csv(out / "moved.csv")
    assert set(moved["name"]) == set(profile["metadata"]["fitted"].split(", ")) | set(
        filter(None, profile["metadata"]["without_effect"].split(", "))
    )
    assert "verdict: " in capsys.readouterr().out
    val = tmp_path / "val"
    assert main(["validate", "--measured", str(truth[1]), *sets, "--set", f"profile={out / 'profile.yaml'}",
                 "--out", str(val)]) == 0  # fmt: skip
    table = pd.read_csv(val / "validation.csv").set_index("metric")
    assert abs(table.loc["tpot_mean_ms", "error_pct"]) < 5
    assert (val / "validation_cdfs.png").is_file() and (val / "requests.csv").is_file()


def test_a_profile_that_fails_its_held_out_file_is_refused_unless_forced(truth, tmp_path, capsys):
    shape = ("workload.synthetic.prompt_tokens_mean=1000", "workload.synthetic.output_tokens_mean=100")
    other = _simulated_file(
        tmp_path, "other.json", "vllm_bench_serve", "hardware.decode_step_overhead_us=30000", *shape
    )
    sets = [a for s in CARD for a in ("--set", s)]
    argv = ["calibrate", "--from-measured", str(truth[0]), str(other), "--iterations", "3", *sets]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    assert "profile.yaml not written" in capsys.readouterr().err
    assert not (tmp_path / "a" / "profile.yaml").exists()
    assert main([*argv, "--force", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "profile.yaml").is_file()


@pytest.mark.parametrize(
    "name",
    ["sglang_bench_serving.jsonl", "vllm_bench_serve.json", "guidellm_report.json",
     "inference_perf_per_request.json", "vllm_otel_spans.jsonl", "aiperf_run/profile_export.jsonl",
     "mlcommons_result_summary.json", "vllm_requests/requests.jsonl"],
)  # fmt: skip
def test_validate_measured_reads_every_format(name, tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(FIXTURES / name), "--set", "serving.prefill=colocated",
                 "--set", "model=llama-3.1-8b", "--set", "hardware=h100-sxm", "--out", str(out)]) == 0  # fmt: skip
    table = pd.read_csv(out / "validation.csv")
    assert list(table.columns) == ["metric", "measured", "simulated", "error_pct"]
    assert table.set_index("metric").loc["ttft_mean_ms", "simulated"] > 0


def test_a_file_that_is_not_what_it_claims_is_one_line(tmp_path, capsys):
    code = main(
        ["validate", "--measured", str(FIXTURES / "broken_sglang_no_details.jsonl"), "--out", str(tmp_path / "v")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "output-details" in err
    assert not (tmp_path / "v").exists()


def _edited_vllm(tmp_path: Path, name: str, **changes) -> Path:
    data = __import__("json").loads((FIXTURES / "vllm_bench_serve.json").read_text())
    for key, value in changes.items():
        data[key] = value(data) if callable(value) else value
    path = tmp_path / name
    path.write_text(__import__("json").dumps(data))
    return path


def test_failed_requests_are_left_out_of_both_sides(tmp_path):
    run = read_measured(FIXTURES / "vllm_bench_serve.json")
    result, workload, notes = simulate_measured(run, measured_scenario("default", CARD, "sglang"))
    assert len(workload) == int(run.requests["success"].sum())
    assert any("failed request" in n for n in notes)


def test_requests_longer_than_the_model_are_left_out_or_refused(tmp_path):
    huge = _edited_vllm(tmp_path, "huge.json", input_lens=lambda d: [10_000_000] * len(d["input_lens"]))
    with pytest.raises(ValueError, match="max_seq_len"):
        simulate_measured(read_measured(huge), measured_scenario("default", CARD, "sglang"))
    one = _edited_vllm(tmp_path, "one.json", input_lens=lambda d: [10_000_000, *d["input_lens"][1:]])
    _, workload, notes = simulate_measured(read_measured(one), measured_scenario("default", CARD, "sglang"))
    assert any("max_seq_len" in n for n in notes) and workload["prompt_tokens"].max() < 10_000_000


def test_more_token_gaps_than_output_tokens_is_refused(tmp_path):
    bad = _edited_vllm(tmp_path, "gaps.json", output_lens=lambda d: [1] * len(d["output_lens"]))
    with pytest.raises(ValueError, match="inter-token gaps for 1 output tokens"):
        read_measured(bad)


def test_calibration_with_no_comparable_metric_is_refused(tmp_path, capsys):
    huge = _edited_vllm(tmp_path, "huge.json", input_lens=lambda d: [10_000_000] * len(d["input_lens"]))
    sets = [a for s in CARD for a in ("--set", s)]
    argv = ["calibrate", "--from-measured", str(huge), "--iterations", "1", *sets, "--out", str(tmp_path / "c")]
    assert main(argv) == 2
    assert "max_seq_len" in capsys.readouterr().err
    assert not (tmp_path / "c" / "profile.yaml").exists()


@pytest.mark.parametrize("given", [["sglang_bench_serving.jsonl", "run2.json"], ["run2.json"]], ids=["last", "only"])
def test_a_missing_measured_file_is_named_as_one_not_as_a_scenario(tmp_path, capsys, given):
    paths = [str(FIXTURES / name) if (FIXTURES / name).is_file() else str(tmp_path / name) for name in given]
    assert main(["calibrate", "--from-measured", *paths, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: --from-measured {tmp_path / 'run2.json'}: no such file"
    assert not (tmp_path / "out").exists()


def test_the_fitted_gemm_efficiency_is_the_one_of_the_weights_dtype():
    """FP8 weights on a card with FP8 tensor cores run their GEMMs at fp8_mfu, so that is what a fit moves."""
    from calibrate.measured_fit import fitted_bounds
    from sim.config import load_scenario

    bf16 = fitted_bounds(load_scenario("default", CARD))
    assert "prefill_mfu" in bf16 and "fp8_mfu" not in bf16
    fp8 = fitted_bounds(load_scenario("default", [*CARD, "model.dtype=fp8"]))
    assert "fp8_mfu" in fp8 and "prefill_mfu" not in fp8
    assert list(fitted_bounds(load_scenario("default", [*CARD, "model.dtype=fp8", "hardware=a100-80gb"]))) == list(bf16)


def test_validate_measured_times_forward_pass_metrics_step_by_step(tmp_path, capsys):
    out = tmp_path / "steps"
    sets = [a for s in CARD for a in ("--set", s)]
    assert main(["validate", "--measured", str(FIXTURES / "forward_pass_metrics.jsonl"), *sets, "--out", str(out)]) == 0
    table = pd.read_csv(out / "step_check.csv")
    assert len(table) == 10 and (table["simulated_s"] > 0).all()
    assert set(pd.read_csv(out / "step_check_summary.csv")["kind"]) == {"all", "decode_only", "mixed", "prefill_only"}
    assert (out / "step_check.png").is_file() and "timed step by step" in capsys.readouterr().out
    argv = ["validate", "--measured", str(FIXTURES / "forward_pass_metrics.jsonl"), "--run", "all", *sets]
    assert main([*argv, "--out", str(tmp_path / "x")]) == 2
    assert "per-iteration records" in capsys.readouterr().err
