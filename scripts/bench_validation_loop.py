"""Wall-clock calibrate → validate loop on this machine's CPU (formerly a test; it measures, so it lives here).

Runs LOOPS fresh tiny calibrations (2 layers of Qwen3-14B scaled by 8, calibrate.bench.BenchGrid below) and
validates each on four requests (contexts 1–4K, 12…6 output tokens, fastest of 5 engine runs per step), then
prints every loop's validation table and the mean-TPOT error per loop and policy with their medians. docs/results.md
(§7, "Calibrate and validate") reports its figures. The result depends on how loaded the machine is: run it on a
quiet machine. Takes about 3–5 minutes on 2 cores.

Run: ``python scripts/bench_validation_loop.py [LOOPS]`` (default 9).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from calibrate.bench import TINY_GRID
from calibrate.run import CalibrationSettings, run_calibration
from calibrate.validate import ValidationWorkload, validate

TINY = TINY_GRID
WORKLOAD = ValidationWorkload(contexts=(1024, 2048, 3072, 4096), output_tokens=(12, 10, 8, 6))
BOUND_PCT = 10.0  # the calibration issue's acceptance bound on mean TPOT


def main(loops: int = 9) -> None:
    torch.set_num_threads(1)
    errors: dict[str, list[float]] = {"sglang": [], "pulseinfer": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(loops):
            settings = CalibrationSettings(device="cpu", model="qwen3-14b", layers=2, scale=8)
            profile = run_calibration(settings, Path(tmp) / str(i), grid=TINY)
            table, _ = validate(profile, list(errors), WORKLOAD, "cpu", repeats=5)
            print(f"\nloop {i + 1}/{loops}\n" + table.to_string(index=False))
            mean = table[table["metric"] == "tpot_mean_ms"].set_index("policy")["error_pct"]
            for policy in errors:
                errors[policy].append(float(mean[policy]))
    print(f"\nmean TPOT error per loop (%), {time.perf_counter() - started:.0f} s wall:")
    for policy, errs in errors.items():
        median = float(np.median(errs))
        verdict = "within" if abs(median) <= BOUND_PCT else "OUTSIDE"
        print(
            f"  {policy}: {', '.join(f'{e:+.1f}' for e in errs)}; median {median:+.1f} ({verdict} ±{BOUND_PCT:.0f} %)"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
