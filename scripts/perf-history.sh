#!/usr/bin/env bash
# Keep a results file in the main-branch history, which lives on its own branch (default
# perf-history, one file: history.db), and push it back. What the push-to-main job runs after the
# A/B against the parent; the database is left at .perfbudget/history/history.db for
# `perfbudget history report` and `perfbudget history check`.
#
# Two jobs may push at once: a push that is not a fast-forward fetches the branch again, adds the
# results to the newer database (idempotent per commit, machine and mode) and pushes again. A
# concurrency group would not do: GitHub cancels a pending run when a newer one queues, and a
# cancelled run is a merge missing from the chain.
#   PERFBUDGET_HISTORY_BRANCH  the branch (default perf-history); created, without history, when absent
#   PERFBUDGET_HISTORY_REMOTE  the remote (default origin)
#   PERFBUDGET_HISTORY_BACKOFF_S  seconds between attempts, times the attempt (default 3)
#   PERFBUDGET_REPO  the checkout (default this script's; action.yml runs it from the action's copy)
#   PERFBUDGET_BIN   the perfbudget command (default .venv/bin/perfbudget)
# Usage: scripts/perf-history.sh RESULTS.json [perfbudget history add options]
set -euo pipefail
cd "${PERFBUDGET_REPO:-$(dirname "$0")/..}"
perfbudget=${PERFBUDGET_BIN:-.venv/bin/perfbudget}
results=${1:?usage: scripts/perf-history.sh RESULTS.json [history add options]}
shift
branch=${PERFBUDGET_HISTORY_BRANCH:-perf-history}
remote=${PERFBUDGET_HISTORY_REMOTE:-origin}
tree=.perfbudget/history-branch
out=.perfbudget/history
commit=$(git rev-parse HEAD)
git config user.name >/dev/null || git config user.name "perfbudget history"
git config user.email >/dev/null || git config user.email "perfbudget-history@users.noreply.github.com"

for attempt in 1 2 3 4 5; do
    git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
    git worktree prune
    if git fetch -q "$remote" "refs/heads/$branch" 2>/dev/null; then
        git worktree add -q --detach "$tree" FETCH_HEAD
    else
        echo "perf-history: no branch $branch on $remote yet: starting it"
        git worktree add -q --detach "$tree" HEAD
        git -C "$tree" checkout -q --orphan "$branch"
        git -C "$tree" rm -rfq --cached . && find "$tree" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
    fi
    "$perfbudget" history add "$results" --db "$tree/history.db" "$@"
    git -C "$tree" add history.db
    # Nothing staged: the run was re-added as it was. Any other failure of the commit (a hook, no
    # identity, a full disk) ends the script: the push would only repeat the branch without the run.
    if ! git -C "$tree" diff --cached --quiet; then
        git -C "$tree" commit -qm "perf history: add ${commit:0:12}"
    fi
    if git -C "$tree" push -q "$remote" "HEAD:refs/heads/$branch"; then
        mkdir -p "$out" && cp "$tree/history.db" "$out/history.db"
        echo "perf-history: ${commit:0:12} kept on $branch (attempt $attempt)"
        exit 0
    fi
    echo "perf-history: $branch moved meanwhile: fetching it again" >&2
    sleep $((attempt * ${PERFBUDGET_HISTORY_BACKOFF_S:-3}))
done
echo "perf-history: could not push $branch after 5 attempts" >&2
exit 1
