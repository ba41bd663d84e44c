#!/usr/bin/env bash
# The prepared GPU check: on a machine with one NVIDIA GPU, measure the GPU part of the
# suite, create that GPU's budget file, and check the suite against it.
#   1. pytest perf_tests -m gpu                  (first look: unbudgeted metrics skip)
#   2. pytest perf_tests -m gpu --update-budgets  (writes budgets/cuda.yaml + budgets/<gpu>.yaml)
#   3. pytest perf_tests -m gpu                  (the check, against the new budgets)
# Everything (results JSON/Markdown/HTML, JUnit, logs, budget files, failure artifacts) goes
# under one folder. Budgeted to finish in under 8 minutes on one H200.
# Usage: scripts/gpu-check.sh [OUT_DIR]     (default: gpu-check-out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to do" >&2
    exit 2
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
scripts/setup.sh > "$OUT/setup.log" 2>&1 || { echo "gpu-check: setup failed, see $OUT/setup.log" >&2; exit 1; }

run() {  # name, then pytest arguments; each pass is bounded so the whole check fits
    local name=$1; shift
    local start=$SECONDS
    timeout 200 .venv/bin/python -m pytest perf_tests -m gpu -p no:cacheprovider \
        --perf-json "$OUT/$name.json" --junitxml "$OUT/$name.xml" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "gpu-check: $name exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    return "$rc"
}

run first
run update --update-budgets
run check
rc=$?
cp budgets/*.yaml "$OUT/" 2>/dev/null
[ -d .perfbudget/artifacts ] && cp -r .perfbudget/artifacts "$OUT/" 2>/dev/null
exit $rc
