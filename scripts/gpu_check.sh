#!/usr/bin/env bash
# One short run on a GPU machine: the GPU-marked engine tests, then the engine benchmark (per_fragment vs
# gather_scatter vs a plain copy). Everything lands in one folder, so a single run checks everything.
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

"$py" -m pytest -m gpu -q -rA tests/engine --junitxml="$out/pytest_gpu.xml" 2>&1 | tee "$out/pytest_gpu.txt"
tests_rc=${PIPESTATUS[0]}
"$py" -m pulseinfer engine-bench --out "$out" 2>&1 | tee "$out/engine_bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "pytest -m gpu exit $tests_rc; engine-bench exit $bench_rc; results in $out" | tee "$out/status.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
