"""validate's comparison on recorded engine timings (no wall-clock measurement): deterministic stand-ins for the
calibrate → validate loop, whose wall-clock run is scripts/bench_validation_loop.py. Also its refusals before
any engine run: a request the simulator cannot finish, and an engine run larger than this machine's memory."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

import calibrate.validate as cv  # noqa: E402
from sim.config import Profile  # noqa: E402
from sim.config.loader import load_card  # noqa: E402

WORKLOAD = cv.ValidationWorkload(contexts=(1024, 2048, 3072, 4096), output_tokens=(12, 10, 8, 6))


def _profile(layers: int = 2) -> Profile:
    """A hand-made profile of a small model (2 layers, Qwen3-14B's head layout at 1/8 width), so the engine's
    speed reference (`validate`'s drift check) is cheap where a test reaches it."""
    card = load_card("model", "qwen3-14b")
    shape = {"hidden_size": 640, "intermediate_size": 2176, "head_dim": 16, "vocab_size": 4096}
    model = {**card, **shape, "name": "qwen3-14b-small", "num_layers": layers, "dtype": "fp32"}
    hardware = {**load_card("hardware", "h200"), "name": "calibrated", "measured": True}
    compute = {
        "model": "qwen3-14b-small", "layer_base_us": 400.0, "layer_per_request_us": 30.0,
        "layer_per_token_ns": 5.0, "head_base_us": 600.0, "head_per_request_us": 15.0,
    }  # fmt: skip
    return Profile.model_validate({"name": "synthetic", "hardware": hardware, "model": model, "compute": compute})


def test_request_metrics_match_hand_computed_tpot():
    step_s = np.array([0.010, 0.010, 0.020, 0.030])
    batch = np.array([2, 2, 1, 1])
    metrics = cv.request_metrics(step_s, batch, [3, 5])  # request 0 runs 2 steps, request 1 runs 4
    tpot = [0.020 / 2, 0.070 / 4]
    assert metrics["tpot_mean_ms"] == pytest.approx(np.mean(tpot) * 1e3)
    assert metrics["tpot_p99_ms"] == pytest.approx(np.percentile(tpot, 99) * 1e3)
    assert metrics["decode_tokens_per_s"] == pytest.approx(6 / 0.070)


@pytest.mark.parametrize("ratio", [0.8, 1.0, 1.25])
def test_validate_reports_the_error_of_recorded_timings(monkeypatch, ratio):
    """The engine's recorded step times are the simulator's × ratio: TPOT errors are 1/ratio − 1 exactly, the
    throughput error ratio − 1."""
    profile = _profile()

    def recorded(profile, name, workload, device, repeats, seed=0):
        sim = cv.simulate_steps(profile, name, workload, seed)
        return pd.DataFrame(
            {"step": sim["step"], "batch_size": sim["batch_size"], "measured_s": sim["simulated_s"] * ratio}
        )

    monkeypatch.setattr(cv, "measure_engine", recorded)
    table, steps = cv.validate(profile, ["sglang", "pulseinfer"], WORKLOAD, "cpu", repeats=1)
    assert list(steps["batch_size"][steps["policy"] == "sglang"]) == [4] * 5 + [3] * 2 + [2] * 2 + [1] * 2
    tpot = table["metric"].str.startswith("tpot")
    assert table.loc[tpot, "error_pct"].to_numpy() == pytest.approx((1 / ratio - 1) * 100)
    assert table.loc[~tpot, "error_pct"].to_numpy() == pytest.approx((ratio - 1) * 100)
    assert set(table["metric"]) == set(cv.METRICS) and len(table) == 2 * len(cv.METRICS)


def test_validate_refuses_engine_and_simulator_step_sequences_that_differ(monkeypatch):
    def one_step_more(profile, name, workload, device, repeats, seed=0):
        sim = cv.simulate_steps(profile, name, workload, seed)
        extra = pd.DataFrame({"step": [len(sim)], "batch_size": [1], "simulated_s": [0.01]})
        both = pd.concat([sim, extra], ignore_index=True)
        return both.rename(columns={"simulated_s": "measured_s"})

    monkeypatch.setattr(cv, "measure_engine", one_step_more)
    with pytest.raises(RuntimeError, match="engine ran 12 steps, simulator 11"):
        cv.validate(_profile(), ["sglang"], WORKLOAD, "cpu", repeats=1)


def test_context_the_simulator_cannot_run_is_refused_before_the_engine(monkeypatch):
    monkeypatch.setattr(cv, "measure_engine", lambda *a, **k: pytest.fail("engine ran"))
    profile = _profile()
    too_long = cv.ValidationWorkload(contexts=(profile.model.max_seq_len + 10,), output_tokens=(4,))
    with pytest.raises(ValueError, match=r"--contexts: the simulator cannot run request 0 .*exceeds_max_seq_len"):
        cv.validate(profile, ["sglang"], too_long, "cpu", repeats=1)


def test_engine_run_larger_than_memory_is_refused_with_the_estimate(monkeypatch):
    monkeypatch.setattr(cv, "measure_engine", lambda *a, **k: pytest.fail("engine ran"))
    profile = _profile()
    dev, host = cv.engine_memory_bytes(profile, "sglang", WORKLOAD)
    kv_bytes = sum(c + 14 for c in WORKLOAD.contexts) * profile.model.kv_bytes_per_token
    assert dev >= profile.model.weight_bytes + kv_bytes  # the dense pool holds every request's whole KV
    monkeypatch.setattr(cv, "available_memory_bytes", lambda: dev + host - 1)
    with pytest.raises(ValueError, match=r"--contexts: the engine run of sglang .* needs about [\d.]+ GiB"):
        cv.validate(profile, ["sglang"], WORKLOAD, "cpu", repeats=1)
    monkeypatch.setattr(cv, "available_memory_bytes", lambda: dev + host)
    cv.check_engine_fits(profile, ["sglang"], WORKLOAD, "cpu")  # fits exactly: no error


def test_validate_cli_refuses_too_long_contexts_with_one_line(tmp_path, capsys):
    import yaml

    from pulseinfer.cli import main

    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(_profile().model_dump(mode="json", exclude_none=True)))
    argv = ["validate", "--profile", str(path), "--device", "cpu", "--contexts", "10000000", "--output-tokens", "4"]
    assert main([*argv, "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --contexts: the simulator cannot run request 0") and err.count("\n") == 1
    assert not (tmp_path / "v").exists()
