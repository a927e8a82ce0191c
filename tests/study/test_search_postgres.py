"""`pulseinfer search --storage postgresql+psycopg://...` on a throw-away PostgreSQL server: two worker processes
fill one study, a rerun resumes it, and no trial is lost or run twice.

The server: initdb + pg_ctl in a temp folder, trust authentication, TCP on a free port of 127.0.0.1, its unix socket
in the same folder, fsync off; stopped and deleted at the end. PostgreSQL refuses to run as root, so as root the
server runs as the ``postgres`` user the Debian package creates (or a ``pulseinfer-pg`` system user made here).
Skipped only when the server binaries are absent (`apt-get install postgresql`; .ci/run installs them and sets
PULSEINFER_CI=1, under which their absence fails instead).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from pulseinfer.cli import main

from .conftest import TINY

INITDB = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or [shutil.which("initdb")]
if INITDB[-1] is None:
    if os.environ.get("PULSEINFER_CI"):  # .ci/run installs the server: there, a missing one is a failure
        pytest.fail("PostgreSQL server binaries (initdb) not found under PULSEINFER_CI", pytrace=False)
    pytest.skip(
        "PostgreSQL server binaries not found (apt-get install postgresql; .ci/run does)", allow_module_level=True
    )
SERVER_USER = "pulseinfer-pg"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runner(base: Path) -> list[str]:
    """Command prefix running the server tools as a non-root user (nothing when we are not root)."""
    if os.geteuid() != 0:
        return []
    try:
        user = pwd.getpwnam("postgres").pw_name
    except KeyError:
        try:
            user = pwd.getpwnam(SERVER_USER).pw_name
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", SERVER_USER], check=True)
            user = SERVER_USER
    shutil.chown(base, user)
    return ["runuser", "-u", user, "--"]


@pytest.fixture(scope="module")
def postgres_url():
    bin_dir = Path(INITDB[-1]).parent
    base = Path(tempfile.mkdtemp(prefix="pulseinfer-pg-"))
    data, port = base / "data", _free_port()
    run_as = _runner(base)

    def tool(*args: str) -> None:
        subprocess.run([*run_as, *args], check=True, capture_output=True, timeout=120)

    tool(str(bin_dir / "initdb"), "-D", str(data), "-U", "pulseinfer", "--auth=trust", "-E", "UTF8", "--no-sync")
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
    tool(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(base / "server.log"), "-w", "start")
    try:
        yield f"postgresql+psycopg://pulseinfer@127.0.0.1:{port}/postgres"
    finally:
        tool(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def _search(space: Path, url: str, out: Path, trials: int) -> int:
    sets = [item for o in TINY for item in ("--set", o)]
    argv = ["search", "default", "--space", str(space), "--slo", "tpot_p99_ms=60", "--trials", str(trials)]
    argv += ["--jobs", "2", "--storage", url, "--study", "pg", "--out", str(out), "--no-progress", *sets]
    return main(argv)


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="pg", storage=optuna.storages.RDBStorage(url)).get_trials(deepcopy=False)


def test_two_workers_fill_a_postgres_study_and_a_rerun_resumes_it(postgres_url, tmp_path, capsys):
    space = tmp_path / "space.yaml"
    params = {
        "policy.pulseinfer.budget_tokens": {"low": 512, "high": 2048, "step": 512},
        "policy.pulseinfer.max_running_requests": {"choices": [2, 8, 64]},
    }
    space.write_text(yaml.safe_dump({"params": params}))
    assert _search(space, postgres_url, tmp_path / "out", 6) == 0
    first = _trials(postgres_url)
    assert sorted(t.number for t in first) == list(range(6))  # nothing lost, nothing extra
    assert all(t.state.is_finished() for t in first)
    assert all("metrics" in t.user_attrs or "error" in t.user_attrs for t in first)

    assert _search(space, postgres_url, tmp_path / "out", 10) == 0  # resume: four more
    second = _trials(postgres_url)
    assert sorted(t.number for t in second) == list(range(10))
    assert all(t.state.is_finished() for t in second)
    before = {t.number: (t.params, t.datetime_start, t.values) for t in first}
    assert {t.number: (t.params, t.datetime_start, t.values) for t in second if t.number < 6} == before
    table = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert sorted(table["trial"]) == list(range(10))

    assert _search(space, postgres_url, tmp_path / "out", 10) == 0  # full: runs nothing
    assert len(_trials(postgres_url)) == 10
    assert "study pg: 10 trials" in capsys.readouterr().out
