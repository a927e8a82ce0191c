"""scripts/profile_fleet.py: the breakdown table of a tiny fleet run, and its refusal of a malformed case.

No assertion depends on how fast anything ran: seconds are only checked to add up.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "profile_fleet.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_breakdown_names_every_part_and_counts_the_steps_costed():
    out = _run("--case", "2x60", "--router", "least_tokens")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for part in ("offloaded step cost", "of which the recall model", "timing runs (layer pipeline)", "applying runs",
                 "everything else", "the whole run"):  # fmt: skip
        assert part in text
    seconds = {}
    for line in text.splitlines():
        parts = r"offloaded step cost|timing runs \(layer pipeline\)|applying runs|everything else|the whole run"
        m = re.match(rf"\s*({parts})\s+(\d+|<NA>)\s+([\d.]+)", line)
        if m:
            seconds[m.group(1)] = float(m.group(3))
    assert len(seconds) == 5
    parts = sum(v for k, v in seconds.items() if k != "the whole run")
    assert abs(parts - seconds["the whole run"]) <= 0.02  # the rest is the whole less the timed parts (rounded)
    steps = int(re.search(r"steps costed: ([\d,]+)", text).group(1).replace(",", ""))
    cells = int(re.search(r"cells \(step, request, layer\): ([\d,]+)", text).group(1).replace(",", ""))
    assert steps > 0 and cells >= steps


def test_a_malformed_case_is_refused_by_name():
    out = _run("--case", "16by20000")
    assert out.returncode == 2
    assert "--case" in out.stderr and "'16by20000'" in out.stderr and "REPLICASxREQUESTS" in out.stderr
