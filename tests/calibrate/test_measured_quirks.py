"""What real public files showed (issue 47, tried on committed benchmark outputs): AIPerf records without `error`,
old vLLM results with SGLang-like keys, streams that send several tokens a chunk, server settings in meta.json,
near-zero queue times, a fit no better than the card, a shared prefix longer than the prompts, a run folder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from calibrate.measured import measured_scenario, replay_workload, validation_table
from calibrate.measured_server import chunked_stream, recorded_overrides
from pulseinfer.cli import main
from traces.measured import detect_measured_format, read_measured
from traces.measured.schema import MeasuredRun, build_requests

FIXTURES = Path(__file__).resolve().parents[1] / "traces" / "fixtures" / "measured"
SETS = ["--set", "serving.prefill=colocated", "--set", "model=llama-3.1-8b", "--set", "hardware=h100-sxm"]


def test_aiperf_records_without_an_error_key_are_detected(tmp_path):
    lines = (FIXTURES / "aiperf_run" / "profile_export.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    for record in records:
        if record.get("error") is None:
            record.pop("error", None)  # current AIPerf writes `error` only for failed requests
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert detect_measured_format(path) == "aiperf_profile_export"


def test_an_old_vllm_result_with_input_throughput_is_vllm(tmp_path):
    data = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
    for key in ("endpoint_type", "failed", "burstiness", "mean_e2el_ms", "max_concurrent_requests"):
        data.pop(key, None)
    data.update(input_throughput=1234.5, model_id="meta-llama/Llama-3.1-8B", tokenizer_id="x", best_of=1)
    path = tmp_path / "old_vllm.json"
    path.write_text(json.dumps(data))
    assert detect_measured_format(path) == "vllm_bench_serve"


def _chunked_run(tokens_per_chunk: int) -> MeasuredRun:
    outputs = [41] * 6
    gaps = [[0.01 * tokens_per_chunk] * (40 // tokens_per_chunk) for _ in outputs]
    table = build_requests([500] * 6, outputs, [0.0] * 6, [0.05] * 6, [0.05 + 0.4] * 6, gaps, [True] * 6)
    return MeasuredRun(table, "vllm_bench_serve", math.inf, None, 1.0, None, "vllm", 6, {}, "chunked.json")


def test_a_stream_of_several_tokens_a_chunk_has_its_itl_left_out():
    per_token, chunked = _chunked_run(1), _chunked_run(10)
    assert chunked_stream(per_token) is None
    note = chunked_stream(chunked)
    assert note.startswith("ITL: the stream sent several tokens per chunk (24 gaps for 240 tokens")
    table = validation_table(chunked, per_token).set_index("metric")
    assert table.loc["itl_p50_ms", "measured"] != table.loc["itl_p50_ms", "measured"]  # NaN: not compared
    assert table.loc["tpot_mean_ms", "error_pct"] == 0.0  # TPOT is still compared


def test_meta_json_server_settings_reach_the_replay_and_say_so(capsys, tmp_path):
    run = read_measured(FIXTURES / "vllm_requests" / "requests.jsonl")
    overrides, notes = recorded_overrides(run, ["policy.sglang.prefix_cache=false"], "sglang")
    assert "policy.sglang.max_running_requests=256" in overrides
    assert "policy.sglang.chunked_prefill_tokens=2048" in overrides
    assert "serving.tp_size=1" in overrides
    assert not any(o == "policy.sglang.prefix_cache=true" for o in overrides)  # the user's own setting wins
    assert len(notes) == 3
    scn = measured_scenario("default", [*SETS[1::2], *overrides], "sglang")
    assert scn.policy["sglang"].max_running_requests == 256
    # a folder with its requests.jsonl is taken as the file; the settings are printed
    assert main(["validate", "--measured", str(FIXTURES / "vllm_requests"), *SETS, "--out", str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    assert "note: policy.sglang.max_running_requests=256 (from the file's server settings)" in out
    assert "KV pool: the server held 41,408 tokens (meta.json)" in out


def test_a_queue_time_near_zero_has_no_relative_error():
    measured = _chunked_run(1)
    measured.requests["queue_s"] = 1e-6  # 1 µs: the server scheduled at once
    simulated = _chunked_run(1)
    simulated.requests["queue_s"] = 0.0
    table = validation_table(measured, simulated).set_index("metric")
    assert table.loc["queue_mean_ms", "measured"] > 0 and pd.isna(table.loc["queue_mean_ms", "error_pct"])


def test_a_prefix_longer_than_the_prompts_is_said():
    run = read_measured(FIXTURES / "vllm_bench_serve.json")
    _, notes = replay_workload(run, prefix_share=1e9)
    assert any("is as long as" in n and "shared whole" in n for n in notes)


def test_the_card_error_is_printed_beside_the_profile(tmp_path, capsys):
    argv = ["calibrate", "--from-measured", str(FIXTURES / "vllm_bench_serve.json"), "--iterations", "1", *SETS]
    main([*argv, "--force", "--out", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert "  the card:    fit " in out and "  the profile: fit " in out


def test_a_cut_off_last_line_leaves_the_earlier_runs_readable(tmp_path, capsys):
    line = (FIXTURES / "sglang_bench_serving.jsonl").read_text().strip().splitlines()[-1]
    torn = tmp_path / "torn.jsonl"
    torn.write_text(line + "\n" + line + "\n" + line[: len(line) // 2])  # a run stopped while writing the third
    from traces.measured import count_runs, read_measured_runs

    assert count_runs(torn) == 2
    runs = read_measured_runs(torn, run="all")
    assert len(runs) == 2 and any("line 3 is cut off" in n for n in runs[0].notes)
    inner = tmp_path / "inner.jsonl"
    inner.write_text(line[: len(line) // 2] + "\n" + line + "\n")  # not the end of the file: an error
    assert main(["validate", "--measured", str(inner), *SETS, "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "invalid JSON" in err and "cut off" not in err
    torn_only = tmp_path / "one.jsonl"
    torn_only.write_text(line[: len(line) // 2])  # nothing before it: an error that says why
    assert main(["validate", "--measured", str(torn_only), *SETS, "--out", str(tmp_path / "w")]) == 2
    assert "invalid JSON" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# What a review found


def test_files_of_one_server_share_its_engine_and_files_of_two_are_refused(tmp_path, capsys):
    from calibrate.measured_server import files_engine

    vllm, versioned = (
        read_measured(FIXTURES / "vllm_bench_serve.json"),
        read_measured(FIXTURES / "vllm_requests" / "requests.jsonl"),
    )
    overrides, note = files_engine([vllm, versioned], [])
    assert overrides[0] == "engine=vllm-0.19.0" and "0.19.0" in note  # the release one of them records
    sglang = read_measured(FIXTURES / "sglang_bench_serving.jsonl")
    sglang.summary["backend"] = "sglang"
    sglang.backend = "sglang"
    import pytest

    with pytest.raises(ValueError, match="different engines"):
        files_engine([vllm, sglang], [])
    assert files_engine([vllm, sglang], ["engine=vllm-0.8.3"])[0][0] == "engine=vllm-0.8.3"


def test_a_host_cost_the_engine_never_reads_is_without_effect_not_fitted(tmp_path):
    """vLLM 0.8's overlapped per-request cost hides behind the GPU step on this small run: it moves nothing, so the
    fit lists it as without effect (the pull toward the card's value does not count as an effect)."""
    from calibrate.measured_fit import fit_measured

    run = read_measured(FIXTURES / "vllm_bench_serve.json")
    scn = measured_scenario("default", [*SETS[1::2], "engine=vllm-0.8.5"], "sglang")
    fit = fit_measured([run], scn, iterations=1)
    assert "engine.request_overlapped_us" in fit.without_effect
    assert "engine.request_overlapped_us" not in fit.fitted
    assert set(fit.fitted) | set(fit.without_effect) == set(fit.params)


def test_a_profile_records_its_engine_line_even_when_the_host_costs_are_the_cards(tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["calibrate", "--from-measured", str(FIXTURES / "vllm_bench_serve.json"), "--iterations", "1", *SETS,
            "--set", "engine=sglang-0.4", "--force", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    import yaml

    profile = yaml.safe_load((out / "profile.yaml").read_text())
    assert profile["engine"]["name"] == "sglang-0.4" and "with values fitted" in profile["hardware"]["source"]
    import pytest

    from sim.config import ScenarioError, load_scenario

    with pytest.raises(ScenarioError, match="engine: the scenario runs 'vllm-0.9'"):
        load_scenario("default", [*SETS[1::2], "engine=vllm-0.9.2", f"profile={out / 'profile.yaml'}"])
    load_scenario("default", [*SETS[1::2], "engine=sglang-0.4.3", f"profile={out / 'profile.yaml'}"])


def test_a_value_set_on_the_command_line_wins_over_the_profiles_engine_section(tmp_path):
    import yaml

    from sim.config import load_scenario

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "engine": {"name": "vllm-0.11", "step_serial_us": 6754.0}}))
    base = [*SETS[1::2], "engine=vllm-0.11.2", f"profile={path}"]
    assert load_scenario("default", base).engine.step_serial_us == 6754.0
    assert load_scenario("default", [*base, "engine.step_serial_us=100"]).engine.step_serial_us == 100.0


def test_requests_the_replay_leaves_out_are_left_out_of_the_measured_side_too(tmp_path):
    from calibrate.measured import measured_from_result, simulate_measured

    data = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
    data["input_lens"][0] = 200_000  # longer than the model: not replayed
    path = tmp_path / "long.json"
    path.write_text(json.dumps(data))
    run = read_measured(path)
    scn = measured_scenario("default", SETS[1::2], "sglang")
    result, workload, _ = simulate_measured(run, scn)
    table = validation_table(run, measured_from_result(result, workload)).set_index("metric")
    kept = run.requests[run.requests["success"] & (run.requests["request_id"] != 0)]
    assert table.loc["ttft_mean_ms", "measured"] == (kept["ttft_s"].mean() * 1e3)


def test_a_folder_last_is_a_run_and_one_request_is_refused_before_the_fit(tmp_path, capsys):
    argv = ["calibrate", "--from-measured", str(FIXTURES / "vllm_requests"), "--iterations", "1", *SETS, "--force"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    data = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
    one = {k: (v[:1] if isinstance(v, list) else v) for k, v in data.items()}
    path = tmp_path / "one.json"
    path.write_text(json.dumps(one))
    assert main(["calibrate", "--from-measured", str(path), *SETS, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "too few to fit on some and hold out the rest" in err


def test_calibrate_prints_the_replays_warnings(tmp_path, capsys):
    data = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
    data["ttfts"] = [0.0005] * len(data["ttfts"])  # half a millisecond for every prompt: cache hits
    path = tmp_path / "fast.json"
    path.write_text(json.dumps(data))
    main(["calibrate", "--from-measured", str(path), "--iterations", "1", *SETS, "--force", "--out", str(path) + "c"])
    assert "warning: cache hits: " in capsys.readouterr().out


def test_per_iteration_records_given_to_calibrate_are_refused_with_the_command_that_reads_them(tmp_path, capsys):
    argv = ["calibrate", "--from-measured", str(FIXTURES / "forward_pass_metrics.jsonl"), *SETS]
    assert main([*argv, "--out", str(tmp_path / "c")]) == 2
    assert "validate --measured" in capsys.readouterr().err


def test_rows_rebuilt_from_histograms_are_sent_in_a_seeded_shuffle():
    from calibrate.measured import window_ids

    run = read_measured(FIXTURES / "mlcommons_result_summary.json")
    workload, notes = replay_workload(run, seed=0)
    assert any("sent shuffled" in n for n in notes)
    lengths = workload["prompt_tokens"].to_numpy()
    assert not (lengths[:-1] <= lengths[1:]).all()  # no longer in the histogram's order
    assert replay_workload(run, seed=0)[0]["source_id"].tolist() == workload["source_id"].tolist()
    early, late, _ = window_ids(run, 0.4, seed=0)
    e2e = run.requests.set_index("request_id")["e2e_s"]
    assert e2e[late].min() < e2e[early].max()  # the late window is not the slowest rows


def test_a_closed_loop_run_without_send_times_keeps_its_throughput_compared():
    """Scoring only the replayed requests is not a window: the run's own duration still gives its throughput."""
    from calibrate.measured import measured_from_result, simulate_measured

    run = read_measured(FIXTURES / "sglang_bench_serving.jsonl")
    assert run.load in ("concurrency", "rate", "all_at_once")
    result, workload, _ = simulate_measured(run, measured_scenario("default", SETS[1::2], "sglang"))
    table = validation_table(run, measured_from_result(result, workload)).set_index("metric")
    assert table.loc["output_throughput_tok_s", "measured"] > 0
    assert table.loc["output_throughput_tok_s", "error_pct"] == table.loc["output_throughput_tok_s", "error_pct"]
