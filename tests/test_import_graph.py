"""The project's import graph, read from the source with ``ast``: no cycles, and imports point one way.

Edges are every absolute or relative import in a module, including imports inside functions (a lazy import
is still a dependency) and imports under ``if TYPE_CHECKING:`` (they never run, but a module that names another's
types in its annotations depends on it: two modules that do so both ways are one concept split in two, or an
ownership turned around). ``from a.b import
c`` is an edge to ``a.b.c`` when that is a module of the project, else to ``a.b``. Importing ``a.b.c`` also runs
the ``__init__`` of ``a`` and ``a.b``, but that is not counted as an edge of the importer (the packages'
``__init__`` files re-export, they do not depend on their users).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "study", "workers", "traces", "engine", "calibrate", "plots", "pulseinfer", "scenarios")
STUDY = "study"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Dotted names a module imports (absolute; relative ones resolved against ``module``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{alias.name}" for alias in node.names)
            found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        raw = _imports(ast.parse(path.read_text(), filename=str(path)), name, path.name == "__init__.py")
        # `from pkg import name` gives both `pkg.name` and `pkg`; only project modules are nodes
        graph[name] = {target for target in raw if target in modules} - {name}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    color: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        color[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if color.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in color:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        color[node] = 2
        return None

    for node in sorted(graph):
        if node not in color:
            found = dfs(node)
            if found:
                return found
    return None


def test_find_cycle_reports_a_cycle_and_accepts_a_dag():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_count_type_checking_and_lazy_imports_and_resolve_relative_imports():
    src = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.y\nfrom . import z\ndef f():\n    import w\n"
    )
    expected = {"typing", "typing.TYPE_CHECKING", "x.y", "pkg", "pkg.z", "w"}
    assert _imports(ast.parse(src), "pkg.mod", False) == expected


def test_a_cycle_through_type_annotations_is_found():
    """Two modules that import each other, one only for its annotations, are a cycle."""
    a = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    b = "from pkg.a import A\n"
    graph = {"pkg.a": _imports(ast.parse(a), "pkg.a", False), "pkg.b": _imports(ast.parse(b), "pkg.b", False)}
    graph = {name: {t for t in edges if t in graph} for name, edges in graph.items()}
    assert _find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]


def test_no_import_cycle_between_project_modules():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("forbidden", ["engine", "calibrate", "plots", "torch", "pulseinfer"])
def test_sim_never_imports(forbidden):
    modules = _modules()
    offenders = []
    for name, path in modules.items():
        if name.split(".")[0] != "sim":
            continue
        raw = _imports(ast.parse(path.read_text()), name, path.name == "__init__.py")
        if any(t == forbidden or t.startswith(forbidden + ".") for t in raw):
            offenders.append(name)
    assert not offenders, f"{offenders} import {forbidden}"


def test_simulator_core_never_imports_the_study_layer():
    """The studies (top-level ``study/``) are built on the simulator; ``sim`` never imports them."""
    graph = _graph()
    offenders = {
        name: sorted(t for t in edges if t == STUDY or t.startswith(STUDY + "."))
        for name, edges in graph.items()
        if name == "sim" or name.startswith("sim.")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"core modules import the study layer: {offenders}"


@pytest.mark.parametrize("layer", ["sim", "study", "calibrate", "workers", "traces"])
def test_imports_point_down_never_to_the_cli(layer):
    """pulseinfer → calibrate/, study/ → sim → traces: nothing below the command line imports ``pulseinfer``."""
    graph = _graph()
    offenders = {
        name: sorted(t for t in edges if t.split(".")[0] == "pulseinfer")
        for name, edges in graph.items()
        if name.split(".")[0] == layer
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"{layer} imports the command line: {offenders}"


def test_the_worker_pool_is_a_leaf():
    """``workers`` (the process pool that study/, calibrate/ and sim/serving/fleet_pool.py share) imports no
    project module."""
    graph = _graph()
    offenders = {n: sorted(e) for n, e in graph.items() if n.split(".")[0] == "workers" and e}
    assert not offenders, offenders


def test_engine_never_imports_the_simulator():
    graph = _graph()
    offenders = {
        n: sorted(e) for n, e in graph.items() if n.startswith("engine") and any(t.startswith("sim") for t in e)
    }
    assert not offenders, offenders
