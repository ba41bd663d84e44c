"""Whose comment the action updates (``perfbudget.github comment``), against a local fake of
GitHub's API: only its own identity's, with this check's marker, not minimized; one per check;
a 403 fails; a fork's pull request gets none; the head commit is named, and a push without results
marks the comment stale."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from github_fake import BOT, PR, REPO, TOKEN, FakeGitHub, job_environ, serve

from perfbudget import github
from perfbudget.device import DeviceInfo
from perfbudget.report import COMMENT_MARKER, comment_marker, read_marker
from perfbudget.results import Record, Results
from perfbudget.vocabulary import Outcome

ROOT = Path(__file__).resolve().parents[1]
CPU = DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1, cpuid="6/207/2", isa_class="avx2")
HEAD = "1234567890abcdef" * 2 + "12345678"
NEXT = "fedcba0987654321" * 2 + "fedcba09"
PAT = "ghp_maintainers-token"


@pytest.fixture
def gh() -> Iterator[tuple[FakeGitHub, str]]:
    state = FakeGitHub(logins={TOKEN: BOT, PAT: "perf-bot"})
    with serve(state) as url:
        yield state, url


def results_file(tmp_path: Path, outcome: Outcome = Outcome.FAIL) -> str:
    record = Record(nodeid="t.py::test_a", key="enc", metric="flops", outcome=outcome, value=2.0,
                    kind="exact", direction="lower", device=CPU)
    return str(Results(records=[record]).write(tmp_path / "results.json"))


def comment(tmp_path: Path, url: str, *args: str, results: str = "", head: str = HEAD,
            job: str = "perf", author: str = BOT, **environ: Any) -> int:
    """One comment step, as the action runs it (the workflow token passes its login)."""
    env = job_environ(tmp_path, url, head, job=job, **environ)
    argv = ["comment", results or results_file(tmp_path), *args,
            *([f"--author={author}"] if author else [])]
    return github.main(argv, environ=env)


def test_a_forged_marker_is_left_alone_and_ours_is_posted_then_updated(
        tmp_path: Path, gh: tuple[FakeGitHub, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, url = gh
    forged = [state.add(comment_marker("perf", HEAD) + "\nmine now", login="mallory"),
              state.add(COMMENT_MARKER + "\nmine too", login="mallory")]
    assert comment(tmp_path, url) == 0
    assert [c["body"] for c in forged] == [comment_marker("perf", HEAD) + "\nmine now",
                                           COMMENT_MARKER + "\nmine too"]
    ours = state.by(BOT)
    assert len(ours) == 1 and read_marker(ours[0]["body"]) == ("perf", HEAD)
    assert comment(tmp_path, url, head=NEXT) == 0
    assert state.by(BOT) == ours and read_marker(ours[0]["body"]) == ("perf", NEXT)
    assert len(state.comments) == 3 and "updated the comment of check 'perf'" in capsys.readouterr().out


def test_two_jobs_keep_two_comments_and_a_bare_marker_is_adopted_once(
        tmp_path: Path, gh: tuple[FakeGitHub, str]) -> None:
    state, url = gh
    old = state.add(COMMENT_MARKER + "\n### ✅ perf: 1 pass", login=BOT)
    assert comment(tmp_path, url, job="cpu") == 0  # the older action's comment becomes cpu's
    assert comment(tmp_path, url, job="gpu") == 0
    assert comment(tmp_path, url, "--check-name=perf (h200)", job="gpu") == 0  # a matrix entry
    checks = [read_marker(c["body"]) for c in state.by(BOT)]
    assert checks == [("cpu", HEAD), ("gpu", HEAD), ("perf (h200)", HEAD)]
    assert state.by(BOT)[0] is old
    for job in ("cpu", "gpu"):
        assert comment(tmp_path, url, head=NEXT, job=job) == 0
    assert [read_marker(c["body"]) for c in state.by(BOT)] == [
        ("cpu", NEXT), ("gpu", NEXT), ("perf (h200)", HEAD)]
    # A name cannot close the marker's HTML comment.
    assert comment_marker("x --> <b>", HEAD).count("-->") == 1
    assert read_marker(comment_marker("x --> <b>", HEAD)) == ("x --> <b>", HEAD)


def test_a_minimized_comment_is_not_updated_and_graphql_unavailable_skips_that_test(
        tmp_path: Path, gh: tuple[FakeGitHub, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, url = gh
    hidden = state.add(comment_marker("perf", HEAD) + "\nold", login=BOT)
    state.minimized.add(hidden["id"])
    assert comment(tmp_path, url) == 0
    assert hidden["body"].endswith("\nold") and len(state.by(BOT)) == 2
    assert f"comment {hidden['id']} is minimized: not updated" in capsys.readouterr().out
    # Without GraphQL the minimized test is skipped, and said: the first of ours is updated.
    state.graphql = False
    assert comment(tmp_path, url) == 0
    assert not hidden["body"].endswith("\nold") and len(state.by(BOT)) == 2
    assert "cannot tell whether our comment is minimized" in capsys.readouterr().out


def test_a_token_of_its_own_is_asked_who_it_is(tmp_path: Path, gh: tuple[FakeGitHub, str]) -> None:
    state, url = gh
    bots = state.add(comment_marker("perf", HEAD) + "\nthe workflow token's", login=BOT)
    assert comment(tmp_path, url, author="", token=PAT) == 0
    assert ("POST", "/graphql") in state.calls  # viewer { login }
    assert [read_marker(c["body"]) for c in state.by("perf-bot")] == [("perf", HEAD)]
    assert bots["body"].endswith("the workflow token's")
    # The workflow's token cannot ask: without --author the step fails, naming the answer.
    assert comment(tmp_path, url, author="") == 1


def test_a_403_fails_the_step_and_only_a_forks_pull_request_goes_without(
        tmp_path: Path, gh: tuple[FakeGitHub, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, url = gh
    ours = state.add(comment_marker("perf", HEAD) + "\nold", login=BOT)
    state.refuse = {"PATCH", "POST"}
    assert comment(tmp_path, url) == 1
    said = capsys.readouterr().out
    assert f"::error::perfbudget: PATCH {url}/repos/{REPO}/issues/comments/{ours['id']}: HTTP 403" in said
    assert "give the job `permissions: pull-requests: write`" in said
    state.refuse = {"POST"}
    state.comments.clear()
    assert comment(tmp_path, url) == 1 and "HTTP 403" in capsys.readouterr().out
    # A fork's pull request (head repository not the base one): no call, a warning, the job goes on.
    state.calls.clear()
    assert comment(tmp_path, url, head_repo="mallory/model") == 0
    assert state.calls == [] and "a pull request from a fork" in capsys.readouterr().out
    # A run Dependabot started comes from this repository, yet with a read-only token too.
    assert comment(tmp_path, url, actor="dependabot[bot]") == 0
    assert state.calls == [] and "a pull request's run Dependabot started" in capsys.readouterr().out


def test_who_started_the_run_decides_dependabots_read_only_token_not_who_opened_the_pull_request(
        tmp_path: Path, gh: tuple[FakeGitHub, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, url = gh
    pr = {"number": PR, "user": {"login": "dependabot[bot]"}, "head": {"sha": HEAD, "repo": {"full_name": REPO}},
          "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": REPO}}}
    event = {"action": "synchronize", "number": PR, "pull_request": pr}
    # A maintainer's push to Dependabot's pull request: a write token, so the comment is written.
    assert comment(tmp_path, url, event=event, actor="maintainer") == 0
    assert len(state.by(BOT)) == 1 and "Dependabot" not in capsys.readouterr().out
    state.calls.clear()
    assert comment(tmp_path, url, event=event, actor="dependabot[bot]") == 0
    assert state.calls == [] and "Dependabot started" in capsys.readouterr().out


def test_the_comment_names_the_head_and_a_push_without_results_marks_it_stale(
        tmp_path: Path, gh: tuple[FakeGitHub, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, url = gh
    assert comment(tmp_path, url) == 0
    body = state.by(BOT)[0]["body"]
    assert f"Judged `{HEAD[:12]}` · Against the stored budgets" in body
    # Stored results name no commit: the accept command names the head, not the merge commit.
    assert f"--commit {HEAD} --reason" in body and "c" * 40 not in body
    missing = str(tmp_path / "none.json")
    assert comment(tmp_path, url, results=missing, head=NEXT) == 2
    stale = state.by(BOT)[0]["body"]
    note = f"> ⚠️ **Stale:** no results for `{NEXT[:12]}`: this comment judged `{HEAD[:12]}`."
    assert stale.splitlines()[:3] == [comment_marker("perf", HEAD), note, ""]
    assert stale.endswith(body.partition("\n")[2])
    assert "marked the comment stale" in capsys.readouterr().out
    third = "0" * 40
    assert comment(tmp_path, url, results=missing, head=third) == 2  # the note is replaced, not stacked
    again = state.by(BOT)[0]["body"]
    assert again.count("**Stale:**") == 1 and f"no results for `{third[:12]}`" in again
    assert comment(tmp_path, url, head=third) == 0
    assert "Stale" not in state.by(BOT)[0]["body"] and len(state.by(BOT)) == 1


def test_a_workflow_run_comments_on_the_pull_request_its_head_names(
        tmp_path: Path, gh: tuple[FakeGitHub, str]) -> None:
    state, url = gh
    state.pulls = [{"number": 6, "head": {"sha": NEXT, "ref": "topic",
                                          "repo": {"owner": {"login": "mallory"}}}},
                   {"number": PR, "head": {"sha": HEAD, "ref": "topic",
                                           "repo": {"owner": {"login": "mallory"}}}}]
    run = {"workflow_run": {"event": "pull_request", "head_sha": HEAD, "head_branch": "topic",
                            "head_repository": {"owner": {"login": "mallory"}},
                            "pull_requests": []}}
    assert comment(tmp_path, url, event_name="workflow_run", event=run) == 0
    assert [read_marker(c["body"]) for c in state.by(BOT)] == [("perf", HEAD)]
    # A run whose head no open pull request has: nothing to comment on.
    run["workflow_run"]["head_sha"] = "9" * 40
    assert comment(tmp_path, url, event_name="workflow_run", event=run) == 0
    assert len(state.comments) == 1
    bad = {"workflow_run": {**run["workflow_run"], "head_sha": "$(reboot)"}}
    assert comment(tmp_path, url, event_name="workflow_run", event=bad) == 2


# --------------------------------------------------------------------------- pull_request_target


def test_pull_request_target_runs_no_tests() -> None:
    target = github.GitHubEnv(event_name="pull_request_target", event={"number": PR})
    with pytest.raises(ValueError, match="pull_request_target: refused"):
        github.check_command(mode="ab", results="r.json", env=target)
    guard = yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"][0]
    assert "if" not in guard and set(guard["env"]) == {"EVENT", "MODE"}

    def run(event: str, mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", guard["run"]], env={"EVENT": event, "MODE": mode},
                              capture_output=True, text=True, timeout=30)

    refused = run("pull_request_target", "ab")
    assert refused.returncode == 1 and "under pull_request_target" in refused.stdout
    assert run("pull_request_target", "stored").returncode == 1
    assert run("pull_request_target", "report").returncode == 0
    assert run("pull_request", "ab").returncode == 0
    assert "mode: expected ab, stored or report, got 'fast'" in run("push", "fast").stdout
