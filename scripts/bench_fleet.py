"""Fleet-scale timing (issue 34): wall time and peak memory of the cluster path `plan` and
`simulate --set serving.replicas=N` use.

Cases are REPLICASxREQUESTS. The default workload is issue 34's: 16K-token prompts, 300-token outputs (cv 0.2 each),
Poisson arrivals at 0.35 req/s per replica, disaggregated prefill, the PulseInfer policy, summary tables only, on the
default scenario's card and model. ``--lengths mooncake`` draws each request's (prompt, output) pair from the
shipped Mooncake trace (traces/data/mooncake_conversation.jsonl, 5,719 requests: prompts 12.9K tokens on average,
outputs 346) with a seeded generator instead. Peak memory is the largest total RSS of this process and its worker
processes (``run.workers``, sim/serving/fleet_pool.py), sampled every 0.2 s from /proc (Linux), next to this
process's own peak (``ru_maxrss``). Run it on a quiet machine and compare rows side by side.

Examples:
    python scripts/bench_fleet.py --cases 1x5000,4x5000,16x20000 --routers round_robin,least_tokens
    python scripts/bench_fleet.py --cases 64x1000000 --routers round_robin --lengths mooncake --policy sglang

Side by side with an older commit (docs/results.md section 11): ``--baseline COMMIT`` checks it out with
``git worktree add --detach`` into a temporary folder, runs this script's cases there in a subprocess with
``PYTHONPATH`` set to it (the workload is built here and passed as a pickle, so both trees get the same requests;
the old tree needs ``sim.serving.cluster.simulate_cluster(scenario, workload, policy, replicas, router)``), prints
both rows, and removes the worktree.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

RATE_PER_REPLICA = 0.35
# the scenario settings of every case, on top of the default scenario (the policy and workers are added per case)
SCENARIO_SETS = ("serving.prefill=disaggregated", "run.tables=summary", "run.progress=false")
ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "traces" / "data" / "mooncake_conversation.jsonl"


def workload(num_requests: int, rate_per_s: float, seed: int = 0, lengths: str = "fixed") -> pd.DataFrame:
    """Poisson arrivals at ``rate_per_s``, seeded; lengths ``fixed`` (16K prompts, 300 outputs, cv 0.2 each) or
    ``mooncake`` (pairs resampled from the shipped Mooncake trace).

    Raises:
        ValueError: unknown ``lengths``.
    """
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, num_requests)
    if lengths == "fixed":
        prompt = np.maximum(1, rng.normal(16384, 0.2 * 16384, num_requests)).astype(np.int64)
        output = np.maximum(2, rng.normal(300, 60, num_requests)).astype(np.int64)
    elif lengths == "mooncake":
        from traces.mooncake import read_mooncake

        trace = read_mooncake(MOONCAKE)
        pick = rng.integers(0, len(trace), num_requests)
        prompt = trace["prompt_tokens"].to_numpy(dtype=np.int64)[pick]
        output = np.maximum(2, trace["output_tokens"].to_numpy(dtype=np.int64)[pick])
    else:
        raise ValueError(f"lengths must be fixed or mooncake, got {lengths!r}")
    arrival_s = np.cumsum(gaps) - gaps[0]
    columns = {"request_id": np.arange(num_requests), "arrival_s": arrival_s, "prompt_tokens": prompt}
    return pd.DataFrame({**columns, "output_tokens": output, "hash_ids": [None] * num_requests})


class PeakRss:
    """The largest total RSS (MiB) of this process and its descendants, sampled every ``every_s`` on a thread."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.peak_mib, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self, every_s: float) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, _tree_rss_mib(os.getpid()))
            self._stop.wait(every_s)


def _tree_rss_mib(root: int) -> float:
    """RSS of ``root`` and every descendant (MiB), from /proc; 0 where /proc is missing."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(rss.get(p, 0) for p in tree) / 2**20


def run_case(replicas: int, wl: pd.DataFrame, router: str, policy: str, workers: str, scn_sets: list[str]) -> dict:
    """One timed ``simulate_cluster`` call in this process (the tree on ``sys.path``); a table row."""
    from sim.config import load_scenario
    from sim.serving.cluster import simulate_cluster

    extra = [f"run.workers={workers}"] if workers else []
    scn = load_scenario("default", [*scn_sets, f"policies={policy}", *extra])
    with PeakRss() as peak:
        started = time.perf_counter()
        result = simulate_cluster(scn, wl, policy, replicas, router)
        wall = time.perf_counter() - started
    row = {"replicas": replicas, "requests": len(wl), "router": router, "policy": policy, "wall_s": round(wall, 1)}
    return {
        **row, "peak_rss_mib": round(peak.peak_mib), "self_maxrss_mib": round(_maxrss_mib()),
        "decode_tok_s": round(result.summary["decode_tokens_per_s"]),
    }  # fmt: skip


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _baseline(commit: str, args: argparse.Namespace, sets: list[str]) -> None:
    """Run the cases on ``commit`` in a temporary git worktree (module docstring), printing its rows."""
    folder = Path(tempfile.mkdtemp(prefix="bench_fleet_")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), commit], cwd=ROOT, check=True)
    try:
        for case in args.cases.split(","):
            replicas, requests = (int(x) for x in case.split("x"))
            wl = workload(requests, args.rate_per_replica * replicas, lengths=args.lengths)
            for router in args.routers.split(","):
                job = folder / "case.pkl"
                job.write_bytes(pickle.dumps((replicas, wl, router, args.policy, "", sets)))
                code = (
                    f"import pickle, sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import bench_fleet; "
                    f"print('baseline', bench_fleet.run_case(*pickle.load(open({str(job)!r}, 'rb'))), flush=True)"
                )
                env = {**os.environ, "PYTHONPATH": str(folder)}
                subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, check=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="1x5000,4x5000,16x20000", help="REPLICASxREQUESTS, comma-separated")
    parser.add_argument("--routers", default="round_robin,least_tokens")
    parser.add_argument("--policy", default="pulseinfer")
    parser.add_argument("--lengths", choices=("fixed", "mooncake"), default="fixed")
    parser.add_argument("--rate-per-replica", type=float, default=RATE_PER_REPLICA, help="req/s per replica")
    parser.add_argument("--workers", default="", help="run.workers (default: the scenario's, auto)")
    parser.add_argument("--baseline", metavar="COMMIT", help="also run the cases on COMMIT (a git worktree)")
    args = parser.parse_args()
    sets = list(SCENARIO_SETS)
    if args.baseline:
        _baseline(args.baseline, args, sets)
    rows = []
    for case in args.cases.split(","):
        replicas, requests = (int(x) for x in case.split("x"))
        wl = workload(requests, args.rate_per_replica * replicas, lengths=args.lengths)
        for router in args.routers.split(","):
            rows.append(run_case(replicas, wl, router, args.policy, args.workers, sets))
            print(rows[-1], flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
