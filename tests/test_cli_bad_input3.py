"""The third round of bad input (issue 48): every key a command cannot honour is honoured or refused in one line;
every measured-file reader refuses what no server can measure; cards have physical ranges, memory included;
replicas are bounded; a Ray address that does not speak gRPC fails at once; workers die with their parent,
whatever kills it; a killed run's staging folder is removed by the next run, which says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from pulseinfer.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "traces" / "fixtures" / "measured"
C = ["--set", "model=llama-3.1-8b", "--set", "hardware=h100-sxm", "--set", "serving.prefill=colocated"]
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
SYNTHETIC = ("workload.trace=null", "workload.time_scale=1", "workload.synthetic.prompt_tokens_mean=2000",
             "workload.synthetic.output_tokens_mean=64", "run.progress=false")  # fmt: skip
SYN = [x for item in SYNTHETIC for x in ("--set", item)]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------------------------------------------------------
# Settings a measured replay cannot honour, or honours


def test_replicas_behind_a_measured_replay_are_refused(tmp_path, capsys):
    for command in (["validate", "--measured"], ["calibrate", "--from-measured"]):
        argv = [*command, str(FIXTURES / "vllm_bench_serve.json"), *C, "--set", "serving.replicas=2"]
        assert main([*argv, "--out", str(tmp_path / command[0])]) == 2
        assert "serving.replicas: 2: a measured run is replayed on one server" in _one_line(capsys)


def test_a_horizon_cuts_the_replay_and_says_how_many(tmp_path, capsys):
    out = tmp_path / "v"
    argv = ["validate", "--measured", str(FIXTURES / "vllm_bench_serve.json"), *C, "--set", "run.horizon_s=0.5"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "run.horizon_s 0.5 s cut 4 of 6 replayed requests" in capsys.readouterr().out
    requests = pd.read_csv(out / "requests.csv")
    assert (requests["source"] == "simulated").sum() == 2


def test_a_scenario_given_as_a_profile_is_one_line(tmp_path, capsys):
    argv = ["validate", "--measured", str(FIXTURES / "vllm_bench_serve.json"), *C]
    assert main([*argv, "--set", "profile=scenarios/default.yaml", "--out", str(tmp_path / "v")]) == 2
    assert "is a scenario (it has policies, serving, slo, workload), not a profile" in _one_line(capsys)


# ---------------------------------------------------------------------------------------------------------------
# What no server can have measured


def _vllm(tmp_path: Path, name: str, **changes) -> Path:
    data = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
    for key, value in changes.items():
        data[key] = value(data) if callable(value) else value
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"latencies": lambda d: [t / 2 for t in d["ttfts"]]}, "e2e_s: shorter than its ttft_s (a negative TPOT)"),
        ({"latencies": lambda d: [-1.0] * len(d["ttfts"])}, "latencies"),
    ],
)
def test_an_impossible_time_is_refused_naming_the_request(tmp_path, capsys, changes, expected):
    path = _vllm(tmp_path, "bad.json", **changes)
    assert main(["validate", "--measured", str(path), *C, "--out", str(tmp_path / "v")]) == 2
    line = _one_line(capsys)
    assert expected in line and "request 0" in line or "index 0" in line


def test_gaps_whose_sum_overflows_are_refused(tmp_path, capsys):
    line = (FIXTURES / "sglang_bench_serving.jsonl").read_text().strip().splitlines()[-1]
    data = json.loads(line)
    data["itls"][0] = [1e308] * 3
    path = tmp_path / "over.jsonl"
    path.write_text(json.dumps(data) + "\n")
    assert main(["validate", "--measured", str(path), *C, "--out", str(tmp_path / "v")]) == 2
    assert "overflows" in _one_line(capsys)


@pytest.mark.parametrize("command", [["validate", "--measured"], ["calibrate", "--from-measured"]])
def test_deeply_nested_json_is_refused_without_a_traceback(tmp_path, capsys, command):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)  # 400 KB
    assert main([*command, str(path), *C, "--out", str(tmp_path / "v")]) == 2
    assert "nested 200000 deep" in _one_line(capsys)


# ---------------------------------------------------------------------------------------------------------------
# Ranges and bounds


@pytest.mark.parametrize(
    ("key", "value"), [("hardware.hbm_gib", "1e18"), ("hardware.host_dram_gib", "1e18"), ("hardware.fp8_tflops", "1e9")]
)
def test_memory_and_fp8_have_physical_ranges(tmp_path, capsys, key, value):
    assert main(["simulate", *C, "--set", f"{key}={value}", "--out", str(tmp_path / "s")]) == 2
    assert f"{key}: " in _one_line(capsys)


def test_replicas_are_bounded_and_tied_to_the_workload(tmp_path, capsys):
    assert main(["simulate", *C, "--set", "serving.replicas=1000000000", "--out", str(tmp_path / "a")]) == 2
    assert "serving.replicas" in _one_line(capsys)
    small = [*SYN, "--set", "workload.synthetic.num_requests=3", "--set", "workload.synthetic.rate_per_s=1"]
    assert main(["simulate", *C, *small, "--set", "serving.replicas=8", "--out", str(tmp_path / "b")]) == 2
    assert "serving.replicas: 8 needs an open-loop workload of at least as many requests" in _one_line(capsys)


@pytest.mark.parametrize("value", ["", " , "])
def test_cases_only_empty_is_refused(tmp_path, capsys, value):
    assert main(["cases", "--only", value, "--out", str(tmp_path / "c")]) == 2
    line = _one_line(capsys)
    assert "no case named" in line or "an empty value" in line


# ---------------------------------------------------------------------------------------------------------------
# Ray: an open port that is not Ray


def _listener(reply: bytes | None) -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            if reply is not None:
                connection.recv(64)
                connection.sendall(reply)
            time.sleep(3)
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_an_open_port_that_is_not_ray_fails_within_the_probe_timeout():
    from study.executors import ExecutorError, probe_ray_address

    silent, port = _listener(None)
    with silent, pytest.raises(ExecutorError, match="accepts connections but gives no gRPC answer within 0.5 s"):
        probe_ray_address(f"127.0.0.1:{port}", timeout_s=0.5)
    web, port = _listener(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with web, pytest.raises(ExecutorError, match="no gRPC answer"):
        probe_ray_address(f"127.0.0.1:{port}", timeout_s=0.5)
    grpc, port = _listener(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # what an HTTP/2 server sends first: SETTINGS
    with grpc:
        probe_ray_address(f"127.0.0.1:{port}", timeout_s=0.5)


# ---------------------------------------------------------------------------------------------------------------
# Workers die with their parent; a killed run's staging folder goes at the next run


def _children(parent: int) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            pids.append(int(pid))
    return pids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@LINUX
def test_sigkill_of_a_fleet_run_leaves_no_worker_and_the_next_run_removes_its_staging_folder(tmp_path):
    sets = [*SYN, "--set", "workload.synthetic.num_requests=40000", "--set", "workload.synthetic.rate_per_s=200",
            "--set", "serving.replicas=4", "--set", "run.workers=2"]  # fmt: skip
    out = tmp_path / "fleet"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pulseinfer", "simulate", *C, *sets, "--no-progress", "--out", str(out)],
        cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 3 and time.monotonic() < deadline:  # two workers and the resource tracker
            assert proc.poll() is None, "the run ended before its workers started"
            time.sleep(0.1)
        children = _children(proc.pid)
        assert len(children) >= 2, children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in children if _alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind by the killed run: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
    stale = list(tmp_path.glob(".fleet.partial-*"))
    assert stale, "the killed run left no staging folder to test with"
    live = tmp_path / f".fleet.partial-{os.getpid()}-live"  # a run still writing: left alone
    live.mkdir()
    small = [*SYN, "--set", "workload.synthetic.num_requests=20", "--set", "workload.synthetic.rate_per_s=4"]
    done = subprocess.run(
        [sys.executable, "-m", "pulseinfer", "simulate", *C, *small, "--no-progress", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"note: removed {stale[0]}" in done.stderr
    assert not stale[0].exists() and live.is_dir()


# ---------------------------------------------------------------------------------------------------------------
# Other instances of the same classes (a hostile user's second pass)


def test_a_killed_runs_staging_folder_that_holds_its_marker_is_left_with_a_note(tmp_path, capsys):
    """Killed while it replaced --out, a staging folder may hold entries of the old folder: never deleted."""
    out = tmp_path / "sim"
    stale = tmp_path / ".sim.partial-999999999-x"  # no such process
    stale.mkdir()
    (stale / ".pulseinfer-results").write_text("{}")
    (stale / "mine.txt").write_text("the user's")
    small = [*SYN, "--set", "workload.synthetic.num_requests=10", "--set", "workload.synthetic.rate_per_s=4"]
    assert main(["simulate", *C, *small, "--summary-only", "--out", str(out)]) == 0
    assert "it may hold files that were in" in capsys.readouterr().err
    assert (stale / "mine.txt").read_text() == "the user's"


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--grid", "workload.synthetic.rate_per_s=1,2", "--policies", ""],
        ["sweep", "--grid", "workload.synthetic.rate_per_s=1,2", "--slo="],
        ["plan", "--gpu-hour-usd", " "],
        ["search", "--space", "pulseinfer", "--study", ""],
        ["validate", "--measured", str(FIXTURES / "vllm_bench_serve.json"), "--policy", ""],
    ],
)
def test_an_empty_option_value_is_refused_not_taken_as_all(tmp_path, capsys, argv):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert "an empty value" in _one_line(capsys)
    assert not (tmp_path / "o").exists()


def test_a_worker_killed_from_outside_is_one_line():
    from concurrent.futures.process import BrokenProcessPool

    from pulseinfer.cli import error_message

    assert "a worker process died" in error_message(BrokenProcessPool("A process in the pool was terminated"))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model.num_layers", "10000000000"),
        ("hardware.hbm_efficiency", "5e-324"),
        ("hardware.prefill_mfu", "1e-18"),
        ("hardware.gpus_per_node", "1000000000000000000"),
        ("serving.num_prefill_gpus", "1000000000"),
        ("policy.pulseinfer.micro_batches", "1000000000"),
    ],
)
def test_absurd_card_and_policy_values_are_one_line(tmp_path, capsys, key, value):
    small = [*SYN, "--set", "workload.synthetic.num_requests=10", "--set", "workload.synthetic.rate_per_s=4"]
    assert main(["simulate", *C, *small, "--set", f"{key}={value}", "--out", str(tmp_path / "s")]) == 2
    assert key in _one_line(capsys)


@pytest.mark.parametrize(
    "key", ["workload.time_scale=100", "slo.tpot_ms=1", "serving.router=prefix_aware", "run.tables=summary",
            "policies=pulseinfer", "run.workers=4"]
)  # fmt: skip
def test_keys_a_measured_replay_cannot_honour_are_refused(tmp_path, capsys, key):
    argv = ["validate", "--measured", str(FIXTURES / "vllm_bench_serve.json"), *C, "--set", key]
    assert main([*argv, "--out", str(tmp_path / "v")]) == 2
    assert "a measured replay takes its load and its comparison from the file" in _one_line(capsys)


def test_calibrate_takes_one_policy_and_each_file_once(tmp_path, capsys):
    path = str(FIXTURES / "vllm_bench_serve.json")
    two = ["--policy", "sglang,pulseinfer"]
    assert main(["calibrate", "--from-measured", path, *C, *two, "--out", str(tmp_path)]) == 2
    assert "one policy" in _one_line(capsys)
    assert main(["calibrate", "--from-measured", path, path, *C, "--out", str(tmp_path / "c")]) == 2
    assert "given twice" in _one_line(capsys)


def test_gaps_past_the_request_and_a_request_past_a_week_are_refused(tmp_path, capsys):
    def edited(**changes):
        data = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
        for key, value in changes.items():
            data[key] = value(data)
        path = tmp_path / "e.json"
        path.write_text(json.dumps(data))
        return str(path)

    gap = edited(itls=lambda d: [[1e9, *d["itls"][0][1:]], *d["itls"][1:]])
    assert main(["validate", "--measured", gap, *C, "--out", str(tmp_path / "a")]) == 2
    assert "its gaps sum to" in _one_line(capsys)
    week = edited(latencies=lambda d: [1e15, *d["latencies"][1:]], itls=lambda d: [[], *d["itls"][1:]])
    assert main(["validate", "--measured", week, *C, "--out", str(tmp_path / "b")]) == 2
    assert "not one request of a benchmark" in _one_line(capsys)


def test_a_request_the_replay_leaves_out_does_not_raise_the_cache_hit_flag(tmp_path):
    from calibrate.measured import measured_scenario
    from calibrate.measured_server import roofline_check
    from traces.measured import read_measured

    data = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
    data["input_lens"][1] = 10**12  # longer than the model: left out of the replay, its TTFT is not checked
    path = tmp_path / "long.json"
    path.write_text(json.dumps(data))
    assert roofline_check(read_measured(path), measured_scenario("default", C[1::2], "sglang")) is None
