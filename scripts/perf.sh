#!/usr/bin/env bash
# Set up (if needed) and run the performance suite on this machine's device.
#   CPU machine: `pytest perf_tests` (GPU tests skip with the reason).
#   GPU machine: `pytest perf_tests` runs both; add `-m gpu` for the GPU part only.
# Extra arguments go to pytest, e.g. scripts/perf.sh --update-budgets
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest perf_tests "$@"
