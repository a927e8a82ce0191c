"""`pulseinfer sweep` end to end: files written, the cache reused, --compare's heatmap, one-line input errors."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from pulseinfer.cli import main

TINY = [
    "workload.trace=null",
    "workload.time_scale=1",
    "workload.synthetic.num_requests=8",
    "workload.synthetic.rate_per_s=4",
    "workload.synthetic.prompt_tokens_mean=12000",
    "workload.synthetic.output_tokens_mean=20",
    "serving.prefill=colocated",
    "run.progress=false",
]
SETS = [item for o in TINY for item in ("--set", o)]
GRIDS = ["--grid", "workload.synthetic.prompt_tokens_mean=8000,16000", "--grid", "workload.synthetic.rate_per_s=2,8"]


def test_sweep_writes_table_comparison_and_heatmap_then_reuses_the_cache(tmp_path, capsys):
    argv = ["sweep", "default", *SETS, *GRIDS, "--policies", "sglang,pulseinfer", "--slo", "tpot_p99_ms=60"]
    argv += ["--compare", "pulseinfer/sglang", "--metric", "throughput", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    assert "8 points (8 simulated, 0 from the cache)" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert len(table) == 8 and {"slo_met", "kl_nats", "decode_tokens_per_s"} <= set(table.columns)
    cells = pd.read_csv(tmp_path / "compare.csv")
    assert len(cells) == 4 and "ratio" in cells.columns
    assert (tmp_path / "compare_decode_tokens_per_s.png").stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sweep-")]  # the temp folder is gone
    assert main(argv) == 0
    assert "8 points (0 simulated, 8 from the cache)" in capsys.readouterr().out
    assert main(argv[: argv.index("--compare")] + ["--out", str(tmp_path), "--no-progress"]) == 0  # no --compare
    assert not (tmp_path / "compare.csv").exists() and not list(tmp_path.glob("compare_*.png"))  # not this run's


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--grid", "nokey"], "--grid"),
        (["--grid", "workload.synthetic.rate_per_s=1,2", "--compare", "a-b"], "--compare"),
        (["--grid", "workload.synthetic.rate_per_s=1,2", "--compare", "pulseinfer/sglang"], "--compare"),
        (["--grid", "workload.synthetic.rate_per_s=1,2", "--seeds", "0"], "--seeds"),
        (["--grid", "workload.synthetic.rate_per_s=1,2", "--jobs", "0"], "--jobs"),
        (["--grid", "workload.synthetic.rate_per_s=1,2", "--ray-address", "auto"], "--ray-address"),
        (["--grid", "workload.synthetic.rate_per_s=1,-2"], "workload.synthetic.rate_per_s"),
        (["--grid", "workload.synthetic.rate_per_s=1,2", "--slo", "kl_nats=0.01"], "not extrapolated"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, capsys, extra, flag):
    code = main(["sweep", "default", *SETS, "--policies", "sglang,pulseinfer", *extra, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and flag in err[0], err


def test_the_local_backend_never_imports_ray(tmp_path):
    code = (
        "import sys; from pulseinfer.cli import main; "
        f"rc = main(['sweep', 'default', *{SETS!r}, '--grid', 'workload.synthetic.rate_per_s=2', "
        f"'--policies', 'sglang', '--out', {str(tmp_path)!r}, '--no-progress']); "
        "print(rc, 'ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 False"
