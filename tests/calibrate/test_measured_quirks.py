"""What real public files showed (issue 47, tried on committed benchmark outputs): AIPerf records without `error`,
old vLLM results with SGLang-like keys, streams that send several tokens a chunk, server settings in meta.json,
near-zero queue times, a fit no better than the card, a shared prefix longer than the prompts, a run folder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from calibrate.measured import (
    chunked_stream,
    measured_scenario,
    recorded_overrides,
    replay_workload,
    validation_table,
)
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
