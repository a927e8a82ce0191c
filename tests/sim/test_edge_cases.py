"""Edge cases found by review: each once crashed, hung or misreported."""

from __future__ import annotations

import math

import pytest

from pulseinfer.cli import main
from sim.config import ScenarioError, load_scenario
from sim.run import simulate


def _trace(tmp_path, *rows: tuple[int, int, int]) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": {i}, "output_length": {o}}}\n' for t, i, o in rows))
    return str(path)


def _sim(*overrides: str):
    return simulate(load_scenario("default", [*overrides, "run.progress=false", "run.debug_checks=true"]))


def test_request_that_fills_the_pool_exactly_is_admitted_not_stuck(tmp_path):
    res = _sim(
        f"workload.trace={_trace(tmp_path, (0, 33, 2))}",
        "workload.time_scale=1",
        "hardware.reserve_gib=0",
        "hardware.hbm_gib=27.51904296875",
        "policies=pulseinfer",
    )
    assert res.policies["pulseinfer"].requests["finished"].all()


def test_unservable_request_is_rejected_on_arrival_without_using_a_prefill_gpu(tmp_path):
    trace = _trace(tmp_path, (0, 130000, 2000), (0, 130000, 2000), (1000, 1000, 10))
    req = _sim(f"workload.trace={trace}", "workload.time_scale=1", "serving.num_prefill_gpus=1", "policies=sglang")
    req = req.policies["sglang"].requests
    assert list(req["unfinished_reason"]) == ["exceeds_max_seq_len", "exceeds_max_seq_len", ""]
    assert req["first_token_s"].iloc[:2].isna().all()
    assert req["ttft_s"].iloc[2] < 1.0  # the valid request does not queue behind them


def test_zero_output_request_finishes_without_a_first_token(tmp_path):
    req = _sim(f"workload.trace={_trace(tmp_path, (0, 100, 0))}", "workload.time_scale=1").policies["sglang"].requests
    assert bool(req["finished"].iloc[0]) and math.isnan(req["ttft_s"].iloc[0]) and math.isnan(req["tpot_s"].iloc[0])


def test_long_requests_run_dense_when_host_dram_cannot_hold_them():
    # 1.3 GiB holds the smallest offloaded request (8192 tokens × 160 KiB = 1.25 GiB) but not longer ones
    res = _sim("hardware.host_dram_gib=1.3", "workload.max_requests=30", "policies=pulseinfer")
    req = res.policies["pulseinfer"].requests
    kv_bytes = res.scenario.model.kv_bytes_per_token
    too_big = (req["prompt_tokens"] + req["output_tokens"]) * kv_bytes > res.scenario.hardware.host_dram_bytes
    assert req["finished"].all() and too_big.any() and not req.loc[too_big, "offloaded"].any()


def test_host_dram_too_small_for_any_offload_is_refused():
    with pytest.raises(ScenarioError, match=r"policy\.pulseinfer\.offload_threshold_tokens: .*host_dram_gib = 0\.001"):
        load_scenario(None, ["hardware.host_dram_gib=0.001", "policies=pulseinfer"])


@pytest.mark.parametrize("key", ["hardware.hbm_gib", "hardware.h2d_latency_us", "hardware.hbm_bandwidth_gbps"])
def test_infinite_hardware_values_are_rejected(key):
    with pytest.raises(ScenarioError, match=key.replace(".", r"\.")):
        load_scenario(None, [f"{key}=.inf"])


def test_new_token_ratio_init_below_min_is_rejected():
    with pytest.raises(ScenarioError, match="new_token_ratio_init"):
        load_scenario(None, ["policy.sglang.new_token_ratio_init=0.01"])


def test_huge_synthetic_lengths_are_rejected_not_clipped(capsys):
    args = ["simulate", "--no-progress", "--set", "workload.trace=null", "--set", "workload.synthetic.num_requests=5",
            "--set", "workload.synthetic.rate_per_s=1", "--set", "workload.synthetic.output_tokens_mean=5",
            "--set", "workload.synthetic.prompt_tokens_mean=1e300"]  # fmt: skip
    assert main(args) == 2
    assert "workload.synthetic.prompt_tokens_mean" in capsys.readouterr().err
