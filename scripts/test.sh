#!/usr/bin/env bash
# Set up (if needed) and run the unit tests (CPU only), in random order:
# the header shows the seed; --random-order-seed=N repeats an order.
#   scripts/test.sh [pytest args]                  the fast tier: every test not marked integration;
#                                                  no timing assertions
#   scripts/test.sh --integration [pytest args]    the integration tier: the slow end-to-end tests
#                                                  (real A/B sides, callgrind, compile, whole sessions)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
tier=(-m "not integration")
if [ "${1:-}" = "--integration" ]; then
    shift
    tier=(-m integration)
fi
# loadscope: a module's tests on one worker, so a module-scoped fixture (a compiled kernel, a
# session under callgrind) is set up once, not once per worker.
exec .venv/bin/python -m pytest tests -n 2 --dist loadscope --random-order "${tier[@]}" "$@"
