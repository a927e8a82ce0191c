"""Fleet-scale timing (issue 34): wall time of the cluster path `plan` and `simulate --set serving.replicas=N` use.

Workload as issue 34 states it: 16K-token prompts, 300-token outputs, disaggregated prefill, 0.35 req/s per replica,
the PulseInfer policy, summary tables only, on the default scenario's card and model. Each row is one process-local
run (wall seconds and peak RSS of this process so far); run it on a quiet machine and compare rows side by side.

Example: python scripts/bench_fleet.py --cases 4x5000,16x20000 --routers round_robin,least_tokens
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import pandas as pd

from sim.config import load_scenario
from sim.serving.cluster import simulate_cluster

RATE_PER_REPLICA = 0.35


def workload(num_requests: int, rate_per_s: float, seed: int = 0) -> pd.DataFrame:
    """Poisson arrivals at ``rate_per_s``; 16K prompts and 300 outputs (cv 0.2 each), seeded."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, num_requests)
    prompt = np.maximum(1, rng.normal(16384, 0.2 * 16384, num_requests)).astype(np.int64)
    output = np.maximum(2, rng.normal(300, 60, num_requests)).astype(np.int64)
    arrival_s = np.cumsum(gaps) - gaps[0]
    columns = {"request_id": np.arange(num_requests), "arrival_s": arrival_s, "prompt_tokens": prompt}
    return pd.DataFrame({**columns, "output_tokens": output, "hash_ids": [None] * num_requests})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="1x5000,4x5000,16x20000", help="REPLICASxREQUESTS, comma-separated")
    parser.add_argument("--routers", default="round_robin,least_tokens")
    args = parser.parse_args()
    scn = load_scenario("default", ["serving.prefill=disaggregated", "run.tables=summary", "run.progress=false",
                                    "policies=pulseinfer"])  # fmt: skip
    rows = []
    for case in args.cases.split(","):
        replicas, requests = (int(x) for x in case.split("x"))
        wl = workload(requests, RATE_PER_REPLICA * replicas)
        for router in args.routers.split(","):
            started = time.perf_counter()
            result = simulate_cluster(scn, wl, "pulseinfer", replicas, router)
            wall = time.perf_counter() - started
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            tok_s = round(result.summary["decode_tokens_per_s"])
            row = {"replicas": replicas, "requests": requests, "router": router, "wall_s": round(wall, 1)}
            rows.append({**row, "peak_rss_mib": round(rss), "decode_tok_s": tok_s})
            print(rows[-1], flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
