"""Which functions one decode step calls: a profiler trace (``sys.setprofile``) of a single stepped decode step of
the default scenario (``run.skip_ahead=false``), counting the distinct functions called below the replica's decode
entry, in the project and in all, and the files they live in.

    python scripts/step_trace.py [--policy pulseinfer] [--entry _decode_step] [--nth 40] [--list]

The step traced is the ``--nth`` decode step whose batch holds an offloaded request and which recalls (for
``--policy sglang``: the ``--nth`` decode step). ``--entry`` names the ``Replica`` method a step enters by (a
generator); calls are counted where that method's frame is on the stack.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def trace_step(policy: str, entry: str, nth: int) -> tuple[set[tuple[str, str]], int]:
    """The (file, function) pairs one decode step called, and the step's index among decode steps."""
    sys.path.insert(0, str(REPO))
    from sim import load_scenario, simulate
    from sim.serving.replica import Replica

    original = getattr(Replica, entry)
    state = {"seen": 0, "found": None, "steps": 0}

    def wrapped(self, *args, **kwargs):
        b = self.batch
        offloaded = bool(b.offloaded.any()) if len(b) else False
        state["steps"] += 1
        wanted = state["found"] is None and (offloaded or policy == "sglang")
        gen = original(self, *args, **kwargs)
        if not wanted:
            return (yield from gen)
        calls: set[tuple[str, str]] = set()
        target = {"frame": None}

        def profiler(frame, event, arg):
            if event != "call" and event != "c_call":
                return
            f = frame if event == "call" else frame
            top = target["frame"]
            g = f
            while g is not None and g is not top:
                g = g.f_back
            if g is None:
                return
            if event == "call":
                calls.add((frame.f_code.co_filename, frame.f_code.co_qualname))
            else:
                calls.add(("<c>", getattr(arg, "__qualname__", str(arg))))

        rec = self.rec
        before = rec.recall_steps
        result = None
        try:
            value = None
            while True:
                sys.setprofile(profiler)
                try:
                    target["frame"] = gen.gi_frame
                    item = gen.send(value)
                finally:
                    sys.setprofile(None)
                value = yield item
        except StopIteration as stop:
            result = stop.value
        recalled = rec.recall_steps > before or policy == "sglang"
        if recalled:
            state["seen"] += 1
            if state["seen"] == nth:
                state["found"] = (calls, state["steps"])
        return result

    setattr(Replica, entry, wrapped)
    try:
        simulate(
            load_scenario("default", ["workload.max_requests=120", "run.skip_ahead=false", f"policies=[{policy}]"])
        )
    finally:
        setattr(Replica, entry, original)
    if state["found"] is None:
        raise SystemExit(f"no decode step number {nth} that recalls was found")
    return state["found"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="pulseinfer")
    ap.add_argument("--entry", default="_decode_step", help="the Replica method a decode step enters by")
    ap.add_argument("--nth", type=int, default=40)
    ap.add_argument("--list", action="store_true", help="print every project function")
    args = ap.parse_args(argv)
    calls, step = trace_step(args.policy, args.entry, args.nth)
    root = str(REPO)
    project = sorted((f, q) for f, q in calls if f.startswith(root) and "/scripts/" not in f)
    files = Counter(str(Path(f).relative_to(REPO)) for f, _ in project)
    python_calls = [c for c in calls if c[0] != "<c>"]
    print(f"policy {args.policy}, decode step {step} (entry Replica.{args.entry})")
    print(f"project functions: {len(project)} in {len(files)} files")
    print(f"Python functions in all: {len(python_calls)}; C functions: {len(calls) - len(python_calls)}")
    if args.list:
        for f, q in project:
            print(f"  {Path(f).relative_to(REPO)}: {q}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
