"""``scripts/perf-history.sh``: the history kept on its own branch of a remote, started when absent,
appended by later pushes, and re-applied when the branch moved meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from history_support import ab_results

ROOT = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def seeded_remote(tmp: Path) -> Path:
    """A bare remote whose main holds one commit (a .gitignore), pushed from a seed clone."""
    remote = tmp / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    seed = tmp / "seed"
    subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True)
    (seed / ".gitignore").write_text(".venv\n.perfbudget/\n")
    git(seed, "add", ".gitignore")
    git(seed, "commit", "-q", "-m", "first")
    git(seed, "remote", "add", "origin", str(remote))
    git(seed, "push", "-q", "origin", "main")
    return remote


def clone_with_script(remote: Path, where: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(remote), str(where)], check=True)
    (where / "scripts").mkdir(exist_ok=True)
    (where / "scripts" / "perf-history.sh").write_text((ROOT / "scripts" / "perf-history.sh").read_text())
    (where / "scripts" / "perf-history.sh").chmod(0o755)
    (where / ".venv").symlink_to(Path(sys.prefix))  # this interpreter's perfbudget
    return where


def push_commit(repo: Path, message: str) -> tuple[str, str]:
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    git(repo, "push", "-q", "origin", "HEAD:main")
    return git(repo, "rev-parse", "HEAD"), git(repo, "rev-parse", "HEAD~1")


def keep(repo: Path, head: str, parent: str) -> subprocess.CompletedProcess[str]:
    results = ab_results(head, parent, [1.01, 1.02]).write(repo / ".perfbudget" / "results-ab.json")
    env = {**os.environ, "PERFBUDGET_HISTORY_BACKOFF_S": "0", "GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@ci", "GIT_COMMITTER_NAME": "ci",
           "GIT_COMMITTER_EMAIL": "ci@ci"}
    return subprocess.run(["bash", "scripts/perf-history.sh", str(results)], cwd=repo, capture_output=True,
                          text=True, env=env, timeout=120)


def test_the_history_branch_is_started_then_appended_from_two_clones(tmp_path: Path) -> None:
    remote = seeded_remote(tmp_path)

    a = clone_with_script(remote, tmp_path / "a")
    head, parent = push_commit(a, "second")
    done = keep(a, head, parent)
    assert done.returncode == 0, done.stderr
    assert "starting it" in done.stdout and (a / ".perfbudget" / "history" / "history.db").is_file()

    # Two jobs at once: b's first push races a's (a hook runs a's job between b's commit and its
    # push), is refused as not a fast-forward, and b adds its run to the newer database.
    b = clone_with_script(remote, tmp_path / "b")
    head2, parent2 = push_commit(b, "third")
    git(a, "pull", "-q", "origin", "main")
    head3, parent3 = push_commit(a, "fourth")
    results_a = ab_results(head3, parent3, [1.0, 1.0]).write(a / ".perfbudget" / "results-ab.json")
    hook = b / ".git" / "hooks" / "post-commit"
    hook.write_text(f"#!/bin/sh\n[ -e {tmp_path}/raced ] && exit 0\ntouch {tmp_path}/raced\n"
                    f"cd {a} && env -u GIT_DIR -u GIT_INDEX_FILE -u GIT_WORK_TREE bash scripts/perf-history.sh "
                    f"{results_a} >/dev/null\n")
    hook.chmod(0o755)
    done = keep(b, head2, parent2)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "raced").exists() and "moved meanwhile" in done.stderr

    log = git(b, "log", "--format=%s", "origin/perf-history")
    assert log.splitlines() == [f"perf history: add {c[:12]}" for c in (head2, head3, head)]
    from perfbudget.history import HistoryStore

    with HistoryStore(b / ".perfbudget" / "history" / "history.db") as store:
        assert sorted(r.commit for r in store.runs()) == sorted([head, head2, head3])


def test_a_commit_that_fails_fails_the_script_and_pushes_nothing(tmp_path: Path) -> None:
    remote = seeded_remote(tmp_path)
    a = clone_with_script(remote, tmp_path / "a")
    head, parent = push_commit(a, "second")
    assert keep(a, head, parent).returncode == 0
    kept = git(a, "ls-remote", "origin", "refs/heads/perf-history")

    head2, parent2 = push_commit(a, "third")
    hook = a / ".git" / "hooks" / "pre-commit"  # the history worktree's commits run the clone's hooks
    hook.write_text("#!/bin/sh\necho 'pre-commit: refused' >&2\nexit 1\n")
    hook.chmod(0o755)
    done = keep(a, head2, parent2)
    assert done.returncode != 0 and "pre-commit: refused" in done.stderr, done.stdout + done.stderr
    assert "kept on perf-history" not in done.stdout
    assert git(a, "ls-remote", "origin", "refs/heads/perf-history") == kept
