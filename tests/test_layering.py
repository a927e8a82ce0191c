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
