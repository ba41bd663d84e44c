#!/usr/bin/env bash
# The prepared GPU check: on a machine with one NVIDIA GPU, measure the GPU part of the
# suite, create that GPU's budget file, and check the suite against it.
#   1. pytest perf_tests -m gpu --update-budgets  (writes budgets/cuda.yaml + budgets/<gpu>.yaml)
#   2. pytest perf_tests -m gpu                  (the check, against the new budgets)
#   3. perfbudget ab --base HEAD (an A/A: both sides the same commit, taking turns on the GPU)
#      on the step, operator and serving tests: the A/A spread of the ratio on this GPU
# Everything (results JSON/Markdown/HTML, JUnit, logs, budget files, failure artifacts) goes
# under one folder. Budgeted to finish in under 11 minutes on one H200.
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
.venv/bin/perfbudget show --device cuda > "$OUT/identity.txt" 2>&1 || true

run() {  # name, then pytest arguments; each pass is bounded so the whole check fits
    local name=$1; shift
    local start=$SECONDS
    # This lease is one machine for the whole check: declared stable, so the timing budgets
    # written by the update pass (keyed by this GPU's identity) gate the check pass.
    PERFBUDGET_STABLE_MACHINE=yes timeout 200 .venv/bin/python -m pytest perf_tests -m gpu -p no:cacheprovider \
        --perf-json "$OUT/$name.json" --junitxml "$OUT/$name.xml" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "gpu-check: $name exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    return "$rc"
}

run update --update-budgets
run check
rc=$?
cp budgets/*.yaml "$OUT/" 2>/dev/null

# The A/A needs a commit to stand for the base: a copy without git history gets a snapshot one.
if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
    git init -q && git add -A && git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm snapshot
fi
start=$SECONDS
timeout 300 .venv/bin/perfbudget ab --base HEAD --max-pairs 3 --max-minutes 4.5 --cpus all \
    --out "$OUT/ab-aa.json" -- perf_tests -m gpu -k "step_latency or operators or serving" 2>&1 | tee "$OUT/ab-aa.log"
echo "gpu-check: ab-aa exit ${PIPESTATUS[0]} in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
[ -d .perfbudget/artifacts ] && cp -r .perfbudget/artifacts "$OUT/" 2>/dev/null
exit $rc
