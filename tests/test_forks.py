"""The docs' workflows, used as-is: every ``# .github/workflows/…`` YAML block of the docs matches
GitHub's schema, and no job that runs a pull request's code holds a write scope; the "Pull requests
from forks" page's two workflows fit together (trigger, artifact, results file, mode report)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ACTION = "OWNER/perfbudget@v1"


def workflows(page: str) -> dict[str, dict[str, Any]]:
    """``path -> workflow`` of the page's fenced YAML blocks that begin ``# .github/workflows/``
    (``page`` relative to the repository; a block indented inside a list item is dedented)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    out = {}
    for _indent, block in re.findall(r"^( *)```yaml\n(.*?)^\1```", text, flags=re.S | re.M):
        code = textwrap.dedent(block)
        if m := re.match(r"# (\.github/workflows/[\w.-]+\.yml)", code):
            wf = yaml.safe_load(code)
            wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as true
            out[m.group(1)] = wf | {"text": code}
    return out


FORKS = workflows("docs/forks.md")
EXAMPLES = {f"{page}: {path}": wf for page in ("docs/forks.md", "docs/pr-checks.md", "docs/getting-started.md",
                                               "README.md")
            for path, wf in workflows(page).items()}


def test_the_docs_show_their_workflows() -> None:
    assert list(FORKS) == [".github/workflows/perf.yml", ".github/workflows/perf-comment.yml"]
    assert list(EXAMPLES)[2:] == [f"{page}: .github/workflows/perf.yml"
                                  for page in ("docs/pr-checks.md", "docs/getting-started.md", "README.md")]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_a_docs_workflow_matches_githubs_schema(name: str, tmp_path: Path) -> None:
    path = tmp_path / "workflow.yml"
    path.write_text(EXAMPLES[name]["text"], encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.github-workflows", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _runs_pr_code(wf: dict[str, Any], job: dict[str, Any]) -> bool:
    """A job of a pull_request workflow that runs a command or the action in a mode that runs
    tests (anything but ``report``)."""
    if "pull_request" not in wf["on"]:
        return False
    return any("run" in s or (s.get("uses") == ACTION and s["with"].get("mode") != "report")
               for s in job["steps"])


def _writes(permissions: Any) -> list[str]:
    if permissions in ("write-all",):
        return ["write-all"]
    return [k for k, v in (permissions or {}).items() if v == "write"]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_no_job_that_runs_a_pull_requests_code_holds_a_write_scope(name: str) -> None:
    wf = EXAMPLES[name]
    assert "pull_request_target" not in wf["on"]
    assert "permissions" in wf and not _writes(wf["permissions"]), "the default is read-only"
    running = [j for j in wf["jobs"].values() if _runs_pr_code(wf, j)]
    assert running or "workflow_run" in wf["on"]
    for job in running:
        assert not _writes(job.get("permissions")), (name, job)
    # A job that holds a write scope runs no command and the action only in mode report.
    for job in wf["jobs"].values():
        if _writes(job.get("permissions")):
            mine = [s for s in job["steps"] if s.get("uses") == ACTION]
            assert mine and all(s["with"]["mode"] == "report" for s in mine)
            assert not any("run" in s for s in job["steps"])
            assert not any("ref" in (s.get("with") or {}) for s in job["steps"])  # no PR head


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_run_of_the_action_in_a_workflow_uploads_under_its_own_name(name: str) -> None:
    # upload-artifact refuses a name already used in the workflow run: a second run of the action
    # (the publish job's report) names its own artifact.
    names = [(s.get("with") or {}).get("artifact", "perf-results")
             for job in EXAMPLES[name]["jobs"].values() for s in job["steps"] if s.get("uses") == ACTION]
    assert len(names) == len(set(names)), (name, names)


def test_the_two_fork_workflows_fit_together() -> None:
    tests_wf, comment_wf = FORKS.values()
    [tests_job] = tests_wf["jobs"].values()
    [comment_job] = comment_wf["jobs"].values()
    assert list(tests_wf["on"]) == ["pull_request"]
    assert comment_wf["on"]["workflow_run"]["workflows"] == [tests_wf["name"]]
    assert "github.event.workflow_run.event == 'pull_request'" in comment_job["if"]
    run = next(s["with"] for s in tests_job["steps"] if s.get("uses") == ACTION)
    post = next(s["with"] for s in comment_job["steps"] if s.get("uses") == ACTION)
    assert run["comment"] is False and post["mode"] == "report"
    download = next(s for s in comment_job["steps"] if "download-artifact" in s["uses"])
    assert download["with"]["name"] == run["artifact"]
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert post["results"] == f"{download['with']['path']}/results.json"  # the action's default name
    assert download["with"]["path"].startswith("${{ runner.temp }}/")  # untrusted: outside the workspace
    assert post["artifact"] != run["artifact"]
    assert comment_job["permissions"] == {"actions": "read", "pull-requests": "write"}
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["inputs"]["results"]["default"].endswith("/results.json")
    assert set(run) | set(post) <= set(action["inputs"])
    assert not any("checkout" in s["uses"] for s in comment_job["steps"])
