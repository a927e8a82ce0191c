"""plots reads tables: importing it loads neither the simulator, the engine nor torch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("sim", "engine", "calibrate", "torch")


def test_plots_modules_import_no_forbidden_package():
    for path in sorted((REPO / "plots").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & set(FORBIDDEN), f"{path.name} imports {sorted(names & set(FORBIDDEN))}"


def test_importing_plots_and_the_plot_command_loads_no_forbidden_module():
    code = (
        "import json, sys\n"
        "import plots, plots.render, pulseinfer.commands.plot\n"
        f"print(json.dumps(sorted(m for m in {list(FORBIDDEN)!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
