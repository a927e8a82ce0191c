"""Where a fleet run's time goes (issue 34; docs/results.md section 11.3): one ``simulate_cluster`` call of
``scripts/bench_fleet.py``'s workload, with the per-step parts wrapped and timed.

The parts: the offloaded step cost (``OffloadServing.step_costs``, the recall model included), the recall model
alone (``RecallModel.run``), timing runs (``StepDevices.time_run``: the compiled layer pipeline, or a recall-free
run's steps in Python) and applying runs (``Decode._apply_run``); "everything else" is the rest of the wall time (the
event loop, routing, prefill, admission, tables). Also counted: runs costed, steps costed and (step, request, layer)
cells. The wrappers add ~1 µs a call; shares, not absolute seconds, carry from one machine to another. One process
(``run.workers=1``).

Example:
    python scripts/profile_fleet.py --case 16x20000 --router least_tokens
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fleet import RATE_PER_REPLICA, SCENARIO_SETS, workload  # noqa: E402

# (label, module, class, method) of the timed parts, outermost first
PARTS = (
    ("offloaded step cost", "sim.policies.offload", "OffloadServing", "step_costs"),
    ("  of which the recall model", "sim.step.recall", "RecallModel", "run"),
    ("timing runs (layer pipeline)", "sim.step.timing", "StepDevices", "time_run"),
    ("applying runs", "sim.serving.decode", "Decode", "_apply_run"),
)


def _wrap(cls: type, name: str, label: str, seconds: dict, calls: collections.Counter, count=None) -> None:
    """Replace ``cls.name`` by a wrapper that adds its wall seconds to ``seconds[label]`` (and calls ``count``)."""
    f = getattr(cls, name)

    @functools.wraps(f)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        out = f(*args, **kwargs)
        seconds[label] += time.perf_counter() - started
        calls[label] += 1
        if count is not None:
            count(args)
        return out

    setattr(cls, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="16x20000", help="REPLICASxREQUESTS")
    parser.add_argument("--router", default="least_tokens")
    parser.add_argument("--policy", default="pulseinfer")
    parser.add_argument("--lengths", choices=("fixed", "mooncake"), default="fixed")
    args = parser.parse_args()
    try:
        replicas, requests = (int(x) for x in args.case.split("x"))
    except ValueError:
        parser.error(f"--case: expected REPLICASxREQUESTS such as 16x20000, got {args.case!r}")

    from sim.config import load_scenario
    from sim.serving.cluster import simulate_cluster

    seconds: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    scn = load_scenario("default", [*SCENARIO_SETS, f"policies={args.policy}", "run.workers=1"])
    layers = scn.model.num_layers

    def count_cells(a: tuple) -> None:  # RecallModel.run(self, ctx [k, n], ...)
        counts["steps costed"] += a[1].shape[0]
        counts["cells (step, request, layer)"] += a[1].size * layers

    for label, module, cls, name in PARTS:
        counter = count_cells if name == "run" else None
        _wrap(getattr(importlib.import_module(module), cls), name, label, seconds, calls, counter)
    wl = workload(requests, RATE_PER_REPLICA * replicas, lengths=args.lengths)
    started = time.perf_counter()
    simulate_cluster(scn, wl, args.policy, replicas, args.router)
    wall = time.perf_counter() - started
    outer = sum(seconds[label] for label, *_ in PARTS if not label.startswith(" "))
    rows = [(label, calls[label], seconds[label]) for label, *_ in PARTS]
    rows += [("everything else", None, wall - outer), ("the whole run", None, wall)]
    table = pd.DataFrame(rows, columns=["part", "calls", "seconds"])
    table["calls"] = table.calls.astype("Int64")
    table["share"] = (100 * table.seconds / wall).round(1).astype(str) + " %"
    table["seconds"] = table.seconds.round(2)
    print(f"{replicas} replicas x {requests} requests, {args.router}, {args.policy}, {args.lengths} lengths")
    print(table.to_string(index=False))
    print(", ".join(f"{k}: {v:,}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
