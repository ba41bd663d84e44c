#!/usr/bin/env bash
# perfbudget beside pytest-benchmark: runs the benchmark tests (fast and integration tiers) in .venv-bench, the main
# environment (.venv, from scripts/setup.sh) plus pytest-benchmark, which the main one lacks.
#   scripts/test-benchmark-compat.sh [pytest args]
# .venv-bench holds pytest-benchmark alone and reads every other package from .venv's
# site-packages (a .pth file): the same versions as the main run, without a second torch install.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ ! -x .venv-bench/bin/python ]; then
    "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv .venv-bench
fi
main=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
bench=$(.venv-bench/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# A .pth line that imports runs at start-up: addsitedir reads main's own .pth files too (the editable perfbudget).
echo "import site; site.addsitedir('$main')" > "$bench/perfbudget-main-venv.pth"
.venv-bench/bin/python -m pip --disable-pip-version-check -q install pytest-benchmark
# The A/A under perfbudget ab shows the sides take the fixture over from pytest-benchmark; the planted
# slowdown's verdict does not depend on pytest-benchmark being installed (the integration tier runs it).
exec .venv-bench/bin/python -m pytest tests/test_benchmark_fixture.py tests/ab/test_ab_benchmark_suite.py \
    -k "not thirty_percent_more_work" "$@"
