"""Result folders are written whole: staged beside --out, moved into place when complete; a re-run replaces what
the previous run wrote and carries the user's files over; an error or Ctrl-C leaves the previous folder exactly as
it was; --out is checked before any work; a folder pulseinfer did not write is refused, not deleted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import pulseinfer.tables_io
import sim.run
from pulseinfer.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, main
from pulseinfer.errors import UsageError
from pulseinfer.in_place import mark_results
from pulseinfer.marker import Claims, write_marker
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


def _listed(folder: Path) -> set[str]:
    return set(json.loads((folder / MARKER).read_text())["files"])


def _refused(argv: list[str], folder: Path, capsys) -> None:
    """The command exits 2 with one error line naming ``folder`` and leaves it exactly as it was."""
    before = _snapshot(folder)
    capsys.readouterr()
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(folder) in err
    assert _snapshot(folder) == before and _leftovers(folder.parent) == []


def test_rerun_replaces_what_the_previous_run_wrote(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    first = _listed(out)
    assert first == {p.name for p in out.iterdir()} - {MARKER} and any(n.startswith("steps.") for n in first)
    assert main(_simulate(out, "--set", "seed=3", "--summary-only")) == 0  # writes fewer tables
    assert {p.name for p in out.iterdir()} == _listed(out) | {MARKER}  # the first run's steps table is gone
    assert not any(n.startswith("steps.") for n in _listed(out))
    assert "seed: 3" in (out / "scenario.yaml").read_text()
    assert _leftovers(tmp_path) == []


def test_rerun_carries_the_users_files_over_untouched(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    (out / "my_notes").mkdir()
    (out / "my_notes" / "analysis.txt").write_text("mine")
    (out / "notes.md").write_text("also mine")
    (out / "stale_figure.png").write_bytes(b"a figure of mine")
    inodes = {name: (out / name).stat().st_ino for name in ("my_notes", "notes.md", "stale_figure.png")}
    assert main(_simulate(out, "--set", "seed=3")) == 0
    assert (out / "my_notes" / "analysis.txt").read_text() == "mine" and (out / "notes.md").read_text() == "also mine"
    assert (out / "stale_figure.png").read_bytes() == b"a figure of mine"
    assert {name: (out / name).stat().st_ino for name in inodes} == inodes  # moved, not copied
    assert "notes.md" not in _listed(out) and "seed: 3" in (out / "scenario.yaml").read_text()
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "names",
    [["wedding_001.png", "wedding_002.png"], ["fig3.pdf", "fig4.svg"]],
    ids=["photos", "figures"],
)
def test_a_folder_of_images_is_refused_and_left_intact(tmp_path, capsys, monkeypatch, names):
    monkeypatch.setattr(sim.run, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    folder = tmp_path / "pictures"
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(name.encode())
    _refused(_simulate(folder), folder, capsys)
    (tmp_path / "results").mkdir()
    _refused(["plot", str(tmp_path / "results"), "--out", str(folder)], folder, capsys)


def test_a_subfolder_of_a_results_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    (out / "my_notes").mkdir()
    (out / "my_notes" / "analysis.txt").write_text("mine")
    _refused(_simulate(out / "my_notes"), out / "my_notes", capsys)


@pytest.mark.parametrize("name", ["../../x", "a/b", "a\\b", ".hidden", "x" * 101])
def test_a_scenario_name_is_a_name_not_a_path(tmp_path, capsys, monkeypatch, name):
    cwd = tmp_path / "deep" / "er"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    argv = _simulate(Path("unused"), "--set", f"name={name}")
    del argv[argv.index("--out") : argv.index("--out") + 2]  # the default folder, results/<name>
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: name: ") and err.count("\n") == 1 and repr(name)[:30] in err
    (tmp_path / "s.yaml").write_text(f"name: '{name}'\nmodel: qwen3-14b\nhardware: h200\n")  # the same from a file
    assert main(["simulate", str(tmp_path / "s.yaml")]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("error: name: ")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["deep", "deep/er", "s.yaml"]


@pytest.mark.parametrize("umask", [0o027, 0o002])
def test_results_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with results_folder(tmp_path / "out", command="simulate") as stage:
            (stage / "plots").mkdir()
            (stage / "table.csv").write_text("a\n")
    finally:
        os.umask(previous)
    out = tmp_path / "out"
    assert [(out / p).stat().st_mode & 0o777 for p in ("", "plots", "table.csv", MARKER)] == [
        0o777 & ~umask,
        0o777 & ~umask,
        0o666 & ~umask,
        0o666 & ~umask,
    ]


def test_the_marker_lists_what_the_run_wrote(tmp_path):
    with results_folder(tmp_path / "out", command="simulate") as stage:
        (stage / "plots").mkdir()
        (stage / "plots" / "tpot.png").write_bytes(b"png")
        (stage / "summary.csv").write_text("a\n")
    marker = json.loads((tmp_path / "out" / MARKER).read_text())
    assert (marker["files"], marker["folders"], marker["written_by"]) == (
        ["plots/tpot.png", "summary.csv"],
        ["plots"],
        "pulseinfer simulate",
    )


def test_a_folder_an_enclosing_results_folder_lists_may_be_replaced(tmp_path):
    out = tmp_path / "out"
    with results_folder(out, command="simulate") as stage:  # simulate --plots
        (stage / "plots").mkdir()
        (stage / "plots" / "old.png").write_bytes(b"old")
    (out / "plots" / "mine.txt").write_text("mine")
    with results_folder(out / "plots", command="plot") as stage:  # pulseinfer plot OUT
        (stage / "new.png").write_bytes(b"new")
    assert sorted(p.name for p in (out / "plots").iterdir()) == [MARKER, "mine.txt", "new.png"]
    with results_folder(out, command="simulate") as stage:  # a re-run of the enclosing folder, without figures
        (stage / "summary.csv").write_text("a\n")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [MARKER, "plots", "plots/mine.txt", "summary.csv"]


def test_a_results_folder_nested_by_the_user_survives_a_rerun(tmp_path):
    out = tmp_path / "out"
    with results_folder(out, command="simulate") as stage:
        (stage / "summary.csv").write_text("1\n")
    with results_folder(out / "exp2", command="simulate") as stage:  # pulseinfer simulate --out OUT/exp2
        (stage / "summary.csv").write_text("2\n")
    with results_folder(out, command="simulate") as stage:
        (stage / "summary.csv").write_text("3\n")
    assert (out / "exp2" / "summary.csv").read_text() == "2\n" and (out / "exp2" / MARKER).is_file()


def test_figures_of_pulseinfer_plot_give_way_to_the_same_figures_of_a_rerun(tmp_path):
    out = tmp_path / "out"
    with results_folder(out, command="simulate") as stage:
        (stage / "summary.csv").write_text("1\n")
    with results_folder(out / "plots", command="plot") as stage:  # pulseinfer plot OUT --format png,svg
        (stage / "tpot.png").write_text("plot")
        (stage / "tpot.svg").write_text("plot")
    with results_folder(out, command="simulate") as stage:  # simulate --plots
        (stage / "plots").mkdir()
        (stage / "plots" / "tpot.png").write_text("rerun")
    assert (out / "plots" / "tpot.png").read_text() == "rerun" and (out / "plots" / "tpot.svg").is_file()
    with results_folder(out / "plots", command="plot") as stage:  # both markers claim both figures
        (stage / "tpot.png").write_text("plot again")
    assert sorted(p.name for p in (out / "plots").iterdir()) == [MARKER, "tpot.png"]


def test_a_folder_of_an_earlier_version_keeps_what_it_did_not_write(tmp_path):
    out = tmp_path / "out"
    for path, text in [
        (MARKER, "written by pulseinfer simulate; a re-run replaces this whole folder\n"),
        ("summary.csv", "old"),
        ("notes.txt", "mine"),
        ("plots/tpot.png", "old"),
        ("plots/mine.txt", "mine"),
        ("cache/ab/abcd.json", "{}"),
        ("my_notes/table.csv", "mine"),
    ]:
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)
    with results_folder(out, command="simulate") as stage:
        (stage / "summary.csv").write_text("new")
    files = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file() and p.name != MARKER}
    assert files == {"summary.csv": "new", "notes.txt": "mine", "plots/mine.txt": "mine", "my_notes/table.csv": "mine"}


def test_a_run_writing_over_a_users_file_replaces_nothing(tmp_path):
    out = tmp_path / "out"
    with results_folder(out, command="simulate") as stage:
        (stage / "a.csv").write_text("a")
    (out / "b.csv").write_text("mine")
    before = _snapshot(out)
    with pytest.raises(UsageError, match=r"b\.csv was not written by pulseinfer.*nothing was replaced"):
        with results_folder(out, command="simulate") as stage:
            (stage / "b.csv").write_text("the run's")
    assert _snapshot(out) == before and _leftovers(tmp_path) == []


def test_what_cannot_be_carried_over_is_refused_before_the_run(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with results_folder(out, command="simulate") as stage:
        (stage / "a.csv").write_text("a")
    (out / "locked").mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p).name != "locked" and access(p, mode))  # tests run as root
    with pytest.raises(UsageError, match=r"locked was not written by pulseinfer and a re-run cannot carry it"):
        with results_folder(out, command="simulate"):
            pytest.fail("ran before refusing")
    assert (out / "locked").is_dir() and _leftovers(tmp_path) == []


def test_a_folder_written_in_place_is_marked_and_later_replaced(tmp_path):
    out = tmp_path / "sweep"
    mark_results(out, "sweep", files=["sweep.csv"], trees=["cache"])
    (out / "cache" / "ab").mkdir(parents=True)
    (out / "cache" / "ab" / "abcd.json").write_text("{}")
    (out / "sweep.csv").write_text("a\n")
    mark_results(out, "sweep", files=["compare.csv"], trees=["cache"])  # a second sweep adds a comparison
    (out / "compare.csv").write_text("c\n")
    (out / "notes.txt").write_text("mine")
    assert json.loads((out / MARKER).read_text())["files"] == ["compare.csv", "sweep.csv"]
    with results_folder(out, command="sweep") as stage:  # (sweep itself writes in place; the claims are the point)
        (stage / "summary.csv").write_text("s\n")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "notes.txt", "summary.csv"]


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_interrupt_or_error_mid_run_leaves_the_previous_folder_untouched(tmp_path, capsys, monkeypatch, error):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    before = _snapshot(out)

    def write_half(result, out_dir: Path) -> None:
        result.summary.to_csv(out_dir / "summary.csv", index=False)  # part of the tables, then the failure
        raise error()

    monkeypatch.setattr(pulseinfer.tables_io, "write_result", write_half)
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


def test_figures_of_pulseinfer_plot_are_marked(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    (out / "plots").mkdir()
    (out / "plots" / "mine.txt").write_text("mine")  # an empty or unmarked plots/ is the user's
    _refused(["plot", str(out)], out / "plots", capsys)
    (out / "plots" / "mine.txt").unlink()
    assert main(["plot", str(out), "--format", "svg"]) == 0  # an empty folder may be used
    figures = _listed(out / "plots")
    assert figures and all(name.endswith(".svg") for name in figures)
    (out / "plots" / "mine.txt").write_text("mine")
    assert main(["plot", str(out)]) == 0  # replaces its own figures, keeps the rest
    assert {p.name for p in (out / "plots").iterdir()} == _listed(out / "plots") | {MARKER, "mine.txt"}
    assert all(name.endswith(".png") for name in _listed(out / "plots"))


def test_foreign_non_empty_folder_is_refused_not_deleted(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sim.run, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    (tmp_path / "notes.txt").write_text("mine")
    assert main(_simulate(tmp_path)) == EXIT_BAD_INPUT
    assert "was not written by pulseinfer" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_update_mode_keeps_the_existing_files(tmp_path):
    out = tmp_path / "calib"
    out.mkdir()
    write_marker(out, "calibrate", Claims())  # a calibration folder holding a profile of the user's
    (out / "profile.yaml").write_text("name: p\n")
    with results_folder(out, command="calibrate selection", update=True) as stage:
        (stage / "selection.csv").write_text("a\n")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "profile.yaml", "selection.csv"]
    assert _listed(out) == {"selection.csv"}  # the profile, unchanged, is still the user's


def test_update_mode_replaces_a_file_the_run_changed_and_keeps_the_rest(tmp_path):
    out = tmp_path / "calib"
    out.mkdir()
    write_marker(out, "calibrate", Claims())
    (out / "profile.yaml").write_text("name: p\n")
    (out / "notes.txt").write_text("mine")
    (out / "raw").mkdir()
    inode = (out / "notes.txt").stat().st_ino
    with results_folder(out, command="calibrate", update=True) as stage:
        assert (stage / "profile.yaml").read_text() == "name: p\n"  # the command reads what is there
        (stage / "profile.yaml").write_text("name: p\nrecall_stats: {}\n")
        (out / "notes.txt").write_text("edited during the run")
    assert (out / "profile.yaml").read_text().endswith("recall_stats: {}\n") and (out / "raw").is_dir()
    assert (out / "notes.txt").read_text() == "edited during the run" and (out / "notes.txt").stat().st_ino == inode
    assert _listed(out) == {"profile.yaml"}
    assert _leftovers(tmp_path) == []


def test_a_signal_during_the_renames_is_delivered_after_them():
    import os
    import signal

    from workers import signals_held

    delivered: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: delivered.append("handler"))
    try:
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            delivered.append("end of block")  # the block runs to its end: the signal waits
        delivered.append("after")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert delivered == ["end of block", "handler", "after"]


# A results folder is replaced only by a re-run of the command that wrote it (its marker's written_by).


def _sweep_folder(out: Path) -> None:
    """What `pulseinfer sweep --out OUT` leaves: a marked folder with its cache and table."""
    mark_results(out, "sweep", files=["sweep.csv"], trees=["cache"])
    (out / "cache" / "ab").mkdir(parents=True)
    (out / "cache" / "ab" / "abcd.json").write_text("{}")
    (out / "sweep.csv").write_text("a\n")


def _search_folder(out: Path) -> None:
    mark_results(out, "search", files=["trials.csv", "study.journal"])
    (out / "study.journal").write_text("{}\n")
    (out / "trials.csv").write_text("trial\n0\n")


def test_plot_into_the_results_folder_it_reads_is_refused(tmp_path, capsys):
    r8 = tmp_path / "r8"
    assert main(_simulate(r8)) == 0
    _refused(["plot", str(r8), "--out", str(r8)], r8, capsys)
    r9 = tmp_path / "r9"
    assert main(_simulate(r9)) == 0
    _refused(["plot", str(r8), "--out", str(r9)], r9, capsys)  # another simulate's tables
    assert "`pulseinfer simulate`" in _refusal(["plot", str(r8), "--out", str(r9)], capsys)


def _refusal(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == EXIT_BAD_INPUT
    return capsys.readouterr().err


@pytest.mark.parametrize("make, writer", [(_sweep_folder, "sweep"), (_search_folder, "search")])
def test_a_folder_another_command_wrote_is_refused_naming_it(tmp_path, capsys, monkeypatch, make, writer):
    monkeypatch.setattr(sim.run, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    out = tmp_path / "study"
    make(out)
    _refused(_simulate(out), out, capsys)
    assert f"`pulseinfer {writer}`" in _refusal(_simulate(out), capsys)
    (tmp_path / "results").mkdir()
    _refused(["plot", str(tmp_path / "results"), "--out", str(out)], out, capsys)
    with pytest.raises(UsageError, match=f"pulseinfer {writer}"):  # also through the library call
        with results_folder(out, command="plan"):
            pytest.fail("ran before refusing")
    with pytest.raises(UsageError, match=f"pulseinfer {writer}"):  # and for a command that writes in place
        mark_results(out, "cases", files=["cases.csv"])


def test_a_sweep_into_a_simulate_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_simulate(out)) == 0
    argv = ["sweep", "default", *[a for o in TINY for a in ("--set", o)], "--no-progress"]
    argv += ["--grid", "workload.synthetic.rate_per_s=5", "--policies", "sglang", "--out", str(out)]
    _refused(argv, out, capsys)


def test_a_folder_inside_another_commands_results_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    with results_folder(out, command="simulate") as stage:  # simulate --plots
        (stage / "plots").mkdir()
        (stage / "plots" / "tpot.png").write_bytes(b"png")
    _refused(_simulate(out / "plots"), out / "plots", capsys)  # plot's figure folder, not simulate's
    sweep = tmp_path / "sweep"
    _sweep_folder(sweep)
    _refused(["plot", str(out), "--out", str(sweep / "cache")], sweep / "cache", capsys)
    _refused(["plot", str(out), "--out", str(sweep / "cache" / "ab")], sweep / "cache" / "ab", capsys)


def test_update_mode_refuses_a_folder_pulseinfer_did_not_write(tmp_path):
    for name, files in [("ud2", {"compute.csv": "x", "notes.txt": "notes"}), ("ud5", {"profile.yaml": "name: mine"})]:
        out = tmp_path / name
        out.mkdir()
        for file, text in files.items():
            (out / file).write_text(text)
        for command in ("calibrate", "calibrate selection"):
            with pytest.raises(UsageError, match=f"{out}: folder exists, is not empty and was not written"):
                with results_folder(out, command=command, update=True):
                    pytest.fail("ran before refusing")
            assert _snapshot(out) == {file: text.encode() for file, text in files.items()}
    assert _leftovers(tmp_path) == []
    with pytest.raises(UsageError, match="pulseinfer simulate"):  # a simulate folder is not a calibration
        mark_results(tmp_path / "sim", "simulate")
        with results_folder(tmp_path / "sim", command="calibrate", update=True):
            pytest.fail("ran before refusing")


@pytest.mark.parametrize(
    "argv", [["calibrate", "--device", "cpu", "--quick", "--out"], ["calibrate", "selection", "--out"]]
)
def test_calibrate_refuses_a_users_folder_before_measuring(tmp_path, capsys, argv):
    pytest.importorskip("torch")
    out = tmp_path / "ud"
    out.mkdir()
    (out / "compute.csv").write_text("x")
    (out / "profile.yaml").write_text("name: mine\n")
    _refused([*argv, str(out)], out, capsys)


def test_calibrate_selection_may_add_to_a_calibrate_folder():
    from pulseinfer.outdir import same_command

    assert same_command("pulseinfer calibrate", "calibrate selection")
    assert same_command("pulseinfer calibrate selection", "calibrate")
    assert not same_command("pulseinfer simulate", "plot") and not same_command("", "simulate")


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-folder", "dangling"])
def test_a_symbolic_link_as_out_is_refused_and_left_as_it_is(tmp_path, capsys, monkeypatch, dangling):
    monkeypatch.setattr(sim.run, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    store = tmp_path / "proj" / "store"
    if not dangling:
        store.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(store)
    err = _refusal(_simulate(link), capsys)
    assert err.startswith(f"error: --out {link}: is a symbolic link to {store}") and err.count("\n") == 1
    assert ("does not exist" in err) == dangling
    assert link.is_symlink() and os.readlink(link) == str(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", *([] if dangling else ["proj"])]
    if not dangling:
        assert list(store.iterdir()) == []


def test_files_written_into_the_old_folder_during_the_renames_leave_no_old_folder(tmp_path, capsys, monkeypatch):
    import pulseinfer.outdir as outdir

    out = tmp_path / "out"
    with results_folder(out, command="simulate") as stage:
        (stage / "a.csv").write_text("old")
    clear = outdir._clear

    def late_writer(old: Path, new: Path, claims) -> None:  # a user's file lands in the old folder meanwhile
        (old / "previous" / "b.csv").write_text("mine")
        clear(old, new, claims)

    monkeypatch.setattr(outdir, "_clear", late_writer)
    with results_folder(out, command="simulate") as stage:
        (stage / "a.csv").write_text("new")
        (stage / "b.csv").write_text("the run's")
    (kept,) = out.glob("kept-*")
    assert (kept / "b.csv").read_text() == "mine" and (out / "b.csv").read_text() == "the run's"
    assert _leftovers(tmp_path) == [] and str(kept) in capsys.readouterr().err


def test_a_failed_run_leaves_no_parent_folder_it_created(tmp_path, capsys, monkeypatch):
    def fail(result, out_dir: Path) -> None:
        raise RuntimeError("the run failed")

    monkeypatch.setattr(pulseinfer.tables_io, "write_result", fail)
    with pytest.raises(RuntimeError):
        main(_simulate(tmp_path / "a" / "b" / "out"))
    assert list(tmp_path.iterdir()) == []


def test_a_search_refused_at_storage_or_out_creates_nothing(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  policy.pulseinfer.budget_tokens: {low: 512, high: 2048, step: 512}\n")
    argv = ["search", "default", *[a for o in TINY for a in ("--set", o)], "--space", str(space), "--trials", "2"]
    bad = f"sqlite:///{tmp_path / 'no_such_folder' / 'study.db'}"
    err = _refusal([*argv, "--storage", bad, "--out", str(tmp_path / "deep" / "s1")], capsys)
    assert err.startswith("error: --storage") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")  # a folder of the user's is not resumed, nor marked
    _refused([*argv, "--out", str(mine)], mine, capsys)
