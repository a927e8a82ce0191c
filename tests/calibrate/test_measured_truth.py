"""Your runs, your answer: a known truth in SGLang's format (files the simulator writes on a card with other figures),
the hold-out that is valid for every arrival process, a fit that knows the engine, prefix caching in the replay and
the cache-hit flag, every run of a file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibrate.measured import measured_from_result, measured_scenario, simulate_measured, validation_table, window_ids
from calibrate.measured_fit import fit_measured, fitted_bounds, run_error, with_params
from calibrate.measured_server import roofline_check
from pulseinfer.cli import main
from sim.run import simulate_policy
from sim.workload import load_workload
from traces.measured import read_measured, read_measured_runs, write_measured
from traces.measured.prefix import PREFIX_BLOCK_TOKENS, text_prefix_ids

CARD = ["serving.prefill=colocated", "model=llama-3.1-8b", "hardware=h100-sxm"]
SETS = [a for s in CARD for a in ("--set", s)]
# the "real" server: an H100 whose figures differ from the shipped card's
TRUE = ["hardware.hbm_efficiency=0.75", "hardware.decode_step_overhead_us=500", "hardware.prefill_mfu=0.6"]
GEN = ["workload.trace=null", "workload.time_scale=1", "workload.synthetic.prompt_tokens_cv=0.3",
       "workload.synthetic.output_tokens_cv=0.3", "workload.synthetic.rate_per_s=3"]  # fmt: skip


def _workload(n: int, prompt: int, output: int, seed: int, *settings: str):
    shape = [f"workload.synthetic.num_requests={n}", f"workload.synthetic.prompt_tokens_mean={prompt}",
             f"workload.synthetic.output_tokens_mean={output}", f"seed={seed}"]  # fmt: skip
    scn = measured_scenario("default", [*CARD, *GEN, *TRUE, *settings, *shape], "sglang")
    return scn, load_workload(scn).assign(arrival_s=0.0)


def _sglang_file(path: Path, scn, workload, cap: int | None = None) -> Path:
    """What SGLang's bench_serving writes for the simulated run: all at once, or a closed loop of ``cap``."""
    if cap is not None:
        workload = workload.assign(session_id=workload["request_id"].astype(str), turn=0, think_time_s=0.0)
        workload.attrs["max_concurrency"] = cap
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    return write_measured(run, path, "sglang_bench_serving")


@pytest.fixture(scope="module")
def sglang_truth(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sglang_truth")
    return {
        "a": _sglang_file(folder / "a.jsonl", *_workload(60, 2000, 150, 0)),
        "b": _sglang_file(folder / "b.jsonl", *_workload(60, 1000, 200, 1)),
        "closed": _sglang_file(folder / "closed.jsonl", *_workload(60, 1500, 150, 2), cap=8),
    }


def test_known_truth_in_sglang_format_default_off_true_exact_one_file_holds_out_another(sglang_truth):
    card, true = measured_scenario("default", CARD, "sglang"), measured_scenario("default", [*CARD, *TRUE], "sglang")
    runs = {k: read_measured(p) for k, p in sglang_truth.items()}
    assert runs["a"].load == "all_at_once" and runs["closed"].load == "concurrency"
    for run in runs.values():
        assert run_error(run, card, {})[1] > 10  # the shipped card, mean |error| over the fitted metrics
        assert run_error(run, true, {})[1] <= 2
    fit = fit_measured([runs["a"]], card, iterations=8)  # ONE all-at-once file
    assert fit.held_out_error_pct < 5, fit.tables
    assert run_error(runs["b"], card, fit.params)[1] <= 5  # a second file the fit never saw


def test_one_closed_loop_file_is_not_refused_for_its_split(sglang_truth, tmp_path):
    out = tmp_path / "cal"
    argv = ["calibrate", "--from-measured", str(sglang_truth["closed"]), "--iterations", "4", *SETS, "--out", str(out)]
    assert main(argv) == 0
    meta = yaml.safe_load((out / "profile.yaml").read_text())["metadata"]
    assert "sent last" in meta["held_out"] and float(meta["held_out_error_pct"]) < 5


def test_the_held_out_window_is_scored_on_the_whole_run_replayed():
    """With the true card, the late window of an all-at-once run replays at zero error: it is scored inside the
    whole run, not replayed cold on its own (which would be another load)."""
    scn, workload = _workload(40, 1500, 120, 3)
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    run.requests = run.requests.assign(arrival_s=np.nan)  # as SGLang records it: no send times
    early, late, words = window_ids(run, 0.4)
    assert len(late) == 16 and "finished last" in words
    assert set(early).isdisjoint(late)
    e2e = run.requests.set_index("request_id")["e2e_s"]
    assert e2e[late].min() >= e2e[early].max()  # the window is the run's end
    result, replayed, _ = simulate_measured(run, scn)
    table = validation_table(run, measured_from_result(result, replayed), late).set_index("metric")
    compared = table.dropna(subset=["error_pct"])
    assert "output_throughput_tok_s" in compared.index  # a run sent at once has send times: 0
    assert compared["error_pct"].abs().max() < 1.0, compared


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("sglang-0.5.5", {"decode_step_overhead_us", "decode_request_overhead_us"}),
        ("vllm-0.8.3", {"engine.step_serial_us", "engine.request_serial_us", "engine.request_overlapped_us"}),
        ("trtllm-1.0.0", {"engine.step_serial_us", "engine.request_serial_us"}),
    ],
)
def test_the_fit_moves_the_host_costs_the_engine_uses_and_each_one_has_an_effect(engine, expected):
    scn = measured_scenario("default", [*CARD, f"engine={engine}"], "sglang")
    bounds = fitted_bounds(scn)
    host = {n for n in bounds if "us" in n}
    assert host == expected
    sim_scn, workload = _workload(24, 1200, 80, 5)
    run = measured_from_result(simulate_policy(sim_scn, workload, "sglang"), workload)
    base = run_error(run, scn, {})[2]["simulated"]
    for name, (lo, hi, _) in bounds.items():
        from calibrate.measured_fit import card_value

        value = card_value(scn, name)
        moved = min(hi, value * 3) if value * 3 <= hi else max(lo, value / 3)
        changed = run_error(run, scn, {name: moved})[2]["simulated"]
        assert not np.allclose(changed.to_numpy(float), base.to_numpy(float), equal_nan=True), name


def test_engine_host_costs_go_on_the_engine_card_and_into_the_profile(tmp_path):
    scn = measured_scenario("default", [*CARD, "engine=vllm-0.8.3"], "sglang")
    moved = with_params(scn, {"engine.step_serial_us": 1234.0})
    assert moved.engine.step_serial_us == 1234.0 and scn.engine.step_serial_us != 1234.0
    sim_scn, workload = _workload(30, 1200, 80, 6)
    run = measured_from_result(simulate_policy(sim_scn, workload, "sglang"), workload)
    run.summary["backend"] = "vllm"
    path = write_measured(run, tmp_path / "v.jsonl", "sglang_bench_serving")
    out = tmp_path / "cal"
    argv = ["calibrate", "--from-measured", str(path), "--iterations", "2", *SETS, "--set", "engine=vllm-0.8.3",
            "--force", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    profile = yaml.safe_load((out / "profile.yaml").read_text())
    assert profile["metadata"]["engine"] == "vllm-0.8" and profile["metadata"]["engine_version"] == "0.8.3"
    fitted_engine = {k for k in profile["engine"] if k != "name"}
    assert fitted_engine and fitted_engine <= {"step_serial_us", "request_serial_us", "request_overlapped_us"}
    # the profile's host costs reach a scenario of the same line, and another engine is refused
    from sim.config import ScenarioError, load_scenario

    loaded = load_scenario("default", [*CARD, "engine=vllm-0.8.1", f"profile={out / 'profile.yaml'}"])
    for key in fitted_engine:
        assert getattr(loaded.engine, key) == pytest.approx(profile["engine"][key])
    with pytest.raises(ScenarioError, match="engine: the scenario runs 'sglang"):
        load_scenario("default", [*CARD, "engine=sglang-0.5.5", f"profile={out / 'profile.yaml'}"])


def test_a_value_at_a_bound_is_warned_and_recorded(tmp_path, capsys):
    scn, workload = _workload(30, 1000, 100, 7, "hardware.decode_step_overhead_us=30000")
    path = _sglang_file(tmp_path / "slow.jsonl", scn, workload)
    out = tmp_path / "cal"
    assert main(["calibrate", "--from-measured", str(path), "--iterations", "4", *SETS, "--force", "--out",
                 str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    meta = yaml.safe_load((out / "profile.yaml").read_text())["metadata"]
    at_bound = meta["at_bound"].split(", ")  # a 30 ms step is past the step cost's range: something gives
    assert at_bound[0] and "at a bound" in meta["verdict"]
    for name in at_bound:
        assert f"warning: {name} landed at a bound" in printed
    moved = pd.read_csv(out / "moved.csv").set_index("name")
    assert set(moved.loc[at_bound, "status"]) <= {"at upper bound", "at lower bound"}


def test_trials_is_refused_with_its_new_name(tmp_path, capsys):
    assert main(["calibrate", "--from-measured", "x.json", "--trials", "30", "--out", str(tmp_path / "o")]) == 2
    assert "--iterations" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# Prefix caching in the replay


def test_text_prefix_ids_share_exactly_the_shared_blocks():
    shared = "You are a helpful assistant. " * 40
    texts = [shared + "first question " * 30, shared + "second one " * 40, None, "x" * 2000]
    ids = text_prefix_ids(texts, [600, 640, 100, 500])
    assert ids[2] is None
    common = next(i for i, (a, b) in enumerate(zip(ids[0], ids[1], strict=False)) if a != b)
    chars_per_token = sum(len(t) for t in texts if t) / (600 + 640 + 500)
    assert common == int(len(shared) / chars_per_token // PREFIX_BLOCK_TOKENS)
    assert ids[3][0] != ids[0][0]


def _prefix_truth(tmp_path: Path, share: int) -> Path:
    """A run whose prompts share their first ``share`` tokens on a server with a prefix cache (known truth)."""
    scn, workload = _workload(40, 3000, 40, 8, "workload.synthetic.prompt_tokens_cv=0.1")
    workload = workload.assign(arrival_s=np.arange(len(workload)) * 0.25)
    k = share // PREFIX_BLOCK_TOKENS
    workload["hash_ids"] = [(*range(k), -(i + 1)) for i in range(len(workload))]
    workload.attrs["hash_block_tokens"] = PREFIX_BLOCK_TOKENS
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    return write_measured(run, tmp_path / "shared.json", "vllm_bench_serve")


def test_a_shared_prefix_in_the_replay_brings_ttft_back(tmp_path):
    path = _prefix_truth(tmp_path, 2048)
    true = measured_scenario("default", [*CARD, *TRUE], "sglang")
    run = read_measured(path)
    cold = run_error(run, true, {})[2]
    warm = run_error(run, true, {}, prefix_share=2048)[2]
    assert cold.loc["ttft_mean_ms", "error_pct"] > 35  # the replay cannot know the hits
    assert abs(warm.loc["ttft_mean_ms", "error_pct"]) < 2, warm


def test_reported_cached_tokens_warm_the_cache_before_the_run():
    scn = measured_scenario("default", [*CARD, *TRUE], "sglang")
    _, workload = _workload(20, 4000, 30, 9)
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    result, replayed, _ = simulate_measured(run, scn)
    cold_ttft = result.requests["first_token_s"].mean()
    run.requests["cached_tokens"] = (run.requests["prompt_tokens"] * 0.9).astype(float)
    result, replayed, notes = simulate_measured(run, scn)
    assert replayed.attrs["warm_prefixes"] and any("cache hits on 20 request" in n for n in notes)
    assert result.requests["first_token_s"].mean() < 0.5 * cold_ttft


def test_the_cache_hit_flag_names_the_factor(tmp_path, capsys):
    scn = measured_scenario("default", CARD, "sglang")
    _, workload = _workload(20, 8000, 30, 10)
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    assert roofline_check(run, scn) is None  # the simulator's own TTFTs are reachable
    run.requests["ttft_s"] = 0.002  # 8K-token prompts in 2 ms: ~25x faster than the H100's peak allows
    line = roofline_check(run, scn)
    assert line.startswith("cache hits: 20 of 20 requests") and "x below" in line
    factor = float(line.split("(up to ")[1].split("x below")[0])
    assert factor > 10
    path = write_measured(run, tmp_path / "hits.json", "vllm_bench_serve")
    assert main(["validate", "--measured", str(path), *SETS, "--out", str(tmp_path / "v")]) == 0
    assert "warning: cache hits: 20 of 20" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# Every run of a file


def test_every_run_of_a_file_and_a_sweep_as_a_curve(sglang_truth, tmp_path, capsys):
    both = tmp_path / "both.jsonl"
    both.write_text(sglang_truth["a"].read_text() + sglang_truth["b"].read_text())
    runs = read_measured_runs(both, run="all")
    assert [r.source_path.rsplit("#", 1)[1] for r in runs] == ["0", "1"]
    assert read_measured_runs(both, run=0)[0].num_prompts == 60
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(both), "--run", "all", *SETS, "--out", str(out)]) == 0
    table = pd.read_csv(out / "validation.csv")
    assert table["run"].nunique() == 2 and (out / "validation_sweep.png").is_file()
    capsys.readouterr()
    assert main(["validate", "--measured", str(both), "--run", "2", *SETS, "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the file holds 2 run(s)" in err
    assert main(["validate", "--measured", str(both), "--run", "last", *SETS, "--out", str(tmp_path / "x")]) == 2
    assert "--run 'last'" in capsys.readouterr().err


def test_a_guidellm_sweep_reaches_every_benchmark(tmp_path):
    fixture = Path(__file__).resolve().parents[1] / "traces" / "fixtures" / "measured" / "guidellm_report.json"
    report = json.loads(fixture.read_text())
    report["benchmarks"] = [report["benchmarks"][0]] * 3
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(report))
    assert len(read_measured_runs(path, run="all")) == 3


def test_validate_measured_honours_profile(sglang_truth, tmp_path, capsys):
    argv = ["validate", "--measured", str(sglang_truth["a"]), *SETS]
    assert main([*argv, "--profile", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "v")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
