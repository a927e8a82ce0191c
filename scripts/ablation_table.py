"""The ablation ladder on three configurations, printed as one table (~2-3 minutes on 2 cores).

Runs ``scenarios/ablation.yaml`` for Qwen3-14B on H200, Qwen3-14B on H100 and Qwen3-30B-A3B on H200; each row is
labelled with the model and card that ran (a ``--set model=...`` or ``hardware=...`` applies to all three).
Run: ``python scripts/ablation_table.py [--set key=value ...]``.
"""

from __future__ import annotations

import argparse
import sys
import time

import pandas as pd

from sim import load_scenario, simulate
from sim.config import ScenarioError
from sim.run import with_ratios

CONFIGS = [("qwen3-14b", "h200"), ("qwen3-14b", "h100-sxm"), ("qwen3-30b-a3b", "h200")]
COLUMNS = {
    "decode_tokens_per_s": "decode tok/s",
    "tpot_mean_s": "TPOT mean s",
    "tpot_p99_s": "TPOT p99 s",
    "mean_batch": "mean batch",
    "stall_frac": "stall frac",
    "link_busy_frac": "link busy frac",
    "throughput_vs_sglang": "x sglang",
    "throughput_vs_headwise": "x headwise",
}


def main(extra: list[str]) -> None:
    frames = []
    for model, hardware in CONFIGS:
        started = time.perf_counter()
        sc = load_scenario("ablation", [f"model={model}", f"hardware={hardware}", "run.progress=false", *extra])
        s = with_ratios(simulate(sc).summary)
        table = s[["policy", *(c for c in COLUMNS if c in s)]].rename(columns=COLUMNS)  # ratios need their policy
        table.insert(0, "config", f"{sc.model.name} / {sc.hardware.name}")
        frames.append(table)
        took_s = time.perf_counter() - started
        print(f"{sc.model.name} on {sc.hardware.name}: {took_s:.0f} s wall", file=sys.stderr, flush=True)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(pd.concat(frames).round(3).to_string(index=False))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="scenario override, repeatable")
    try:
        main(parser.parse_args().set)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
