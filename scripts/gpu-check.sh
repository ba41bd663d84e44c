#!/usr/bin/env bash
# The prepared GPU check: on a machine with one NVIDIA GPU and no package registry (a GPU
# leased by time, or a user's self-hosted runner), with the machine's own python3 and torch, in one
# command of at most LIMIT_S (the lease plan's, 420 s: a lease keeps >= 4 minutes for a second
# command), set-up included, the work lease-sized (-o perfbudget_lease=true):
#   set-up   perfbudget installed from this tree with no registry (pip --no-index --no-deps,
#            into a scratch folder on PYTHONPATH: the machine's Python is left as it was)
#   update   every GPU test but the compiling ones, --update-budgets: the GPU's budget files,
#            written by the updater into a scratch copy of budgets/ (cuda.yaml, <gpu identity>.yaml)
#   check    the plan's check tests against them, the machine declared stable (this pass only:
#            in the update pass a preflight warning would leave checks unjudged and unwritten)
#   a/a      perfbudget ab --base HEAD on the encoder step and operators, both sides the same
#            commit (in a snapshot repository): the per-pair spread on this GPU; only where git exists
# The tests, their order (imposed by the plugin under the lease), each one's estimated seconds
# and each part's bound are the lease plan's (src/perfbudget/lease.py): `--plan` prints it.
# Parts run in that order of value; each is stopped before its bound (SIGINT: pytest ends the
# session and writes what it measured; SIGKILL GRACE_S later) and keeps what finished: results
# are rewritten after every test, and a killed update pass's budgets are written from them.
# Everything goes into OUT as two files, gpu-check.tar.gz (after every part) and summary.txt
# (printed at the end, each test's seconds beside the plan's): the device returns at most 8 files.
#
# Usage:
#   scripts/gpu-check.sh [--commit SHA] OUT        on the GPU machine (OUT empty or absent)
#   scripts/gpu-check.sh --compile [--commit SHA] OUT   the lease's second command: set-up, then the
#                                                  compiling GPU tests with --update-budgets (planned too)
#   scripts/gpu-check.sh --plan                    the plan: tests in order, estimated seconds, total
#   scripts/gpu-check.sh --rehearse OUT            here, on the CPU: the same script, see below
#   PYTHON=/path/to/python3                        the Python that holds torch (default python3)
# A copy of the tree without .git does not know its commit: pass it from the host,
#   scripts/gpu-check.sh --commit "$(git rev-parse --short HEAD)" "$OUT"
# and the budgets' provenance records it (pytest --perf-commit).
#
# Bounds: each part's is the plan's (its estimate and a margin), cut to what is left before
# DEADLINE_S = LIMIT_S - FINISH_S, keeping GRACE_S + PACK_S for the part's end; the A/A runs
# only when one pair's time is left (AA_MIN_S), and `perfbudget ab --max-minutes` is its bound.
#
# --rehearse OUT: the same script on this CPU machine, before a lease. A virtual environment
# with the GPU image's versions where they install here (.gpu-rehearsal/venv, made from the
# registries first and reused): torch 2.13.0+cpu (the image has 2.11.0+cu130; no CPU build of
# 2.11 is on the registries here), triton 3.6.0 (as the image), Python of this machine (3.11;
# the image has 3.12), and as on the image no ruptures or py-spy. Then, with no registry
# (PIP_NO_INDEX=1, pip config ignored), a copy of the tree without .git (what the device
# gets) runs this script with --cpu: the [cpu] variants of the same tests (those that
# compile left out: a cold compile costs ~1 min on 2 cores, more than the rest of a pass),
# budgets written into an empty scratch folder (a first lease has no GPU budgets either),
# timing advisory in the check pass (one pass on a shared CPU is no stable machine), whose
# bound is short on purpose so the cut at a bound is rehearsed too. Ends by checking OUT
# against the device's limits and the tarball's contents; fails if either is off.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

GRACE_S=10   # SIGINT at a bound, SIGKILL this much later
PACK_S=2     # a part's own pack
FINISH_S=3   # the summary, the last pack, OUT checked
REPORT=scripts/gpu-check-report.py
LEASE=src/perfbudget/lease.py   # the plan: stdlib only, run with any python3
REHEARSAL_VENV=.gpu-rehearsal/venv
# The GPU image's versions where they install here (torch 2.11.0+cu130, triton 3.6.0),
# with the pytest plugins it holds too (they load into every pytest run there).
REHEARSAL_TORCH=2.13.0
REHEARSAL_PACKAGES=("triton==3.6.0" pytest pytest-xdist pyyaml numpy scipy matplotlib nvidia-ml-py setuptools wheel
                    pytest-benchmark pytest-cov pytest-mock pytest-timeout hypothesis)

usage() { sed -n '/^# Usage:/,/^# and the budgets/p' "$0" | sed 's/^# \{0,1\}//'; }
plan() { "${PYTHON:-python3}" "$LEASE" "$@"; }

mode=device device=cuda commit="" out="" compile=""
while [ $# -gt 0 ]; do
    case $1 in
        --commit) commit=${2:-}; shift 2 || { usage >&2; exit 2; } ;;
        --commit=*) commit=${1#--commit=}; shift ;;
        --rehearse) mode=rehearse; shift ;;
        --compile) compile=1; shift ;;
        --plan) plan plan; exit $? ;;
        --cpu) device=cpu; shift ;;   # the rehearsal's inner run: the [cpu] variants, no GPU needed
        -h|--help) usage; exit 0 ;;
        -*) echo "gpu-check: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) [ -z "$out" ] || { echo "gpu-check: one OUT folder, got $out and $1" >&2; exit 2; }; out=$1; shift ;;
    esac
done
out=${out:-gpu-check-out}
if [ -n "$compile" ] && { [ "$mode" = rehearse ] || [ "$device" = cpu ]; }; then
    echo "gpu-check: --compile runs on the GPU only (a cold compile on this CPU takes the rehearsal's time)" >&2
    exit 2
fi
if [ -n "$commit" ] && ! [[ $commit =~ ^[0-9a-fA-F]{4,40}(-dirty)?$ ]]; then
    echo "gpu-check: --commit: expected a commit hash (4 to 40 hex digits, '-dirty' allowed), got '$commit'" >&2
    exit 2
fi
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
    echo "gpu-check: OUT ($out) must be empty or absent: everything in it goes back from the device" >&2
    exit 2
fi
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
# The stable-machine declaration is the check pass's alone (run_pass check), never inherited.
unset PERFBUDGET_STABLE_MACHINE

# ------------------------------------------------------------------------------ rehearsal

rehearsal_venv() {  # made from the registries, before the no-registry part; reused when complete
    local stamp=$REHEARSAL_VENV/.gpu-rehearsal-packages want
    want="torch==$REHEARSAL_TORCH+cpu ${REHEARSAL_PACKAGES[*]}"
    if [ -x "$REHEARSAL_VENV/bin/python3" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    echo "gpu-check: making $REHEARSAL_VENV ($want)"
    rm -rf "$REHEARSAL_VENV"
    "${PYTHON:-python3}" -m venv "$REHEARSAL_VENV" || return 1
    local pip=("$REHEARSAL_VENV/bin/python3" -m pip --disable-pip-version-check -q install)
    # A local or mirrored +cpu wheel first; otherwise PyTorch's CPU index (as scripts/setup.sh).
    "${pip[@]}" "torch==$REHEARSAL_TORCH+cpu" 2>/dev/null \
        || "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==$REHEARSAL_TORCH+cpu" || return 1
    "${pip[@]}" "${REHEARSAL_PACKAGES[@]}" 2>&1 | { grep -v "^WARNING: Location" || true; }
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    echo "$want" > "$stamp"
}

rehearse() {
    local start=$SECONDS scratch tree rc venv
    git rev-parse --git-dir >/dev/null 2>&1 || { echo "gpu-check: --rehearse needs a git checkout" >&2; return 2; }
    rehearsal_venv || { echo "gpu-check: could not make $REHEARSAL_VENV" >&2; return 2; }
    echo "gpu-check: rehearsal venv ready after $((SECONDS - start)) s"
    venv=$(cd "$REHEARSAL_VENV" && pwd)
    commit=${commit:-$(git rev-parse --short HEAD)}
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-rehearsal.XXXXXX") || return 2
    tree=$scratch/tree
    mkdir -p "$tree"
    # What travels to the device: tracked files and untracked ones git does not ignore, no .git.
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf - | tar -xf - -C "$tree" || { rm -rf "$scratch"; return 2; }
    (
        cd "$tree" || exit 2
        # No registry from here on: pip's config (find-links, extra indexes) ignored, no index.
        exec env -u PYTHON -u PYTHONPATH -u VIRTUAL_ENV -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL \
            -u PERFBUDGET_STABLE_MACHINE PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 \
            PATH="$venv/bin:$PATH" \
            scripts/gpu-check.sh --cpu --commit "$commit" "$out"
    )
    rc=$?
    local problems=0
    python3 "$REPORT" check-out "$out" || problems=1
    python3 "$REPORT" rehearsal-check "$out" "$scratch/unpacked" || problems=1
    rm -rf "$scratch"
    echo "gpu-check: rehearsal: the check exited $rc; OUT $( ((problems)) && echo "FAILED its checks" || echo "passed its checks"):" \
         "$(find "$out" -type f -printf '%P ')in $((SECONDS - start)) s"
    if [ "$rc" -ne 0 ] || [ "$problems" -ne 0 ]; then
        return 1
    fi
}

if [ "$mode" = rehearse ]; then
    rehearse
    exit $?
fi

# ------------------------------------------------------------------------------ the check

START=$SECONDS
PY=${PYTHON:-python3}
if [ "$device" = cuda ]; then
    LIMIT_S=$(plan limit) UPDATE_S=$(plan bound update) CHECK_S=$(plan bound check) AA_MAX_S=$(plan bound a/a) \
        COMPILE_S=$(plan bound compile) \
        || { echo "gpu-check: the lease plan ($LEASE) did not run with $PY" >&2; exit 2; }
    DEADLINE_S=$((LIMIT_S - FINISH_S)) CHECK_MIN_S=30 AA_MIN_S=$(((AA_MAX_S + 1) / 2))
    # Every GPU test but those that compile (not planned: a cold compile would take the A/A's time)
    # and count instructions (CPU only); the plugin runs them in the plan's order.
    update_tests=(perf_tests -m "gpu and not compiles and not instructions")
    mapfile -t check_tests < <(plan tests check)
    mapfile -t aa_tests < <(plan tests a/a)
else
    # The rehearsal's tiny CPU workloads: update ~50 s, check ~45 s (its bound cuts it on
    # purpose), an A/A pair ~15 s.
    LIMIT_S=420 DEADLINE_S=400 UPDATE_S=150 CHECK_S=25 CHECK_MIN_S=20 AA_MIN_S=45 AA_MAX_S=90
fi
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/perfbudget-gpu-check.XXXXXX") || exit 2
R=$WORK/gpu-check   # everything packed
mkdir -p "$R"
exec > >(tee -a "$R/console.txt") 2>&1

elapsed() { echo $((SECONDS - START)); }
bound() {  # bound WANT: WANT, or what is left before the deadline after the part's end
    local left=$((DEADLINE_S - $(elapsed) - GRACE_S - PACK_S))
    echo $((left < $1 ? left : $1))
}
note_part() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$R/parts.tsv"; }
pack() {  # after every part, so what finished is in OUT whenever the command ends
    local tgz=$WORK/pack.tar.gz
    tar -czf "$tgz" -C "$WORK" gpu-check 2>/dev/null
    if [ "$(stat -c %s "$tgz" 2>/dev/null || echo 0)" -gt $((15 * 1024 * 1024)) ]; then
        echo "gpu-check: over 15 MiB packed: failure artifacts left out" | tee -a "$R/packing.txt"
        tar -czf "$tgz" -C "$WORK" --exclude='gpu-check/*/artifacts' gpu-check 2>/dev/null
    fi
    mv -f "$tgz" "$out/gpu-check.tar.gz"
}
finish() {  # the summary, OUT checked, the exit code
    local rc=$1
    pack
    { "$PY" "$REPORT" summary "$R" "$out"; echo "exit $rc after $(elapsed) s"; } > "$out/summary.txt" 2>&1
    echo "================================ gpu-check summary ================================"
    cat "$out/summary.txt"
    "$PY" "$REPORT" check-out "$out" || rc=2
    rm -rf "$WORK"
    exit "$rc"
}

status_of() {  # a part's exit status in words
    case $1 in
        0) echo ok ;;
        1) echo failed ;;
        124) echo cut ;;      # SIGINT at the bound: pytest finished its session
        137) echo killed ;;   # still running GRACE_S later: results as of the last finished test
        *) echo "exit-$1" ;;
    esac
}

# One pass of the suite, stopped at its bound: run_pass NAME WANT_S [VAR=VALUE...] [pytest args],
# the variables set for this pass only.
run_pass() {
    local name=$1 want=$2 vars=(); shift 2
    while [[ ${1:-} == [A-Z]*=* ]]; do vars+=("$1"); shift; done
    local b status t0=$SECONDS rc
    b=$(bound "$want")
    mkdir -p "$R/$name"
    echo "gpu-check: $name pass, bound $b s (at $(elapsed) s)"
    timeout -s INT -k "$GRACE_S" "$b" env "${vars[@]}" "$PY" -m pytest "$@" -p no:cacheprovider \
        -o perfbudget_html=false -o perfbudget_lease=true --budgets-dir "$WORK/budgets" --durations=0 -rfEs \
        --perf-json "$R/$name/results.json" --junitxml "$R/$name/junit.xml" 2>&1 | tee "$R/$name/log.txt"
    rc=${PIPESTATUS[0]}
    status=$(status_of "$rc")
    # Cut at its bound: timeout's status hides pytest's, so what the pass recorded until then decides.
    if { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && [ "$("$PY" "$REPORT" failures "$R/$name" || echo 1)" != 0 ]; then
        status="$status, failed"
        rc=1
    fi
    note_part "$name" "$status" "$((SECONDS - t0))" "$b" ""
    echo "gpu-check: $name pass: $status after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || return 1
}


# -- set-up -----------------------------------------------------------------------------
t0=$SECONDS
setup_fail() { note_part set-up failed "$((SECONDS - t0))" - "$1"; echo "gpu-check: set-up failed: $1"; finish 2; }
command -v "$PY" >/dev/null 2>&1 || setup_fail "no $PY on this machine (PYTHON names another)"
if [ "$device" = cuda ]; then
    timeout 20 nvidia-smi > "$R/nvidia-smi.txt" 2>&1 || setup_fail "no NVIDIA GPU visible (nvidia-smi failed or hung)"
fi
# No registry: the machine's own packages, this tree built with the machine's setuptools.
timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --root-user-action=ignore --target "$WORK/site" . > "$R/setup.log" 2>&1 \
    || setup_fail "perfbudget did not install with no registry: see setup.log in the tarball"
export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH} PATH=$WORK/site/bin:$PATH
# The budgets written go into a scratch copy (budgets-before: what they are compared with).
if [ "$device" = cuda ]; then
    cp -r budgets "$WORK/budgets-before"
    stable=(PERFBUDGET_STABLE_MACHINE=yes)   # the check pass only: its timing budgets gate
else
    stable=()   # one pass on a shared CPU is no stable machine: timing advisory
    mkdir -p "$WORK/budgets-before"   # empty: a first lease has no GPU budgets either
fi
cp -r "$WORK/budgets-before" "$WORK/budgets"
# Provenance: the commit passed, else git's own (with -dirty), else 'unknown' with a warning.
commit_args=()
shown_commit=$commit
if [ -n "$commit" ]; then
    commit_args=(--perf-commit "$commit")
elif command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
    shown_commit="$(git rev-parse --short HEAD) (git)"
fi
timeout 45 "$PY" - "$device" "${shown_commit:-unknown (pass --commit)}" "$WORK/budgets" > "$R/environment.txt" 2>&1 <<'PY' \
    || setup_fail "$(tail -n 3 "$R/environment.txt" | tr '\n' ' ')"
import importlib.metadata as md, io, platform, shutil, sys
device, commit, budgets = sys.argv[1:]
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "missing"
import torch
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("torch.cuda.is_available() is False: every GPU test would skip")
gpu = torch.cuda.get_device_name(0) if device == "cuda" else "no GPU: the rehearsal on the CPU"
from perfbudget.cli import main
ident = io.StringIO()
main(["show", "--identity", "--device", device], out=ident)
print(f"gpu-check: commit {commit}, {gpu}, identity {ident.getvalue().strip()}, git {'yes' if shutil.which('git') else 'none'}")
print(f"gpu-check: python {platform.python_version()} ({sys.executable}), torch {torch.__version__} "
      f"(CUDA {torch.version.cuda or 'none'}), triton {version('triton')}")
print("gpu-check: " + ", ".join(f"{n} {version(n)}" for n in (
    "pytest", "pytest-xdist", "numpy", "scipy", "matplotlib", "pyyaml", "nvidia-ml-py", "setuptools",
    "ruptures", "py-spy")))
main(["show", "--device", device, "--budgets-dir", budgets])
PY
plan tsv > "$R/plan.tsv"
if [ "$device" = cpu ]; then
    # The plan's tests as their [cpu] counterparts, where they exist.
    "$PY" -m pytest perf_tests --collect-only -q -m "not compiles" -p no:cacheprovider > "$WORK/collected.txt" 2>&1
    for part in update check a/a; do
        plan tests "$part" > "$WORK/planned.txt"
        mapfile -t "${part//\//}_tests" < <("$PY" "$REPORT" select "$WORK/collected.txt" "$WORK/planned.txt")
    done
    [ "${#update_tests[@]}" -gt 0 ] && [ "${#check_tests[@]}" -gt 0 ] && [ "${#aa_tests[@]}" -gt 0 ] \
        || setup_fail "a part of the plan has no [cpu] counterpart of its [cuda] tests collected"
fi
note_part set-up ok "$((SECONDS - t0))" - "perfbudget installed with no registry"
head -n 3 "$R/environment.txt"
pack

keep_budgets() {  # the budget files a pass wrote, and their diff, into what is packed
    mkdir -p "$R/budgets"
    for f in "$WORK"/budgets/*.yaml; do
        [ -f "$f" ] || continue
        cmp -s "$f" "$WORK/budgets-before/$(basename "$f")" || cp "$f" "$R/budgets/"
    done
    (cd "$WORK" && diff -ruN budgets-before budgets > "$R/budgets.diff" 2>/dev/null)
}

# -- compile (--compile: the lease's second command) ---------------------------------------
if [ -n "$compile" ]; then
    rc=0
    run_pass compile "$COMPILE_S" perf_tests -m "gpu and compiles" --update-budgets "${commit_args[@]}" || rc=1
    keep_budgets
    finish "$rc"
fi

# -- update: the GPU's budgets, written by the updater ------------------------------------
rc=0
run_pass update "$UPDATE_S" "${update_tests[@]}" --update-budgets "${commit_args[@]}" || rc=1
if "$PY" "$REPORT" unfinished "$R/update/results.json" && [ -f "$R/update/results.json" ]; then
    # Killed before pytest ended its session: the budgets of the tests it finished.
    # (`perfbudget update` as pytest --update-budgets would, with the commit passed.)
    echo "gpu-check: writing the budgets of the finished tests from the update pass's results"
    timeout 30 "$PY" - "$R/update/results.json" "$WORK/budgets" "$commit" >> "$R/update/log.txt" 2>&1 <<'PY' || rc=1
import sys
from perfbudget.budgets.loader import load_dir
from perfbudget.budgets.update import apply_updates, provenance_commit
from perfbudget.results import load_results
results, budgets, commit = sys.argv[1:]
report = apply_updates(load_results(results).measured(), load_dir(budgets), allow_loosen=False,
                       commit=provenance_commit(".", given=commit or None))
print(report.render())
sys.exit(1 if report.errors else 0)
PY
fi
keep_budgets
pack

# -- check: against them ----------------------------------------------------------------
if [ "$(bound "$CHECK_S")" -ge "$CHECK_MIN_S" ]; then
    run_pass check "$CHECK_S" "${stable[@]}" "${check_tests[@]}" || rc=1
else
    note_part check skipped - - "no time left before the deadline"
fi
pack

# -- a/a: the spread of a pair on this GPU -------------------------------------------------
aa_bound=$(bound "$AA_MAX_S")
if ! command -v git >/dev/null 2>&1; then
    note_part a/a skipped - - "no git on this machine: perfbudget ab needs a commit for each side"
elif [ "$aa_bound" -lt "$AA_MIN_S" ]; then
    note_part a/a skipped - - "${aa_bound} s left before the deadline, under the ${AA_MIN_S} s a pair takes"
else
    # Its own snapshot repository, so both sides are exactly this tree whatever the checkout's state.
    t0=$SECONDS
    aa=$WORK/aa-tree
    mkdir -p "$aa" "$R/aa"
    tar -cf - --exclude=./.git --exclude=./.perfbudget --exclude=./build --exclude='*.egg-info' \
        --exclude=./.venv --exclude=./.gpu-rehearsal . | tar -xf - -C "$aa"
    (
        cd "$aa" && git init -q && git add -A \
            && git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm "snapshot of ${shown_commit:-an unknown commit}"
    ) > "$R/aa/log.txt" 2>&1
    minutes=$(awk -v s="$aa_bound" 'BEGIN { printf "%.2f", s / 60 }')
    pairs=$(plan pairs)
    echo "gpu-check: a/a, $pairs pairs in $minutes min (at $(elapsed) s)"
    (
        cd "$aa" && timeout -s INT -k "$GRACE_S" "$((aa_bound + GRACE_S))" perfbudget ab --base HEAD \
            --min-pairs "$pairs" --max-pairs "$pairs" --max-minutes "$minutes" --out "$R/aa/results.json" \
            -- "${aa_tests[@]}" --budgets-dir "$WORK/budgets" -o perfbudget_html=false -o perfbudget_lease=true
    ) 2>&1 | tee -a "$R/aa/log.txt"
    aa_rc=${PIPESTATUS[0]}
    # An A/A that fails is a false alarm of the gate on this GPU: reported, not the check's exit.
    note_part a/a "$(status_of "$aa_rc")" "$((SECONDS - t0))" "$aa_bound" ""
fi
finish "$rc"
