"""Prefix reuse in a trace: what its ``hash_ids`` allow per cache size, and what the simulator's caches reach.

1. Offline (no simulation, traces/reuse.py): the fraction of prompt tokens served from an LRU cache of hash blocks
   as a function of its capacity in tokens; ``unbounded`` is what the ids allow at all.
2. The simulator on the same trace with colocated prefill: ``sglang`` without and with its radix cache (device pool
   only) and ``sglang_hicache`` (evicted prefix KV kept on the host): ``prefix_hit_frac`` and the prefill busy
   share.

    python scripts/prefix_reuse.py [--trace mooncake_conversation] [--time-scale 4] [--set key=value ...]
"""

from __future__ import annotations

import argparse

import pandas as pd

from sim import load_scenario, simulate
from traces.registry import load_trace
from traces.reuse import lru_prefix_hit_frac

CAPACITIES_K_TOKENS = [200, 650, 1300, 2600, 5200, 10400, None]  # None: unbounded


def simulated(trace: str, time_scale: float, extra: list[str]) -> pd.DataFrame:
    """prefix_hit_frac and prefill busy share of sglang (cache off / on) and sglang_hicache, colocated prefill."""
    rows = []
    for label, policy, sets in [
        ("sglang, no prefix cache", "sglang", ["policy.sglang.prefix_cache=false"]),
        ("sglang (radix cache)", "sglang", []),
        ("sglang_hicache", "sglang_hicache", []),
    ]:
        overrides = [
            f"workload.trace={trace}", "serving.prefill=colocated", f"workload.time_scale={time_scale}",
            f"policies={policy}", "run.progress=false", *sets, *extra,
        ]  # fmt: skip
        s = simulate(load_scenario("default", overrides)).summary.iloc[0]
        rows.append(
            {
                "run": label,
                "prefix_hit_frac": s["prefix_hit_frac"],
                "prefill_busy_frac": s["prefill_busy_frac"],
                "ttft_p50_s": s["ttft_p50_s"],
                "decode_tokens_per_s": s["decode_tokens_per_s"],
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake_conversation")
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    trace = load_trace(args.trace).sort_values("arrival_s", kind="stable")
    curve = pd.DataFrame(
        {
            "cache_k_tokens": ["unbounded" if c is None else c for c in CAPACITIES_K_TOKENS],
            "lru_hit_frac": [lru_prefix_hit_frac(trace, None if c is None else c * 1000) for c in CAPACITIES_K_TOKENS],
        }
    )
    print(f"{args.trace}: {len(trace)} requests, {int(trace['prompt_tokens'].sum())} prompt tokens")
    print(curve.round(3).to_string(index=False))
    print()
    print(simulated(args.trace, args.time_scale, args.set).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
