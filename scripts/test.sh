#!/usr/bin/env bash
# Set up (if needed) and run the unit tests (CPU only, no timing assertions).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest tests -n 2 "$@"
