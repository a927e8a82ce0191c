"""The shape of sim/ (issue 44: sim/ is the event model and nothing else): no two of its modules share a file name,
it stays under a line budget, and the studies live above it (top-level study/), not inside it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "sim"
# As `find sim -name '*.py' | xargs wc -l` counts them (newlines of every .py file). Issue 44 landed sim/ at
# <= 9,000; issue 46 added the compute model's MoE, MLA and split-KV physics and the model card's MoE/MLA shape
# (~100 lines that belong to the event model's step time, nowhere else), hence 9,200; issue 49 added the fleet's
# per-replica samples (the recorder's coarse series, ~50 lines), hence 9,250.
MAX_LINES = 9_250


def _modules() -> list[Path]:
    return sorted(SIM.rglob("*.py"))


def repeated_names(paths: list[Path]) -> dict[str, list[str]]:
    """File name → the paths (relative to sim/) of the modules that share it; ``__init__.py`` left out."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        if path.name != "__init__.py":
            by_name[path.name].append(path.relative_to(SIM).as_posix())
    return {name: found for name, found in by_name.items() if len(found) > 1}


def test_no_two_sim_modules_share_a_file_name():
    """A name says one thing in sim/: ``base.py`` twice or ``files.py`` twice makes a reader (and a traceback)
    guess which one is meant."""
    assert not repeated_names(_modules())


def test_the_name_check_sees_a_repeated_name():
    paths = [SIM / "config" / "base.py", SIM / "policies" / "base.py", SIM / "run.py", SIM / "step" / "__init__.py"]
    paths.append(SIM / "serving" / "__init__.py")
    assert repeated_names(paths) == {"base.py": ["config/base.py", "policies/base.py"]}


def test_sim_stays_under_its_line_budget():
    lines = sum(path.read_bytes().count(b"\n") for path in _modules())
    assert lines <= MAX_LINES, f"sim/ holds {lines:,} lines of Python, over its budget of {MAX_LINES:,}"


def test_sim_has_no_study_folder():
    """Studies (search, sweeps, plans, SLOs) are built on the simulator, in the top-level study/ package."""
    left = [p for p in (SIM / "study").rglob("*") if "__pycache__" not in p.parts]  # stale bytecode aside
    assert not left, f"sim/study/ holds {[p.relative_to(SIM).as_posix() for p in left]}"
    assert (REPO / "study" / "__init__.py").is_file()
