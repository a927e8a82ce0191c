"""SHA-1 fingerprints of the simulator's tables on a fixed set of runs: a refactor that must leave every table
identical is checked by running this before and after (or in two worktrees) and comparing the output.

    python scripts/fingerprints.py --out fp.json            # this tree
    python scripts/fingerprints.py --compare a.json b.json  # which tables moved

Runs (each policy of each run gives a requests table, and a steps table where the run keeps one; summary values are
fingerprinted too): the default scenario as shipped, colocated prefill, a horizon, TP 2 (remote and colocated
prefill), the SGLang HiCache preset (colocated), skip-ahead off on a short sample, and three-replica fleets behind
both routers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHORT = ["workload.max_requests=600"]
RUNS: dict[str, list[str]] = {
    "default": [],
    "colocated": [*SHORT, "serving.prefill=colocated"],
    "horizon": ["run.horizon_s=240"],
    "tp2": [*SHORT, "serving.tp_size=2"],
    "tp2_colocated": [*SHORT, "serving.tp_size=2", "serving.prefill=colocated"],
    "hicache": [*SHORT, "serving.prefill=colocated", "policies=[sglang,sglang_hicache,pulseinfer]"],
    "stepping": ["workload.max_requests=250", "run.skip_ahead=false"],
    "fleet_rr": ["workload.max_requests=900", "serving.replicas=3", "serving.router=round_robin"],
    "fleet_lt": ["workload.max_requests=900", "serving.replicas=3", "serving.router=least_tokens"],
}


def _sha(df) -> str:
    import pandas as pd

    data = pd.util.hash_pandas_object(df.reset_index(drop=True), index=False).to_numpy().tobytes()
    return hashlib.sha1(data + ",".join(map(str, df.columns)).encode()).hexdigest()[:12]


def fingerprints(names: list[str]) -> dict[str, str]:
    """``{run/policy/table: sha1}`` for the named runs of :data:`RUNS`."""
    sys.path.insert(0, str(REPO))
    from sim import load_scenario, simulate

    out: dict[str, str] = {}
    for name in names:
        t0 = time.perf_counter()
        result = simulate(load_scenario("default", RUNS[name]))
        for policy, res in result.policies.items():
            out[f"{name}/{policy}/requests"] = _sha(res.requests)
            if res.steps is not None:
                out[f"{name}/{policy}/steps"] = _sha(res.steps)
        out[f"{name}/summary"] = _sha(result.summary)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated names of RUNS")
    ap.add_argument("--out", type=Path, help="write the fingerprints as JSON here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="compare two JSON files")
    args = ap.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        same = len(before.keys() & after.keys()) - len([k for k in moved if k in before and k in after])
        print(f"{same} identical, {len(moved)} moved")
        for k in moved:
            print(f"  {k}: {before.get(k)} -> {after.get(k)}")
        return 0
    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        print(f"error: --runs: unknown run(s) {unknown}; expected names from {list(RUNS)}", file=sys.stderr)
        return 2
    fps = fingerprints(names)
    text = json.dumps(fps, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
