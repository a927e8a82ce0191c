"""SparseServe's Fig. 1 cases over what the paper leaves unsaid (issue 32): the range each case can take.

The four cases (``scenarios/cases/sparseserve_{fall,rise,blocks,admission}.yaml``, docs/sources.md §9) are run
with the setup the paper states (arXiv 2509.24626 §4.1: one A100-40GB on PCIe Gen4, LWM-7B — the Llama-2-7B shape,
MHA —, a 2,048-token budget; §2.3/§3.1: every KV block offloaded to DRAM) and, for each quantity it does not state,
every value of a grid:

* block size 16, 32, 64 tokens (§1: DSAs "typically" use 32; Fig. 4 measures 4-32);
* shared recall-cache size: ``free`` (unset: whatever the KV pool leaves free at each step — §3.1 "the remaining
  HBM is used to cache frequently accessed KV blocks"; on this card 40 − 5 reserve − 12.6 weights ≈ 22.4 GiB
  less the running requests' windows and summaries, ≈ 15-19 GiB at batch 12-6), then 16, 12, 8, 4, 2 GiB. One
  2,048-token selection of LWM-7B is 1 GiB (2,048 × 512 KiB over its 32 layers and heads), so batch 6 and 12
  select 6 and 12 GiB and their LRU working sets (× 1.75, docs/sources.md) are ~10.5 and ~21 GiB: the grid goes
  from most of batch 12's working set fitting down to less than batch 2's selections;
* prompt length mean 8,192 and 16,384 tokens (LongBench, capped at 32K for LWM-7B in §4.1; cv 0.2 as before);
* output length 64 and 256 tokens (LongBench's per-task generation caps run 64-512; Fig. 1 does not say).

Each (case, setting) runs the case file's own computation (:func:`calibrate.cases.run_case`) with its overrides
for these quantities replaced; simulations shared by the three head-wise cases run once. Prints and writes
``OUT/sparseserve_range.csv`` (one row per case and setting: simulated, published, error) and
``OUT/sparseserve_range_summary.csv`` (per case the range [min, max] over the grid, whether the published value
falls inside it, how many settings are within the case's tolerance, and the value at the case file's own
setting). ~5 minutes on 2 cores.

    python scripts/sparseserve_range.py [--out results/sparseserve_range] [--jobs 1]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

import sim.run
from calibrate.cases import CaseSpec, cases_dir, error_pct, load_case, run_case, verdict

CASES = ["sparseserve_fall", "sparseserve_rise", "sparseserve_blocks", "sparseserve_admission"]
GRID = {
    "block_size": [16, 32, 64],
    "cache_gib": ["free", 16, 12, 8, 4, 2],
    "prompt_tokens_mean": [8192, 16384],
    "output_tokens_mean": [64, 256],
}
# The case files' v3 setting (chosen by the rule stated in each file before the grid was run).
CHOSEN = {"block_size": 32, "cache_gib": "free", "prompt_tokens_mean": 16384, "output_tokens_mean": 64}
BUDGET_TOKENS = 2048  # §4.2: the token budget for LWM-7B and Llama3-8B
# Override keys this script sets itself: a case file's own value for them is dropped.
CONTROLLED = ("model", "hardware", "run.tables", "workload.synthetic.prompt_tokens_mean",
              "workload.synthetic.output_tokens_mean")  # fmt: skip
POLICY_KEYS = ("budget_tokens", "block_size", "recall_cache_gib", "offload_threshold_tokens")


def policy_of(spec: CaseSpec) -> str:
    """The one policy a simulate case runs (its ``policies=`` override)."""
    names = [o.split("=", 1)[1] for o in spec.compute.overrides if o.startswith("policies=")]
    if len(names) != 1 or "," in names[0]:
        raise SystemExit(f"{spec.name}: expected one `policies=NAME` override, got {names}")
    return names[0]


def faithful_overrides(spec: CaseSpec, setting: dict) -> list[str]:
    """The case's overrides with the paper's setup and ``setting`` in place of its own values for them."""
    policy = policy_of(spec)
    owned = {f"policy.{policy}.{k}" for k in POLICY_KEYS}
    kept = []
    for override in spec.compute.overrides:
        key = override.split("=", 1)[0]
        if key in CONTROLLED or key in owned or key.startswith("hardware."):
            continue
        kept.append(override)
    extra = [
        "model=lwm-7b",
        "hardware=a100-40gb",
        "run.tables=summary",
        f"workload.synthetic.prompt_tokens_mean={setting['prompt_tokens_mean']}",
        f"workload.synthetic.output_tokens_mean={setting['output_tokens_mean']}",
        f"policy.{policy}.budget_tokens={BUDGET_TOKENS}",
        f"policy.{policy}.block_size={setting['block_size']}",
        f"policy.{policy}.offload_threshold_tokens=1",  # SparseServe offloads every request's KV blocks
    ]
    if setting["cache_gib"] != "free":
        extra.append(f"policy.{policy}.recall_cache_gib={setting['cache_gib']}")
    return [*kept, *extra]


def with_overrides(spec: CaseSpec, overrides: list[str]) -> CaseSpec:
    """``spec`` with its simulation overrides replaced."""
    return spec.model_copy(update={"compute": spec.compute.model_copy(update={"overrides": overrides})})


@contextlib.contextmanager
def shared_simulations() -> Iterator[None]:
    """Run each distinct scenario once (the fall, rise and blocks cases simulate the same points)."""
    original, memo = sim.run.simulate, {}

    def simulate(scenario, progress=None):
        key = scenario.model_dump_json()
        if key not in memo:
            memo[key] = original(scenario, progress)
        return memo[key]

    sim.run.simulate = simulate
    try:
        yield
    finally:
        sim.run.simulate = original


def run_setting(setting: dict) -> list[dict]:
    """The four cases' rows at one setting."""
    rows = []
    with shared_simulations():
        for name in CASES:
            spec = load_case(cases_dir() / f"{name}.yaml")
            row = run_case(with_overrides(spec, faithful_overrides(spec, setting)))
            published = spec.published
            rows.append({
                "case": name,
                **setting,
                "chosen": setting == CHOSEN,
                "published": published if isinstance(published, float) else f"{published[0]:g}-{published[1]:g}",
                "simulated": row["simulated"],
                "error_pct": error_pct(row["simulated"], published),
                "tolerance_pct": spec.tolerance_pct,
                "verdict": verdict(error_pct(row["simulated"], published), spec.tolerance_pct),
            })  # fmt: skip
    return rows


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """Per case: the range over the grid, whether the published value is inside, settings within tolerance."""
    out = []
    for name in CASES:
        rows = table[table["case"] == name]
        spec = load_case(cases_dir() / f"{name}.yaml")
        low, high = (spec.published, spec.published) if isinstance(spec.published, float) else spec.published
        sim_low, sim_high = rows["simulated"].min(), rows["simulated"].max()
        chosen = rows[rows["chosen"]]["simulated"]
        out.append({
            "case": name,
            "published": rows["published"].iloc[0],
            "min": sim_low,
            "max": sim_high,
            "published_inside": bool(sim_low <= high and low <= sim_high),
            "within_tolerance": f"{int((rows['verdict'] == 'within').sum())}/{len(rows)}",
            "chosen_setting": float(chosen.iloc[0]) if len(chosen) else math.nan,
        })  # fmt: skip
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/sparseserve_range"), help="output folder")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1: the machine is shared)")
    args = parser.parse_args(argv)
    settings = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    started = time.perf_counter()
    rows = []
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            for done, part in enumerate(pool.map(run_setting, settings), 1):
                rows += part
                print(f"\r{done}/{len(settings)} settings", end="", file=sys.stderr, flush=True)
    else:
        for done, setting in enumerate(settings, 1):
            rows += run_setting(setting)
            print(f"\r{done}/{len(settings)} settings", end="", file=sys.stderr, flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s wall", file=sys.stderr)
    table = pd.DataFrame(rows)
    summary = summarise(table)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "sparseserve_range.csv", index=False)
    summary.to_csv(args.out / "sparseserve_range_summary.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_rows", None, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
        print()
        print(summary.to_string(index=False))
    print(f"wrote {args.out / 'sparseserve_range.csv'} and {args.out / 'sparseserve_range_summary.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
