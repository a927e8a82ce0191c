"""Known truth for `calibrate --from-measured` and `validate --measured` (docs/results.md §15).

Files the simulator writes, in SGLang's bench_serving format, on an H100 whose figures differ from the shipped card's
(three "true" servers). For each: the shipped card's and the true card's error on every file, a profile calibrated
from ONE all-at-once file and checked on the others (another all-at-once file with other lengths, a closed-loop
file), and one closed-loop file calibrated alone (its late window held out). Then a run whose prompts share a prefix:
its TTFT error replayed without and with the prefix (`--prefix-share`).

    python scripts/measured_truth.py [--iterations 8] [--out results/measured_truth]

Prints the tables and writes them as CSV into --out. Deterministic (seeded workloads, least squares).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.measured import measured_from_result, measured_scenario
from calibrate.measured_fit import fit_measured, run_error, verdict
from sim.run import simulate_policy
from sim.workload import load_workload
from traces.measured import read_measured, write_measured
from traces.measured.prefix import PREFIX_BLOCK_TOKENS

CARD = ["serving.prefill=colocated", "model=llama-3.1-8b", "hardware=h100-sxm"]
TRUTHS = {
    "slow-hbm": ["hardware.hbm_efficiency=0.75", "hardware.decode_step_overhead_us=500", "hardware.prefill_mfu=0.6"],
    "fast-host": ["hardware.hbm_efficiency=0.9", "hardware.decode_step_overhead_us=800", "hardware.prefill_mfu=0.35"],
    "slow-attn": ["hardware.attn_efficiency=0.6", "hardware.decode_request_overhead_us=80", "hardware.prefill_mfu=0.5"],
}
GEN = ["workload.trace=null", "workload.time_scale=1", "workload.synthetic.prompt_tokens_cv=0.3",
       "workload.synthetic.output_tokens_cv=0.3", "workload.synthetic.rate_per_s=3"]  # fmt: skip
FILES = {"a": (60, 2000, 150, 0, None), "b": (60, 1000, 200, 1, None), "closed": (60, 1500, 150, 2, 8)}


def _file(folder: Path, name: str, truth: list[str], n: int, prompt: int, output: int, seed: int, cap) -> Path:
    shape = [f"workload.synthetic.num_requests={n}", f"workload.synthetic.prompt_tokens_mean={prompt}",
             f"workload.synthetic.output_tokens_mean={output}", f"seed={seed}"]  # fmt: skip
    scn = measured_scenario("default", [*CARD, *GEN, *truth, *shape], "sglang")
    workload = load_workload(scn).assign(arrival_s=0.0)
    if cap is not None:
        workload = workload.assign(session_id=workload["request_id"].astype(str), turn=0, think_time_s=0.0)
        workload.attrs["max_concurrency"] = cap
    run = measured_from_result(simulate_policy(scn, workload, "sglang"), workload)
    return write_measured(run, folder / f"{name}.jsonl", "sglang_bench_serving")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("results/measured_truth"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    card = measured_scenario("default", CARD, "sglang")
    rows, fits = [], []
    for label, truth in TRUTHS.items():
        started = time.perf_counter()
        folder = args.out / label
        folder.mkdir(exist_ok=True)
        runs = {k: read_measured(_file(folder, k, truth, *spec)) for k, spec in FILES.items()}
        true = measured_scenario("default", [*CARD, *truth], "sglang")
        one = fit_measured([runs["a"]], card, args.iterations)
        closed = fit_measured([runs["closed"]], card, args.iterations)
        for k, run in runs.items():
            rows.append({"truth": label, "file": k, "load": run.load, "shipped_card_pct": run_error(run, card, {})[1],
                         "true_card_pct": run_error(run, true, {})[1],
                         "profile_from_a_pct": run_error(run, card, one.params)[1]})  # fmt: skip
        for name, fit in (("a (all at once)", one), ("closed (closed loop)", closed)):
            fits.append({"truth": label, "fitted_on": name, "fit_pct": fit.fit_error_pct,
                         "held_out_pct": fit.held_out_error_pct, "replays": fit.evaluations,
                         "verdict": verdict(fit)})  # fmt: skip
        print(f"{label}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    errors, fitted = pd.DataFrame(rows), pd.DataFrame(fits)
    errors.to_csv(args.out / "errors.csv", index=False)
    fitted.to_csv(args.out / "fits.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_colwidth", 200):
        print(errors.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        print(fitted.drop(columns="verdict").to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        for r in fitted.itertuples():
            print(f"{r.truth}, fitted on {r.fitted_on}: {r.verdict}")
    # a shared prefix: prompts share their first 2,048 tokens on a server with a prefix cache
    truth = TRUTHS["slow-hbm"]
    shape = ["workload.synthetic.num_requests=40", "workload.synthetic.prompt_tokens_mean=3000", "seed=8",
             "workload.synthetic.output_tokens_mean=40", "workload.synthetic.prompt_tokens_cv=0.1"]  # fmt: skip
    scn = measured_scenario("default", [*CARD, *GEN, *truth, *shape], "sglang")
    workload = load_workload(scn).assign(arrival_s=lambda d: np.arange(len(d)) * 0.25)
    k = 2048 // PREFIX_BLOCK_TOKENS
    workload["hash_ids"] = [(*range(k), -(i + 1)) for i in range(len(workload))]
    workload.attrs["hash_block_tokens"] = PREFIX_BLOCK_TOKENS
    path = write_measured(measured_from_result(simulate_policy(scn, workload, "sglang"), workload),
                          args.out / "shared_prefix.json", "vllm_bench_serve")  # fmt: skip
    run, true = read_measured(path), measured_scenario("default", [*CARD, *truth], "sglang")
    for share in (None, 1024, 2048, 0.66):
        table = run_error(run, true, {}, prefix_share=share)[2]["error_pct"]
        print(f"shared prefix 2048 tokens, replay --prefix-share {share}: TTFT mean error "
              f"{table['ttft_mean_ms']:+.1f} %, TPOT mean {table['tpot_mean_ms']:+.1f} %")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
