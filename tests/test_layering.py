"""Layering: the simulator and the traces package never import torch, the engine, calibration or plots.

The simulator must run on a machine without torch .
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "engine", "calibrate", "plots")
LAYERED_PACKAGES = ("sim", "traces")


def _imported_modules(tree: ast.AST) -> set[str]:
    """Top-level names of every absolute import in a module (``import a.b`` and ``from a.b import c`` give ``a``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _python_files() -> list[Path]:
    return sorted(p for pkg in LAYERED_PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_imported_modules_finds_nested_and_from_imports():
    tree = ast.parse("import os.path\nfrom torch.nn import Linear\ndef f():\n    import plots\nfrom . import x\n")
    assert _imported_modules(tree) == {"os", "torch", "plots"}


def test_importing_sim_and_traces_loads_no_forbidden_module():
    code = (
        "import json, sys\n"
        "import sim, sim.run, sim.serving.replica, traces\n"
        f"print(json.dumps(sorted(m for m in {list(FORBIDDEN)!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_layered_packages_have_python_files():
    files = _python_files()
    assert {p.relative_to(REPO).parts[0] for p in files} == set(LAYERED_PACKAGES)


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_module_does_not_import_forbidden_package(path):
    found = _imported_modules(ast.parse(path.read_text(), filename=str(path))) & set(FORBIDDEN)
    assert not found, f"{path.relative_to(REPO)} imports {sorted(found)}"


# Five short synthetic requests (as in test_cli_errors.py): the whole run takes well under a second.
TINY_SETS = [
    "--set", "workload.trace=null", "--set", "workload.synthetic.num_requests=5",
    "--set", "workload.synthetic.rate_per_s=10", "--set", "workload.synthetic.prompt_tokens_mean=1000",
    "--set", "workload.synthetic.output_tokens_mean=20",
]  # fmt: skip


def _loaded_after_cli(argv: list[str], watched: tuple[str, ...]) -> tuple[int, list[str]]:
    """Run ``pulseinfer.cli.main(argv)`` in a fresh process; its exit status and which ``watched`` it loaded."""
    code = (
        "import json, sys\n"
        "from pulseinfer.cli import main\n"
        f"code = main({argv!r})\n"
        f"print(json.dumps([code, sorted(m for m in {list(watched)!r} if m in sys.modules)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    code, loaded = json.loads(proc.stdout.splitlines()[-1])
    return code, loaded


def test_simulate_command_never_loads_torch(tmp_path):
    argv = ["simulate", *TINY_SETS, "--out", str(tmp_path / "out"), "--no-progress"]
    assert _loaded_after_cli(argv, FORBIDDEN) == (0, [])


def test_simulate_command_error_path_never_loads_torch(tmp_path):
    argv = ["simulate", "--set", "workload.time_scal=2", "--out", str(tmp_path / "out"), "--no-progress"]
    assert _loaded_after_cli(argv, FORBIDDEN) == (2, [])


@pytest.mark.parametrize("trace", ["azure_code_2023", "/nonexistent.jsonl"], ids=["shipped", "missing"])
def test_trace_command_never_loads_the_simulator(trace):
    code, loaded = _loaded_after_cli(["trace", "stats", trace], ("sim", *FORBIDDEN))
    assert code == (0 if trace == "azure_code_2023" else 2)
    assert loaded == []
