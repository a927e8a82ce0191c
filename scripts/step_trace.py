"""Which functions one decode step calls: a profiler trace (``sys.setprofile``) of a single stepped decode step of
the default scenario (``run.skip_ahead=false``), counting the distinct functions called below the replica's decode
entry, in the project and in all, and the files they live in.

    python scripts/step_trace.py [--policy pulseinfer] [--entry _decode_step] [--nth 40] [--list]

With ``--skip-ahead`` the run keeps skip-ahead on (the default scenario's setting) and the trace covers the step's
whole decision: the skip-ahead attempt that found no run, then the step taken alone.

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


def _traced(gen, calls: set[tuple[str, str]]):
    """Run generator ``gen`` to its end (as ``yield from`` would), adding to ``calls`` every function called while its
    frame is on the stack; returns its value."""
    target = {"frame": None}

    def profiler(frame, event, arg):
        if event != "call" and event != "c_call":
            return
        g = frame
        while g is not None and g is not target["frame"]:
            g = g.f_back
        if g is None:
            return
        if event == "call":
            calls.add((frame.f_code.co_filename, frame.f_code.co_qualname))
        else:
            calls.add(("<c>", getattr(arg, "__qualname__", str(arg))))

    value = None
    try:
        while True:
            sys.setprofile(profiler)
            try:
                target["frame"] = gen.gi_frame
                item = gen.send(value)
            finally:
                sys.setprofile(None)
            value = yield item
    except StopIteration as stop:
        return stop.value


def trace_step(policy: str, entry: str, nth: int, skip_ahead: bool = False) -> tuple[set[tuple[str, str]], int]:
    """The (file, function) pairs one decode step called, and the step's index among decode steps. With
    ``skip_ahead``, the step's decision is traced whole: the skip-ahead attempt that found no run (``_decode_run``)
    and the step then taken alone."""
    sys.path.insert(0, str(REPO))
    from sim import load_scenario, simulate
    from sim.serving.replica import Replica

    original = getattr(Replica, entry)
    original_run = Replica._decode_run
    state = {"seen": 0, "found": None, "steps": 0, "pending": None}

    def run_wrapped(self, *args, **kwargs):
        calls: set[tuple[str, str]] = set()
        took = yield from _traced(original_run(self, *args, **kwargs), calls)
        state["pending"] = None if took else calls
        return took

    def wrapped(self, *args, **kwargs):
        b = self.batch
        offloaded = bool(b.offloaded.any()) if len(b) else False
        state["steps"] += 1
        wanted = state["found"] is None and (offloaded or policy == "sglang")
        gen = original(self, *args, **kwargs)
        if not wanted:
            return (yield from gen)
        calls: set[tuple[str, str]] = set(state["pending"] or ())
        state["pending"] = None
        rec = self.rec
        before = rec.recall_steps
        result = yield from _traced(gen, calls)
        recalled = rec.recall_steps > before or policy == "sglang"
        if recalled:
            state["seen"] += 1
            if state["seen"] == nth:
                state["found"] = (calls, state["steps"])
        return result

    setattr(Replica, entry, wrapped)
    if skip_ahead:
        Replica._decode_run = run_wrapped
    try:
        keys = ["workload.max_requests=120", f"run.skip_ahead={str(skip_ahead).lower()}", f"policies=[{policy}]"]
        simulate(load_scenario("default", keys))
    finally:
        setattr(Replica, entry, original)
        Replica._decode_run = original_run
    if state["found"] is None:
        raise SystemExit(f"no decode step number {nth} that recalls was found")
    return state["found"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="pulseinfer")
    ap.add_argument("--entry", default="_decode_step", help="the Replica method a decode step enters by")
    ap.add_argument("--nth", type=int, default=40)
    ap.add_argument("--list", action="store_true", help="print every project function")
    ap.add_argument("--skip-ahead", action="store_true", help="skip-ahead on: trace the failed run attempt too")
    args = ap.parse_args(argv)
    calls, step = trace_step(args.policy, args.entry, args.nth, args.skip_ahead)
    root = str(REPO)
    project = sorted((f, q) for f, q in calls if f.startswith(root) and "/scripts/" not in f)
    files = Counter(str(Path(f).relative_to(REPO)) for f, _ in project)
    python_calls = [c for c in calls if c[0] != "<c>"]
    mode = "skip-ahead on: the decision's run attempt and the step" if args.skip_ahead else "skip-ahead off"
    print(f"policy {args.policy}, decode step {step} (entry Replica.{args.entry}; {mode})")
    print(f"project functions: {len(project)} in {len(files)} files")
    print(f"Python functions in all: {len(python_calls)}; C functions: {len(calls) - len(python_calls)}")
    if args.list:
        for f, q in project:
            print(f"  {Path(f).relative_to(REPO)}: {q}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
