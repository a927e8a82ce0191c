"""How the default load was chosen: sweep the Mooncake time scale, colocated vs disaggregated prefill.

Prints one markdown table (docs/results.md §2, "How the default load was chosen"). Takes a few minutes on 2 cores.
Run: ``python scripts/default_load_sweep.py``.
"""

from __future__ import annotations

import time

import pandas as pd

from sim import load_scenario, simulate
from sim.run import with_ratios

SWEEP = [("colocated", [3.0, 4.0, 6.0]), ("disaggregated", [0.5, 0.6, 0.75, 1.0])]


def main() -> None:
    rows = []
    for serving, scales in SWEEP:
        for ts in scales:
            overrides = [f"serving.prefill={serving}", f"workload.time_scale={ts}", "policies=sglang,pulseinfer"]
            sc = load_scenario("default", [*overrides, "run.progress=false"])
            t = time.perf_counter()
            s = with_ratios(simulate(sc).summary).set_index("policy")
            wall = time.perf_counter() - t
            g, p = s.loc["sglang"], s.loc["pulseinfer"]
            rows.append(
                {
                    "prefill": serving,
                    "time_scale": ts,
                    "rate req/s": round(5718 / 1797 / ts, 2),
                    "sglang local prefill busy %": round(100 * g.prefill_busy_frac, 0),
                    "sglang mean batch": round(g.mean_batch, 1),
                    "sglang peak HBM GiB": round(g.peak_hbm_gib, 1),
                    "sglang TTFT p50 s": round(g.ttft_p50_s, 1),
                    "sglang tok/s": round(g.decode_tokens_per_s),
                    "pulseinfer tok/s": round(p.decode_tokens_per_s),
                    "x sglang": round(p.throughput_vs_sglang, 2),
                    "pulseinfer link busy %": round(100 * p.link_busy_frac, 0),
                    "wall s": round(wall, 1),
                }
            )
            print(rows[-1], flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
