"""Nothing lost, nothing hung: Ctrl-C, SIGTERM and SIGHUP stop every worker, keep what finished and exit 130, 143
or 129 with one line; a closed --ray-address fails at once; a big run needs --yes; a damaged sweep cache record is
recomputed.

The signal tests start the real CLI in a subprocess in its own session, wait until its work is under way (a sweep
cache record, a completed search trial, plan's worker processes), send the signal to the main process only, then
check the exit status, that no process of the session is left, and what is on disk. Their timeouts are hang
guards only. Linux only (they read /proc).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pulseinfer.cli import main

REPO = Path(__file__).resolve().parents[1]
HANG_S = 120.0  # hang guard for each wait; never reached by a working run
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")

SYNTHETIC = [
    "workload.trace=null",
    "workload.time_scale=1",
    "workload.synthetic.rate_per_s=4",
    "workload.synthetic.prompt_tokens_mean=12000",
    "workload.synthetic.output_tokens_mean=20",
    "serving.prefill=colocated",
    "run.progress=false",
]
SETS = [x for item in SYNTHETIC for x in ("--set", item)]
# Python leaves SIGINT ignored when it starts with it ignored (a shell's background job): give the CLI Ctrl-C back.
CLI = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); import pulseinfer.cli as c; c.entry()"
SPACE = """params:
  policy.pulseinfer.budget_tokens: {low: 512, high: 2048, step: 512}
  policy.pulseinfer.max_running_requests: {choices: [2, 8, 64]}
"""


@pytest.fixture(autouse=True)
def _hangup_not_ignored():
    """These tests send SIGHUP on purpose. Under ``nohup`` it is ignored, and a child inherits that disposition (the
    CLI then honours it, by design): give the children the default disposition, as a terminal would."""
    if not hasattr(signal, "SIGHUP"):
        yield
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _stat(pid: str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ... (None: gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _session(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(pid)
        if fields and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(pid))
    return pids


def _workers(parent: int) -> int:
    """Spawned multiprocessing workers of ``parent``."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(pid)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        count += bool(fields and int(fields[1]) == parent and b"spawn_main" in cmdline)
    return count


def _wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended ({proc.returncode}) before {what}: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {HANG_S:.0f} s")
        time.sleep(0.05)


def _interrupt(argv: list[str], started, signum: int, what: str, workers: int = 2) -> tuple[int, list[str]]:
    """Run the CLI, wait for ``started()`` and ``workers`` worker processes, send ``signum`` to its main process;
    (status, stderr lines) once the session has no process left."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, *argv, "--no-progress"],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: _workers(proc.pid) >= workers and started(), proc, what)
        os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=HANG_S)
    except BaseException:  # a failed wait: leave no process of the run behind either
        proc.kill()
        for pid in _session(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise
    deadline = time.monotonic() + HANG_S
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _session(proc.pid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    return proc.returncode, err.strip().splitlines()


SIGNALS = [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
HANGUP = (getattr(signal, "SIGHUP", 1), 129, "hangup")  # the terminal or ssh session closed


@LINUX
@pytest.mark.parametrize("signum, status, line", [*SIGNALS, HANGUP])
def test_signal_stops_a_sweep_and_keeps_its_cache(tmp_path, signum, status, line):
    out = tmp_path / "sweep"
    records = lambda: list((out / "cache").glob("*/*.json"))  # noqa: E731
    # Two tiny points finish first; the big ones are still running when the signal comes.
    grid = "workload.synthetic.num_requests=8,9,3000,3001,3002,3003"
    argv = ["sweep", "default", *SETS, "--grid", grid, "--policies", "sglang", "--jobs", "2", "--out", str(out)]
    code, err = _interrupt(argv, lambda: records(), signum, "cache record")
    assert (code, err) == (status, [line])
    kept = records()
    assert kept and all(isinstance(json.loads(p.read_text()), dict) for p in kept)
    assert not list(out.glob(".sweep-*")) and not list(tmp_path.glob(".*partial*"))


@LINUX
@pytest.mark.parametrize("signum, status, line", SIGNALS)
def test_signal_stops_a_search_and_keeps_its_journal(tmp_path, signum, status, line):
    from study.search import INTERRUPTED_ATTR, open_storage

    out, space = tmp_path / "search", tmp_path / "space.yaml"
    space.write_text(SPACE)
    journal = out / "study.journal"

    def completed() -> list:
        if not journal.exists():
            return []
        storage = open_storage(str(journal))
        studies = storage.get_all_studies()
        trials = storage.get_all_trials(studies[0]._study_id) if studies else []
        return [t for t in trials if t.state.name == "COMPLETE"]

    sets = [*SETS, "--set", "workload.synthetic.num_requests=150"]  # 40 trials outlast the wait
    argv = ["search", "default", *sets, "--space", str(space), "--trials", "40", "--slo", "tpot_p99_ms=60"]
    code, err = _interrupt([*argv, "--jobs", "2", "--out", str(out)], completed, signum, "completed trial")
    assert (code, err) == (status, [line])
    done = completed()
    assert done and all("metrics" in t.user_attrs for t in done)
    assert not any(t.user_attrs.get(INTERRUPTED_ATTR) for t in done)


@LINUX
@pytest.mark.parametrize("signum, status, line", [*SIGNALS, HANGUP])
def test_signal_stops_a_plan_and_leaves_no_staging_folder(tmp_path, signum, status, line):
    out = tmp_path / "plan"
    # a sample long enough that the plan is still running when the signal comes (it stops at once)
    sets = [*SETS, "--set", "workload.synthetic.num_requests=3000", "--set", "workload.synthetic.rate_per_s=2"]
    argv = ["plan", "default", *sets, "--policies", "sglang,pulseinfer", "--max-requests", "3000"]
    argv += ["--slo", "tpot_p99_ms=60", "--jobs", "2", "--out", str(out)]
    staged = lambda: list(tmp_path.glob(".plan.partial-*"))  # noqa: E731
    code, err = _interrupt(argv, lambda: bool(staged()), signum, "staging folder")
    assert (code, err) == (status, [line])
    assert list(tmp_path.iterdir()) == []  # no staging folder, and no half-written --out


@LINUX
def test_hangup_stops_a_simulate_and_leaves_no_staging_folder(tmp_path):
    out = tmp_path / "sim"
    sets = [*SETS, "--set", "workload.synthetic.num_requests=20000"]  # outlasts the wait
    staged = lambda: list(tmp_path.glob(".sim.partial-*"))  # noqa: E731
    argv = ["simulate", "default", *sets, "--summary-only", "--out", str(out)]
    code, err = _interrupt(argv, lambda: bool(staged()), HANGUP[0], "staging folder", workers=0)
    assert (code, err) == (HANGUP[1], [HANGUP[2]])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum, status, line", [SIGNALS[1], HANGUP])
def test_a_signal_inside_a_command_exits_with_one_line_and_restores_the_handler(
    monkeypatch, capsys, signum, status, line
):
    import pulseinfer.commands.trace as trace

    def run(args):
        os.kill(os.getpid(), signum)
        time.sleep(HANG_S)  # the signal interrupts this
        return 0

    monkeypatch.setattr(trace, "run", run)
    before = signal.getsignal(signum)
    assert main(["trace", "stats"]) == status
    assert capsys.readouterr().err == f"{line}\n"
    assert signal.getsignal(signum) is before


def test_an_ignored_hangup_stays_ignored(monkeypatch, capsys):
    """``nohup pulseinfer ...`` starts with SIGHUP ignored: the run goes on when the terminal closes."""
    import pulseinfer.commands.trace as trace

    def run(args):
        os.kill(os.getpid(), HANGUP[0])
        return 0

    monkeypatch.setattr(trace, "run", run)
    previous = signal.signal(HANGUP[0], signal.SIG_IGN)
    try:
        assert main(["trace", "stats"]) == 0
        assert signal.getsignal(HANGUP[0]) is signal.SIG_IGN
    finally:
        signal.signal(HANGUP[0], previous)
    assert capsys.readouterr().err == ""


def test_a_failed_task_stops_the_other_workers_at_once():
    from study.executors import run_tasks

    started = time.monotonic()
    with pytest.raises(ValueError, match="task 0 failed"):
        run_tasks(_fail_or_sleep, [(0,), (1,)], "local", jobs=2)
    assert time.monotonic() - started < HANG_S  # the sleeping worker was stopped, not waited for


def _fail_or_sleep(i: int) -> None:
    if i == 0:
        time.sleep(1.0)  # let the other worker start sleeping
        raise ValueError("task 0 failed")
    time.sleep(10 * HANG_S)


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_a_closed_ray_address_fails_at_once_with_one_line(tmp_path, command):
    pytest.importorskip("ray")
    address = f"127.0.0.1:{_closed_port()}"
    argv = [command, "default", *SETS, "--set", "workload.synthetic.num_requests=30", "--policies", "sglang"]
    if command == "sweep":
        argv += ["--grid", "workload.synthetic.rate_per_s=2"]
    argv += ["--backend", "ray", "--ray-address", address, "--out", str(tmp_path / "out")]
    proc = subprocess.run(
        [sys.executable, "-m", "pulseinfer", *argv], cwd=REPO, capture_output=True, text=True, timeout=HANG_S
    )
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith("error: --ray-address") and address in err[0] and "expected" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_malformed_ray_address_is_refused():
    pytest.importorskip("ray")
    from study.executors import ExecutorError, check_backend

    with pytest.raises(ExecutorError, match="not a Ray address") as caught:
        check_backend("ray", 1, "headnode")
    assert caught.value.field == "ray_address"


def _big_grid(n: int) -> list[str]:
    return ["--grid", "workload.synthetic.rate_per_s=" + ",".join(str(i + 1) for i in range(n))]


def test_a_big_sweep_is_refused_at_once_without_yes(tmp_path, capsys, monkeypatch):
    import study.sweep as sweep

    monkeypatch.setattr(sweep, "resolve_points", _never)  # refused before its points are resolved
    out = tmp_path / "out"
    argv = ["sweep", "default", *SETS, "--set", "workload.synthetic.num_requests=30", *_big_grid(501)]
    assert main([*argv, "--policies", "sglang", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "501 points" in err[0] and "--yes" in err[0], err
    assert not out.exists()


def test_yes_runs_a_big_sweep_after_announcing_it(tmp_path, capsys, monkeypatch):
    import study.sweep as sweep

    monkeypatch.setattr(sweep, "resolve_points", lambda cfg: [])  # past the size check: let through (no points)
    monkeypatch.setattr(sweep, "run_sweep", _stop_here)  # about to simulate: announced by now
    argv = ["sweep", "default", *SETS, "--set", "workload.synthetic.num_requests=30", *_big_grid(501)]
    with pytest.raises(_Reached):
        main([*argv, "--policies", "sglang", "--out", str(tmp_path / "out"), "--yes", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sweep: 501 points (501 grid values × 1 policy × 1 seed)"), err


def test_a_big_search_is_refused_without_yes(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    argv = ["search", "default", *SETS, "--set", "workload.synthetic.num_requests=30", "--space", str(space)]
    assert main([*argv, "--trials", "501", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "501 trials" in err[0] and "--yes" in err[0], err
    assert not (tmp_path / "out").exists()


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pace(monkeypatch, yes: bool, per_task: int = 1):
    import pulseinfer.bigrun as bigrun

    clock = _Clock()
    monkeypatch.setattr(bigrun.time, "monotonic", clock)
    return bigrun.Pace("sweep", "point", 200, jobs=2, yes=yes, per_task=per_task), clock


def _feed(pace, clock, events: list[tuple[float, int]]) -> None:
    """(seconds since start, units done) in order; the first is the baseline."""
    start = clock.now
    for at, done in events:
        clock.now = start + at
        pace.update(done)


def test_pace_measures_after_the_first_wave_and_stops_a_long_run_without_yes(monkeypatch, capsys):
    from pulseinfer.errors import UsageError

    pace, clock = _pace(monkeypatch, yes=False)
    # 2 workers, 10 s a point after 3 s of start-up: points finish at 13, 13, 23, 23, ...
    with pytest.raises(UsageError, match=r"roughly 17 min .*10 s a point on 2 jobs.* needs --yes.*4 finished are kept"):
        _feed(pace, clock, [(0, 0), (13, 1), (13, 2), (23, 3), (23, 4)])
    assert pace.estimate_s == pytest.approx(23 + 196 / 0.2)  # exactly: the remaining 196 points at 2 per 10 s
    assert capsys.readouterr().err == ""


def test_pace_with_yes_announces_the_estimate_once_and_a_short_run_says_nothing(monkeypatch, capsys):
    pace, clock = _pace(monkeypatch, yes=True, per_task=2)  # tasks of 2 points: the first wave is 4
    _feed(pace, clock, [(0, 10), (13, 12), (13, 14), (23, 16), (23, 18), (33, 20)])
    # 4 points a 10 s wave after the first: 0.4 points/s, 182 of the 190 left at 23 s
    assert capsys.readouterr().err == "sweep: roughly 8 min in all (5 s a point on 2 jobs, measured on the first 8)\n"
    quick, clock = _pace(monkeypatch, yes=False)
    _feed(quick, clock, [(0, 0), (1, 1), (1, 2), (1.2, 4)])
    assert quick.estimate_s is not None and quick.estimate_s < 60
    assert capsys.readouterr().err == ""


def test_a_sweep_measured_too_long_stops_keeping_its_points_and_yes_runs_the_rest(tmp_path, capsys, monkeypatch):
    import pulseinfer.bigrun as bigrun

    monkeypatch.setattr(bigrun, "CONFIRM_S", 1e-6)  # every measured run is "too long"
    argv = ["sweep", "default", *SETS, "--set", "workload.synthetic.num_requests=8", "--no-progress"]
    argv += ["--grid", "workload.synthetic.rate_per_s=1,2,3,4,5,6", "--policies", "sglang", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: sweep: roughly") and "--yes" in err[0], err
    kept = len(list((tmp_path / "cache").glob("*/*.json")))
    assert 2 <= kept < 6  # measured on the first two points, stopped before the rest
    assert main([*argv, "--yes"]) == 0
    assert f"6 points ({6 - kept} simulated, {kept} from the cache)" in capsys.readouterr().out


class _Reached(Exception):
    pass


def _never(*args, **kwargs):
    raise AssertionError("resolve_points ran before the size check")


def _stop_here(*args, **kwargs):
    raise _Reached


@pytest.mark.parametrize(
    "content, problem",
    [
        ("[1, 2]", "is an array"),
        ("42", "is a number"),
        ('{"metrics": {}, "error": ""}', "lacks the metric"),
        ('{"error": ""}', "has no metrics object"),
        ("{not json", "is not valid JSON"),
    ],
)
def test_a_damaged_cache_record_is_reported_and_recomputed(tmp_path, capsys, content, problem):
    argv = ["sweep", "default", *SETS, "--set", "workload.synthetic.num_requests=8", "--no-progress"]
    argv += ["--grid", "workload.synthetic.rate_per_s=2", "--policies", "sglang", "--out", str(tmp_path)]
    assert main(argv) == 0
    first = (tmp_path / "sweep.csv").read_text()
    (record,) = (tmp_path / "cache").glob("*/*.json")
    good = json.loads(record.read_text())
    record.write_text(content)
    capsys.readouterr()
    assert main(argv) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(record) in warnings[0] and problem in warnings[0], captured.err
    assert "Traceback" not in captured.err and "1 simulated, 0 from the cache" in captured.out
    assert json.loads(record.read_text()) == good
    assert (tmp_path / "sweep.csv").read_text() == first
