"""The recall benchmark's table and the ``pulseinfer engine-bench`` command (tiny settings: seconds, not minutes)."""

from __future__ import annotations

import csv

import pytest

torch = pytest.importorskip("torch")

from calibrate import bench_recall as bench  # noqa: E402
from calibrate.bench_recall import BENCH_COLUMNS, BenchSettings, format_table, run_bench  # noqa: E402
from pulseinfer.cli import main  # noqa: E402

TINY = BenchSettings(
    fragment_bytes=(4 << 10, 8 << 10), recall_bytes=64 << 10, host_pool_bytes=1 << 20, plain_copy_bytes=1 << 20,
    repeats=2,
)  # fmt: skip


def test_bench_reports_every_mode_and_size():
    results = run_bench(TINY)
    assert list(results.columns) == BENCH_COLUMNS
    assert sorted(results["mode"].unique()) == ["gather_scatter", "per_fragment", "plain_copy"]
    rows = results[results["mode"] == "per_fragment"]
    assert rows["fragment_bytes"].tolist() == [4096, 8192] and rows["num_fragments"].tolist() == [16, 8]
    assert bool((results["gbps"] > 0).all())
    assert "gs/pf" in format_table(results)


def test_bench_settings_reject_fragments_that_are_not_whole_tokens():
    with pytest.raises(ValueError, match="fragment_bytes 1000 must be a positive multiple of 512"):
        BenchSettings(fragment_bytes=(1000,))


def test_engine_bench_command_writes_the_csv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "quick_settings", lambda device: TINY)
    assert main(["engine-bench", "--quick", "--out", str(tmp_path), "--threads", "1"]) == 0
    with open(tmp_path / "engine_bench.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == BENCH_COLUMNS
    assert "standing in for device memory" in capsys.readouterr().out


def test_engine_bench_command_rejects_a_file_as_out(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["engine-bench", "--out", str(target)]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bench_runs_and_reports_every_mode():
    settings = BenchSettings(
        fragment_bytes=(8 << 10,), recall_bytes=256 << 10, host_pool_bytes=4 << 20, plain_copy_bytes=4 << 20,
        repeats=2, device="cuda",
    )  # fmt: skip
    results = run_bench(settings)
    assert list(results.columns) == BENCH_COLUMNS and len(results) == 3
