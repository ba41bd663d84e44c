#!/usr/bin/env bash
# The pull-request and push-to-main perf check on any machine: timing judged by lockstep A/B
# against the base commit, measured here in this one job; exact, memory and numeric checks
# against the stored budgets (and shown against the base).
#   base: $PERFBUDGET_AB_BASE; else $PERFBUDGET_AB_PUSH_BEFORE (a push event's `before`: the
#   branch before the push) when it is a commit of this checkout, an ancestor of HEAD and not HEAD,
#   so a push of several commits is one run against the previous push's head, a link of the
#   history's chain; else HEAD~1, the first parent (for a merge into main: main before it).
#   With PERFBUDGET_AB_MERGE_BASE=1 the merge-base of HEAD and the base is used (a pull request
#   against its target branch).
# Extra arguments go to `perfbudget ab` before the pytest arguments, e.g. --max-pairs 4.
# Usage: scripts/perf-ab.sh [ab options]        (set-up included, as scripts/perf.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null

base=${PERFBUDGET_AB_BASE:-HEAD~1}
if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "perf-ab: not a git checkout: a lockstep A/B needs the base commit's history" >&2
    exit 2
fi
before=${PERFBUDGET_AB_PUSH_BEFORE:-}
if [ -z "${PERFBUDGET_AB_BASE:-}" ] && [ -n "$before" ]; then
    # All zeros: the push created the branch. Not an ancestor: a force push. Neither is a base.
    if [ -n "${before//0/}" ] && before_sha=$(git rev-parse --verify -q "${before}^{commit}") \
        && [ "$before_sha" != "$(git rev-parse HEAD)" ] && git merge-base --is-ancestor "$before_sha" HEAD; then
        base=$before_sha
        echo "perf-ab: base ${base:0:12}, the branch before this push ($(git rev-list --count "$base..HEAD") commit(s))" >&2
    else
        echo "perf-ab: the push's before ${before:0:12} is not an earlier commit of HEAD here (a new branch," \
             "a force push): base HEAD~1" >&2
    fi
fi
if ! git rev-parse --verify -q "${base}^{commit}" >/dev/null; then
    if [ "$(git rev-parse --is-shallow-repository)" = "true" ]; then
        echo "perf-ab: the base $base is not in this shallow clone: fetch the history" \
             "(git fetch --unshallow, or actions/checkout with fetch-depth: 0)" >&2
    elif [ "$base" = "HEAD~1" ] && [ -z "$(git rev-list --parents -n 1 HEAD | cut -s -d' ' -f2)" ]; then
        echo "perf-ab: HEAD is the first commit: there is no parent to compare timing with;" \
             "run scripts/perf.sh (stored budgets) instead" >&2
    else
        echo "perf-ab: the base $base is not a commit in this checkout" >&2
    fi
    exit 2
fi
merge=()
[ "${PERFBUDGET_AB_MERGE_BASE:-0}" = "1" ] && merge=(--merge-base)
mkdir -p .perfbudget
ab() { .venv/bin/perfbudget ab --base "$base" "${merge[@]}" "$@"; }

# Instructions per step (callgrind): both sides at once, one pair, on every CPU but the last,
# alongside the timing pairs, which take turns on the last CPU (the ISA path and the counts do
# not depend on the load). PERFBUDGET_AB_INSTRUCTIONS=0 leaves them to the timing run, as does
# a machine without valgrind or a second CPU: there they are reported unmeasurable, with how
# to measure them.
cpus=$(.venv/bin/python -c 'import os; c = sorted(os.sched_getaffinity(0)); print(",".join(map(str, c[:-1])))')
instructions=0
timing=(perf_tests)
if [ "${PERFBUDGET_AB_INSTRUCTIONS:-1}" != "0" ] && command -v valgrind >/dev/null 2>&1 && [ -n "$cpus" ]; then
    instructions=1
    timing=(perf_tests -m "not instructions")
    rm -f .perfbudget/results-ab-instructions.json
    ab --instructions --cpus "$cpus" --max-minutes 20 --out .perfbudget/results-ab-instructions.json \
        -- perf_tests -m instructions -p no:randomly --durations=0 > .perfbudget/ab-instructions.log 2>&1 &
    pid=$!
fi
set +e
ab --out .perfbudget/results-ab.json "$@" -- "${timing[@]}"
rc=$?
if [ "$instructions" = "1" ]; then
    wait "$pid"
    irc=$?
    sed 's/^/[instructions] /' .perfbudget/ab-instructions.log >&2
    if [ -f .perfbudget/results-ab-instructions.json ]; then
        # One report: the counts beside the timing checks.
        .venv/bin/perfbudget merge .perfbudget/results-ab.json .perfbudget/results-ab-instructions.json \
            -o .perfbudget/results-ab.json || rc=2
    fi
    [ "$irc" -gt "$rc" ] && rc=$irc
fi
exit "$rc"
