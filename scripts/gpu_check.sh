#!/usr/bin/env bash
# One short run on a GPU machine: the GPU-marked engine tests, the engine benchmark (per_fragment vs
# gather_scatter vs a plain copy), then the calibrate -> validate loop on CUDA (quick calibration of 4 layers of
# Qwen3-14B at full width, validation of sglang and pulseinfer on 8 requests of 2K-16K tokens). Everything lands
# in one folder, so a single run checks everything (about 5 minutes on an H200, most of it torch start-up and
# the validation's engine runs).
#
# Usage: scripts/gpu_check.sh [OUT_DIR]   (default: $OUT, else results/gpu_check); PYTHON overrides the interpreter.
# Needs a CUDA build of torch; exits non-zero if CUDA is missing, a GPU test fails or the benchmark fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${1:-${OUT:-results/gpu_check}}"
py="${PYTHON:-python}"
mkdir -p "$out"

{
    date -u
    git rev-parse HEAD 2>/dev/null
    nvidia-smi 2>&1
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} >"$out/env.txt" 2>&1
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device visible to torch (see $out/env.txt)" | tee "$out/status.txt"
    exit 1
fi

"$py" -m pytest -m gpu -q -rA tests/engine tests/calibrate --junitxml="$out/pytest_gpu.xml" 2>&1 | tee "$out/pytest_gpu.txt"
tests_rc=${PIPESTATUS[0]}
"$py" -m pulseinfer engine-bench --out "$out" 2>&1 | tee "$out/engine_bench.txt"
bench_rc=${PIPESTATUS[0]}
# gpu_gather (Triton kernel over pinned host memory) beside per_fragment and gather_scatter, with its fitted terms
"$py" -c "from calibrate.bench import bench_recall; from calibrate.fit import fit_gpu_gather; from engine.triton_gather import triton
df = bench_recall([1024, 8192, 65536], [64, 1024], 1 << 28, 3, 'cuda'); df.to_csv('$out/gpu_gather_recall.csv', index=False)
print('triton', triton is not None); print(df.groupby(['mode', 'fragment_bytes', 'num_fragments'])['seconds'].min().unstack(0))
print(fit_gpu_gather(df))" 2>&1 | tee "$out/gpu_gather.txt"

"$py" -m pulseinfer calibrate --device cuda --quick --out "$out/calibration" 2>&1 | tee "$out/calibrate.txt"
calibrate_rc=${PIPESTATUS[0]}
validate_rc=1
if [ "$calibrate_rc" -eq 0 ]; then
    "$py" -m pulseinfer validate --profile "$out/calibration" --device cuda --out "$out/validation" 2>&1 |
        tee "$out/validate.txt"
    validate_rc=${PIPESTATUS[0]}
fi

echo "pytest -m gpu exit $tests_rc; engine-bench exit $bench_rc; calibrate exit $calibrate_rc;" \
    "validate exit $validate_rc; results in $out" | tee "$out/status.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$calibrate_rc" -eq 0 ] && [ "$validate_rc" -eq 0 ]
