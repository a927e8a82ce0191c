"""Result folders are written whole: staged beside --out, moved into place when complete; a re-run replaces the
folder; an error or Ctrl-C leaves the previous folder exactly as it was; --out is checked before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim.run
from pulseinfer.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, main
from pulseinfer.outdir import MARKER, results_folder

TINY = [
    "workload.trace=null",
    "workload.synthetic.num_requests=4",
    "workload.synthetic.rate_per_s=10",
    "workload.synthetic.prompt_tokens_mean=1000",
    "workload.synthetic.output_tokens_mean=10",
]


def _simulate(out: Path, *extra: str) -> list[str]:
    return ["simulate", "--no-progress", "--out", str(out), *[a for o in TINY for a in ("--set", o)], *extra]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def test_rerun_replaces_the_whole_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    (out / "stale_figure.png").write_bytes(b"from an earlier run")
    assert main(_simulate(out, "--set", "seed=3")) == 0
    assert not (out / "stale_figure.png").exists() and (out / MARKER).is_file()
    assert "seed: 3" in (out / "scenario.yaml").read_text()
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_interrupt_or_error_mid_run_leaves_the_previous_folder_untouched(tmp_path, capsys, monkeypatch, error):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    before = _snapshot(out)

    def write_half(self, out_dir: Path) -> None:
        self.summary.to_csv(out_dir / "summary.csv", index=False)  # part of the tables, then the failure
        raise error()

    monkeypatch.setattr(sim.run.SimResult, "write", write_half)
    capsys.readouterr()
    if error is KeyboardInterrupt:
        assert main(_simulate(out, "--set", "seed=5")) == EXIT_INTERRUPTED
        assert capsys.readouterr().err == "interrupted\n"
    else:
        with pytest.raises(RuntimeError):
            main(_simulate(out, "--set", "seed=5"))
    assert _snapshot(out) == before and _leftovers(tmp_path) == []


def test_unwritable_out_is_refused_before_simulating(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sim.run, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(_simulate(blocker / "out")) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(blocker) in err
    assert "--out" in err and "is a file" in err  # names the flag, not the staging folder


def test_summary_only_with_plots_is_refused(tmp_path, capsys):
    assert main(_simulate(tmp_path / "out", "--summary-only", "--plots")) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plots" in err and "--summary-only" in err
    assert not (tmp_path / "out").exists()


def test_foreign_non_empty_folder_is_refused_not_deleted(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sim.run, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    (tmp_path / "notes.txt").write_text("mine")
    assert main(_simulate(tmp_path)) == EXIT_BAD_INPUT
    assert "was not written by pulseinfer" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_update_mode_keeps_the_existing_files(tmp_path):
    out = tmp_path / "calib"
    out.mkdir()
    (out / "profile.yaml").write_text("name: p\n")
    with results_folder(out, update=True) as stage:
        (stage / "selection.csv").write_text("a\n")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "profile.yaml", "selection.csv"]
