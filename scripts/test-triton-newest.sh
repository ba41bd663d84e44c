#!/usr/bin/env bash
# Run the Triton kernel tests on the NEWEST triton that pyproject.toml allows.
# The main .venv carries the oldest (scripts/setup.sh pins it), so CI tests both ends of
# the declared range. Only triton is installed, with pip --target into a cache folder
# that shadows .venv's triton through PYTHONPATH (torch and the rest are reused):
# about a minute with a cold cache, seconds with a warm one.
#   PERFBUDGET_TRITON_CACHE   cache folder (default ~/.cache/perfbudget; keep it between CI runs)
#   PERFBUDGET_TRITON_REFRESH=1  resolve the newest version again (a new release appeared)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
[ -x "$PY" ] || scripts/setup.sh

# The requirement exactly as declared, e.g. "triton>=3.7.1,<3.10".
spec=$("$PY" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(d for d in deps if re.match(r"triton\b", d))
print(spec.split(";", 1)[0].replace(" ", ""))
PY
)
cache=${PERFBUDGET_TRITON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/perfbudget}
slug=$(printf '%s' "$spec" | tr -c 'A-Za-z0-9.' '_')
target="$cache/triton-newest-$slug"

if [ -n "${PERFBUDGET_TRITON_REFRESH:-}" ] || [ ! -f "$target/.complete" ]; then
    echo "triton-newest: installing the newest $spec into $target"
    rm -rf "$target.tmp"
    # --no-deps: triton needs nothing at run time that .venv lacks.
    "$PY" -m pip --disable-pip-version-check -q install --no-deps --target "$target.tmp" "$spec"
    rm -rf "$target"
    mv "$target.tmp" "$target"
    touch "$target/.complete"
fi

export PYTHONPATH="$target:src"
newest=$("$PY" -c "import triton; print(triton.__version__)")
in_venv=$(env -u PYTHONPATH "$PY" -c "import triton; print(triton.__version__)")
echo "triton-newest: testing triton $newest (the main .venv has $in_venv; declared $spec)"
case "$("$PY" -c "import triton; print(triton.__file__)")" in
    "$target"/*) ;;
    *) echo "triton-newest: triton was not imported from $target" >&2; exit 1 ;;
esac
exec "$PY" -m pytest tests/levers/test_levers_layernorm_triton.py -q -p no:cacheprovider "$@"
