"""The simulator core's layers import only layers below them, in the order docs/design.md §3 writes down.

The order is read from the design document (the fenced block after "Layer order of the simulator core"), so the
document and this test cannot disagree. Every module of ``sim`` belongs to one layer (the longest layer prefix of
its name), except the few :data:`OUTSIDE` the order. An edge is every import of a module as
tests/test_import_graph.py reads them: lazy imports inside functions and imports under ``if TYPE_CHECKING:`` count
(a module that names another's types depends on it). An edge to the same layer or a lower one is allowed; an edge
to a higher layer is an ownership turned around, and fails with the importing module and what it imports.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_import_graph import _graph

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
ORDER_BLOCK = re.compile(r"Layer order of the simulator core[^\n]*\n+```[^\n]*\n(.+?)\n```", re.S)
# sim modules outside the order: the package root (it re-exports ``load_scenario`` and ``simulate``). Studies and
# the process pool are top-level packages (study/, workers/), outside sim (tests/test_import_graph.py).
OUTSIDE = ("sim",)


def layer_order(text: str) -> list[str]:
    """The layers, top to bottom, as dotted prefixes (``sim/run.py`` → ``sim.run``, ``sim/serving/`` →
    ``sim.serving``), from the design document's text."""
    found = ORDER_BLOCK.search(text)
    assert found, f"{DESIGN.relative_to(REPO)}: no 'Layer order of the simulator core' block"
    names = [name.strip() for name in re.split(r"→|->", " ".join(found.group(1).split()))]
    return [name.removesuffix(".py").strip("/").replace("/", ".") for name in names if name]


def layer_of(module: str, order: list[str]) -> str | None:
    """The layer of ``module``: the longest layer it is, or is inside of; None if none."""
    matches = [layer for layer in order if module == layer or module.startswith(layer + ".")]
    return max(matches, key=len) if matches else None


def upward_edges(graph: dict[str, set[str]], order: list[str]) -> list[tuple[str, str]]:
    """Every (importer, imported) pair of ``graph`` whose imported module's layer is above the importer's (modules
    of no layer are not checked here)."""
    rank = {layer: i for i, layer in enumerate(order)}
    bad = []
    for module, targets in sorted(graph.items()):
        own = layer_of(module, order)
        for target in sorted(targets):
            theirs = layer_of(target, order)
            if own is not None and theirs is not None and rank[theirs] < rank[own]:
                bad.append((module, target))
    return bad


def _order() -> list[str]:
    return layer_order(DESIGN.read_text())


# ---- the checker itself, on small synthetic graphs ----------------------------------------------------------------
def test_layer_order_parses_the_documented_block():
    text = "Layer order of the simulator core:\n\n```\nsim/run.py → sim/serving/ →\n  sim/config/\n```\nsim/step/\n"
    assert layer_order(text) == ["sim.run", "sim.serving", "sim.config"]


def test_upward_edges_finds_a_wrong_edge_and_accepts_downward_and_sideways_ones():
    order = ["sim.run", "sim.serving", "sim.policies", "sim.config"]
    graph = {
        "sim.run": {"sim.serving.fleet", "sim.config"},  # down two layers: fine
        "sim.serving.fleet": {"sim.serving.replica", "sim.policies"},  # same layer, then down: fine
        "sim.serving.replica": {"sim.policies.base"},
        "sim.policies.base": {"sim.config", "sim.serving.admission"},  # up: wrong
        "sim.config": set(),
        "sim.study.plan": {"sim.run"},  # outside the order: not checked here
    }
    assert upward_edges(graph, order) == [("sim.policies.base", "sim.serving.admission")]
    graph["sim.policies.base"].discard("sim.serving.admission")
    assert upward_edges(graph, order) == []


def test_a_type_checking_import_is_an_edge_of_the_layer_order():
    """An import that only annotations use still turns the order around (the import walker counts it)."""
    import ast

    from tests.test_import_graph import _imports

    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sim.serving.request import Request\n"
    graph = {"sim.metrics.tables": _imports(ast.parse(src), "sim.metrics.tables", False)}
    bad = upward_edges(graph, ["sim.serving", "sim.metrics"])
    assert ("sim.metrics.tables", "sim.serving.request") in bad
    assert upward_edges(graph, ["sim.metrics", "sim.serving"]) == []


def test_layer_of_takes_the_longest_matching_layer():
    order = ["sim.run", "sim.serving", "sim.config"]
    assert layer_of("sim.serving.replica", order) == "sim.serving"
    assert layer_of("sim.run", order) == "sim.run"
    assert layer_of("sim.runner", order) is None  # a prefix of the name, not of the dotted path
    assert layer_of("sim.study.plan", order) is None


# ---- the project ---------------------------------------------------------------------------------------------------
def test_every_documented_layer_has_modules():
    modules = set(_graph())
    order = _order()
    assert len(order) == len(set(order)) >= 2, order
    empty = [layer for layer in order if not any(layer_of(m, order) == layer for m in modules)]
    assert not empty, f"docs/design.md §3 names layers with no module: {empty}"


def test_every_sim_module_has_a_layer():
    order = _order()
    unplaced = sorted(
        m
        for m in _graph()
        if m.split(".")[0] == "sim"
        and layer_of(m, order) is None
        and not any(m == o or m.startswith(o + ".") for o in OUTSIDE)
    )
    assert not unplaced, f"place these modules in the layer order of docs/design.md §3: {unplaced}"


def test_no_sim_layer_imports_a_layer_above_it():
    bad = upward_edges(_graph(), _order())
    assert not bad, "imports up the layer order of docs/design.md §3: " + ", ".join(f"{a} -> {b}" for a, b in bad)
