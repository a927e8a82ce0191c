"""Results folders of every kind, written once per test session by the real commands on tiny inputs (with
``--report``), for the report page's tests: tests/page/test_report_page.py reads their HTML, test_report_browser.py
opens them in Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulseinfer.cli import main

MEASURED = Path(__file__).resolve().parents[1] / "traces" / "fixtures" / "measured" / "sglang_bench_serving.jsonl"
SERVER = ["--set", "model=llama-3.1-8b", "--set", "hardware=h100-sxm", "--set", "serving.prefill=colocated"]
TINY = [
    "workload.trace=null",
    "workload.synthetic.num_requests=24",
    "workload.synthetic.rate_per_s=4",
    "workload.synthetic.prompt_tokens_mean=4000",
    "workload.synthetic.output_tokens_mean=30",
]
SETS = [arg for item in TINY for arg in ("--set", item)]

# kind → the command line that writes it (``--out`` and ``--report`` added)
COMMANDS = {
    "simulate": ["simulate", *SETS, "--no-progress"],
    "fleet": ["simulate", *SETS, "--set", "serving.replicas=2", "--set", "policies=sglang,pulseinfer", "--no-progress"],
    "plan": [
        "plan", *SETS, "--set", "workload.synthetic.num_requests=40", "--slo", "tpot_p99_ms=50", "--hardware",
        "h100-sxm,h200", "--policies", "sglang,pulseinfer", "--target-rate", "3", "--max-requests", "20",
        "--gpu-hour-usd", "h100-sxm=2.5,h200=3.5", "--no-progress",
    ],
    "sweep": [
        "sweep", "default", *SETS, "--grid", "workload.synthetic.rate_per_s=2,6", "--grid",
        "policy.pulseinfer.budget_tokens=1024,2048", "--policies", "sglang,pulseinfer", "--compare",
        "pulseinfer/sglang", "--no-progress",
    ],
    "search": ["search", "default", *SETS, "--space", "pulseinfer", "--trials", "4", "--slo", "tpot_p99_ms=60",
               "--no-progress"],
    "validate": ["validate", "--measured", str(MEASURED), *SERVER],
    "calibrate": ["calibrate", "--from-measured", str(MEASURED), *SERVER, "--iterations", "2", "--force"],
    "cases": ["cases", "--only", "h100_copy_cost,nvbandwidth_d2h_gen5", "--no-progress"],
}  # fmt: skip


@pytest.fixture(scope="session")
def report_folders(tmp_path_factory) -> dict[str, Path]:
    """kind → a results folder its command wrote with ``--report`` (each command must exit 0)."""
    root = tmp_path_factory.mktemp("reports")
    folders = {}
    for kind, argv in COMMANDS.items():
        out = root / kind
        status = main([*argv, "--out", str(out), "--report"])
        assert status == 0, f"{kind}: {' '.join(argv)} exited {status}"
        folders[kind] = out
    return folders
