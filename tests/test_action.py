"""The reusable action (``action.yml``) and its scripts (``perfbudget.github``), in a scratch user
repository under a simulated GitHub environment: an event payload, the step-summary and output
files, and a local stand-in for GitHub's API (``github_fake``). Two pushes keep one comment,
updated in place; the accept command the comment shows writes the budgets, and the change then
passes."""

from __future__ import annotations

import importlib.util
import io
import random
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from github_fake import BOT, PR, REPO, FakeGitHub, job_environ, serve

from perfbudget import github
from perfbudget.ab.merge import PairRecords, compare_pairs
from perfbudget.budgets import load_dir
from perfbudget.budgets.loader import BudgetSet
from perfbudget.cli import build_parser as perfbudget_parser
from perfbudget.cli import main as perfbudget_main
from perfbudget.device import DeviceInfo
from perfbudget.report import read_marker
from perfbudget.results import ABRunInfo, Record, Results, RunInfo, load_results
from perfbudget.verdict.judge import decide
from perfbudget.vocabulary import Outcome, RunMode

ROOT = Path(__file__).resolve().parents[1]
ACTION = ROOT / "action.yml"

RUNNER = DeviceInfo(type="cpu", model="Test CPU", count=2, torch="2.13.0+cpu", threads=1,
                    cpuid="6/207/2", isa_class="avx2")
"""The machine the timing budgets are keyed by (``cpu-test-cpu-6-207-2-avx2``): a stable runner."""
NODE = "perf_tests/test_model.py::test_train_step"
BUDGETS = {
    "budgets/cpu.yaml": "schema: 1\ndevice: {type: cpu}\nbudgets:\n  model-train:\n"
                        "    flops: {value: 2400000000, tolerance: 0.0}\n"
                        "    peak_allocated_mib[forward]: {value: 100.0, tolerance: 0.02}\n",
    f"budgets/{RUNNER.identity}.yaml":
        f"schema: 1\ndevice: {{type: cpu, identity: {RUNNER.identity}, threads: 1}}\n"
        "budgets:\n  model-train:\n    step_ms: {value: 10.0, tolerance: 0.05}\n",
}


@pytest.fixture
def api() -> Iterator[tuple[FakeGitHub, str]]:
    state = FakeGitHub()
    with serve(state) as url:
        yield state, url


# --------------------------------------------------------------------------- a user's repository


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=dev", "-c", "user.email=dev@example.invalid",
                           *args], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def side(budgets: BudgetSet, *, step_ms: float, flops: float, seed: int) -> list[Record]:
    """One side's records of one process pair, judged as a perf test judges them."""
    rng = random.Random(seed)
    values: dict[str, Any] = {"step_ms": [step_ms * (1 + rng.gauss(0, 0.01)) for _ in range(30)],
                              "flops": flops, "peak_allocated_mib[forward]": 99.5}
    verdicts = [decide("model-train", metric, xs, budgets.resolve("model-train", metric, RUNNER))
                for metric, xs in values.items()]
    return [Record.from_verdict(v, nodeid=NODE, device=RUNNER) for v in verdicts]


def ab_run(repo: Path, *, base: str, head: str, step_ms: float, flops: float) -> Results:
    """What ``perfbudget ab`` writes for a head that changed ``step_ms`` and ``flops``: three
    pairs merged by the A/B run's own merge, against a base at 10 ms and 2.4 GFLOP."""
    budgets = load_dir(repo / "budgets")
    pairs = [PairRecords(
        head=Results(records=side(budgets, step_ms=step_ms, flops=flops, seed=2 * i)),
        base=Results(records=side(budgets, step_ms=10.0, flops=2.4e9, seed=2 * i + 1)),
        index=i + 1) for i in range(3)]
    merged = compare_pairs(pairs, budgets=budgets, final=True, min_pairs=2)
    ab = {"base_ref": "main", "base_commit": base, "merge_base": True, "head_commit": head,
          "valid_pairs": 3}
    return Results(records=merged.records,
                   meta=RunInfo(budgets_dir=str(repo / "budgets"), mode=RunMode.AB, ab=ABRunInfo(**ab)))


@dataclass
class Job:
    """One job of the pull request's workflow: its environment, as GitHub Actions lays it out."""

    repo: Path
    home: Path
    api_url: str
    head: str

    def env(self) -> dict[str, str]:
        return job_environ(self.home, self.api_url, self.head)

    def step(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``python -m perfbudget.github ARGS`` as the action's step runs it."""
        return subprocess.run([sys.executable, "-m", "perfbudget.github", *args], cwd=self.repo,
                              env=self.env(), capture_output=True, text=True, timeout=120)

    def outputs(self) -> dict[str, str]:
        lines = (self.home / "output").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines)


def push(job: Job, results: Results) -> list[subprocess.CompletedProcess[str]]:
    """One push's publishing steps: the summary and folder to upload, then the comment."""
    path = results.write(job.repo / ".perfbudget" / "results-ab.json")
    out = job.home / "upload"
    prepared = job.step("prepare", str(path), "--out", str(out), "--title", "perf")
    commented = job.step("comment", str(out / path.name), "--title", "perf", f"--author={BOT}",
                         "--report-url=https://github.test/artifacts/1",
                         "--history-url=https://pages.test/history")
    return [prepared, commented]


def test_two_pushes_keep_one_comment_then_the_change_is_accepted_and_passes(
        tmp_path: Path, api: tuple[FakeGitHub, str], monkeypatch: pytest.MonkeyPatch) -> None:
    state, url = api
    for i in range(120):  # the pull request's own conversation: ours lands on the second page
        state.add(f"review note {i}")
    repo = tmp_path / "model"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, {**BUDGETS, ".gitignore": ".perfbudget/\n",
                         "src/model/__init__.py": "DEPTH = 2\n"}, "base")
    head = commit(repo, {"src/model/__init__.py": "DEPTH = 3\n"}, "deeper")
    job = Job(repo=repo, home=tmp_path / "runner", api_url=url, head=head)
    job.home.mkdir()

    steps = push(job, ab_run(repo, base=base, head=job.head, step_ms=11.0, flops=2.6e9))
    assert [s.returncode for s in steps] == [0, 0], [s.stdout + s.stderr for s in steps]
    summary = (job.home / "summary.md").read_text()
    assert summary.startswith("## ❌ perf: 2 fail, 1 pass")
    out = job.outputs()
    upload = Path(out["dir"])
    assert out["failed"] == "true" and out["results"] == str(upload / "results-ab.json")
    assert sorted(p.name for p in upload.iterdir()) == ["junit.xml", "report.html", "report.md",
                                                        "results-ab.json"]
    assert load_results(out["results"]).head_commit == job.head
    ours = [c for c in state.comments if read_marker(c["body"]) == ("perf", job.head)]
    assert len(ours) == 1 and ours[0]["user"]["login"] == BOT
    first = ours[0]["body"]
    step = (r"\| ❌ fail \| `model-train` `step_ms` \| base, 3 pairs \| \*\*\+(\d+\.\d)%\*\* "
            r"\| \+[\d.]+% to \+[\d.]+% \| ±[\d.]+% \| 5% \|")
    assert 8 < float(re.findall(step, first)[0]) < 12  # head 11 ms, base 10 ms
    assert re.search(r"\| ❌ fail \| `model-train` `flops` \| budget `budgets/cpu.yaml:\d+` "
                     r"\| \*\*\+8\.3%\*\* \(2\.6e\+09 vs 2\.4e\+09\) \| exact \| - \| 0% \|", first)
    assert ("[HTML report and results](https://github.test/artifacts/1) · "
            "[history](https://pages.test/history)") in first
    assert (f"created the comment of check 'perf' on pull request #{PR} as {BOT}: "
            f"{ours[0]['html_url']}") in steps[1].stdout
    assert [m for m, _ in state.calls] == ["GET", "GET", "POST"]  # two pages read, then created

    # The second push: the same comment, updated in place.
    job.head = commit(repo, {"src/model/__init__.py": "DEPTH = 4\n"}, "deeper still")
    state.calls.clear()
    steps = push(job, ab_run(repo, base=base, head=job.head, step_ms=11.5, flops=2.7e9))
    assert [s.returncode for s in steps] == [0, 0], [s.stdout + s.stderr for s in steps]
    ours = [c for c in state.comments if read_marker(c["body"]) == ("perf", job.head)]
    assert len(ours) == 1 and len(state.comments) == 121
    assert state.calls[-1] == ("PATCH", f"/repos/{REPO}/issues/comments/{ours[0]['id']}")
    assert ("POST", f"/repos/{REPO}/issues/{PR}/comments") not in state.calls
    assert "updated the comment" in steps[1].stdout
    body = ours[0]["body"]
    assert "**+12.5%** (2.7e+09 vs 2.4e+09)" in body
    assert 13 < float(re.findall(step, body)[0]) < 17  # head 11.5 ms
    assert (job.home / "summary.md").read_text().count("## ❌ perf: 2 fail, 1 pass") == 2

    # The reviewer accepts it with the very command the comment shows, on the downloaded results.
    command = next(line for line in body.splitlines() if line.startswith("perfbudget accept "))
    assert command == 'perfbudget accept results-ab.json --reason "<why this change is expected>"'
    (repo / "results-ab.json").write_bytes((upload / "results-ab.json").read_bytes())
    monkeypatch.chdir(repo)
    argv = shlex.split(command.replace("<why this change is expected>", "a deeper model, reviewed"))
    # The results claim the stable runner measured step_ms: no file proves it, so the timing is
    # refused here (not that machine) and written once the reviewer trusts the claim.
    said = io.StringIO()
    assert perfbudget_main(argv[1:], out=said) == 1
    assert (f"refused  {RUNNER.identity}.yaml  model-train.step_ms: the results claim "
            f"{RUNNER.identity}, which a results file cannot prove") in said.getvalue()
    said = io.StringIO()
    assert perfbudget_main([*argv[1:], "--trust-identity"], out=said) == 0
    assert said.getvalue().startswith(
        f"trusted machine identity {RUNNER.identity} (--trust-identity: the results' claim)\n")
    budgets = load_dir(repo / "budgets")
    for metric, value in (("flops", 2.7e9), ("step_ms", None)):
        b = budgets.resolve("model-train", metric, RUNNER)
        assert b is not None and b.provenance is not None
        assert (b.provenance.reason, b.provenance.commit) == ("a deeper model, reviewed", job.head)
        assert value is None or b.value == value
    # The next run passes: the accepted results judged again against the budgets now in the tree.
    accepted = load_results(repo / "results-ab.json")
    assert {r.outcome for r in accepted.records} >= {Outcome.FAIL}
    for r in accepted.records:
        assert r.value is not None
        budget = budgets.resolve(r.key, r.metric, RUNNER)
        again = decide(r.key, r.metric, list(r.samples) or r.value, budget)
        assert again.outcome in (Outcome.PASS, Outcome.STALE), (r.metric, again.reason)


def test_the_history_step_runs_the_actions_copy_of_the_script_in_the_users_checkout(
        tmp_path: Path, action: dict[str, Any]) -> None:
    """A push to the default branch, opted in: the step's own script, as the runner runs it."""
    remote = tmp_path / "remote.git"
    remote.mkdir()
    git(remote, "init", "-q", "--bare", "-b", "main")
    repo = tmp_path / "model"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, {**BUDGETS, ".gitignore": ".perfbudget/\n"}, "base")
    head = commit(repo, {"src/model/__init__.py": "DEPTH = 3\n"}, "deeper")
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    results = ab_run(repo, base=base, head=head, step_ms=10.2, flops=2.4e9)
    path = results.write(tmp_path / "results-ab.json")
    step = next(s for s in action["runs"]["steps"] if str(s["name"]).startswith("History"))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "GITHUB_ACTION_PATH": str(ROOT), "RESULTS": str(path), "OUT": str(tmp_path / "upload"),
           "TITLE": "perf", "PERFBUDGET_REPO": str(repo), "PERFBUDGET_BIN": "perfbudget",
           "PERFBUDGET_HISTORY_BRANCH": "perf-history", "PERFBUDGET_HISTORY_BACKOFF_S": "0"}
    runner = {"PATH", "HOME", "GITHUB_ACTION_PATH", "PERFBUDGET_HISTORY_BACKOFF_S"}
    assert set(step["env"]) == set(env) - runner
    (tmp_path / "upload").mkdir()
    done = subprocess.run(["bash", "-c", step["run"]], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"perf-history: {head[:12]} kept on perf-history" in done.stdout
    assert git(remote, "ls-tree", "--name-only", "perf-history") == "history.db"
    assert "<title>perf: history</title>" in (tmp_path / "upload" / "history.html").read_text()


def test_missing_results_are_said_in_the_summary_and_fail_the_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = Job(repo=tmp_path, home=tmp_path, api_url="http://127.0.0.1:9", head="a" * 40)
    assert github.main(["prepare", str(tmp_path / "nothing.json"), "--out", str(tmp_path / "up")],
                       environ=job.env()) == 2
    assert "## ⚠️ perf: no results" in (tmp_path / "summary.md").read_text()
    assert f"{tmp_path / 'nothing.json'}: cannot read results" in capsys.readouterr().out


def test_a_refused_results_file_is_named_in_the_summary_as_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from markdown_it import MarkdownIt

    job = Job(repo=tmp_path, home=tmp_path, api_url="http://127.0.0.1:9", head="a" * 40)
    name = "x<img src=https://evil.example/x.png>\n# PWNED @octocat #1.json"
    assert github.main(["prepare", str(tmp_path / name), "--out", str(tmp_path / "up")], environ=job.env()) == 2
    summary = (tmp_path / "summary.md").read_text()
    html = MarkdownIt("commonmark", {"html": True}).render(summary)
    assert "<img" not in html and "<h1>" not in html and "@octocat" not in html and "#1" not in html
    assert "img src" in summary  # named, as text
    error = [line for line in capsys.readouterr().out.splitlines() if line.startswith("::error::")]
    assert len(error) == 1 and "PWNED" in error[0]  # one workflow command, on one line


# --------------------------------------------------------------------------- running the checks


def test_the_check_command_for_each_event_and_mode() -> None:
    pr = github.GitHubEnv(event_name="pull_request",
                          event={"pull_request": {"number": PR, "base": {"sha": "b" * 40}}})
    push_env = github.GitHubEnv(event_name="push", event={"ref": "refs/heads/main"})
    cmd = github.check_command(mode="ab", results="r.json", env=pr, tests="perf_tests -m 'not gpu'",
                               pytest_args="-k 'enc or dec'", ab_args="--max-pairs 4", python="py")
    assert cmd == ["py", "-m", "perfbudget.cli", "ab", "--base", "b" * 40, "--merge-base",
                   "--out", "r.json", "--max-pairs", "4",
                   "--", "perf_tests", "-m", "not gpu", "-k", "enc or dec"]
    on_push = github.check_command(mode="ab", results="r.json", env=push_env, tests="t",
                                   python="py")
    assert on_push[4:8] == ["--base", "HEAD~1", "--out", "r.json"]  # a push: its first parent
    given = github.check_command(mode="ab", results="r.json", env=push_env, base="v1.2",
                                 python="py")
    assert given[4:6] == ["--base", "v1.2"]
    stored = github.check_command(mode="stored", results="r.json", env=pr, tests="perf_tests",
                                  python="py")
    assert stored == ["py", "-m", "pytest", "perf_tests", "--perf-json=r.json"]
    with pytest.raises(ValueError, match="mode: expected ab or stored, got 'fast'"):
        github.check_command(mode="fast", results="r.json", env=pr)
    with pytest.raises(ValueError, match="tests, pytest-args or ab-args: No closing quotation"):
        github.check_command(mode="ab", results="r.json", env=pr, pytest_args="-k 'enc")
    # The ab command parses as perfbudget's own.
    assert perfbudget_parser().parse_args(cmd[3:]).merge_base is True


# --------------------------------------------------------------------------- action.yml


@pytest.fixture(scope="module")
def action() -> dict[str, Any]:
    return dict(yaml.safe_load(ACTION.read_text()))


def test_action_matches_githubs_schema() -> None:
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema is not installed (it comes with `pip install -e .[dev]`)")
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.github-actions", str(ACTION)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _scripts(action: dict[str, Any]) -> list[str]:
    return [str(s["run"]) for s in action["runs"]["steps"] if "run" in s]


def test_action_steps_take_inputs_from_the_environment_and_run_what_parses(
        action: dict[str, Any]) -> None:
    steps = action["runs"]["steps"]
    assert action["runs"]["using"] == "composite"
    used = set(re.findall(r"inputs\.([a-z-]+)", ACTION.read_text()))
    assert used == set(action["inputs"]), "every input is used, every used input declared"
    # Expressions never splice into a script (a branch name or title could run as code).
    assert all("${{" not in script for script in _scripts(action))
    assert all(s.get("shell") == "bash" for s in steps if "run" in s)
    names = [s["name"] for s in steps]
    order = ["Set up (torch, perfbudget, the project)", "Perf checks",
             "Job summary and the folder to upload", "Upload the results and reports",
             "The pull request's comment (created once, updated on each push)"]
    assert [n for n in names if n in order] == order
    after_run = steps[names.index("Perf checks") + 1:]
    assert all("!cancelled()" in s["if"] for s in after_run)  # a failing check still publishes
    comment = steps[names.index(order[-1])]
    assert "startsWith(github.event_name, 'pull_request')" in comment["if"]
    assert comment["env"]["REPORT_URL"] == "${{ steps.upload.outputs.artifact-url }}"
    history = next(s for s in steps if str(s["name"]).startswith("History"))
    assert "inputs.history == 'true'" in history["if"]
    assert "github.event_name == 'push'" in history["if"]
    assert (ROOT / "scripts" / "perf-history.sh").is_file()
    # Each perfbudget command of the scripts parses.
    parsed = []
    for script in _scripts(action):
        for line in script.replace("\\\n", " ").splitlines():
            line = re.sub(r'"?--([a-z-]+)=\$[A-Z_]+"?', r"--\1=x", line.strip())
            line = line.replace("$MODE", "ab")
            argv = shlex.split(re.sub(r"\$[A-Z_]+", "x", line)) if "perfbudget" in line else []
            if argv[:3] == ["python", "-m", "perfbudget.github"]:
                parsed.append(github.build_parser().parse_args(argv[3:]).command)
            elif argv[:1] == ["perfbudget"]:
                parsed.append(perfbudget_parser().parse_args(argv[1:]).command)
    assert parsed == ["run", "prepare", "history", "comment"]
    setup = "\n".join(_scripts(action))
    # No GPU: torch's CPU build, pinned.
    assert "--index-url https://download.pytorch.org/whl/cpu \"torch==$TORCH+cpu\"" in setup


def test_each_python_the_action_runs_leaves_the_working_folder_off_its_path(action: dict[str, Any]) -> None:
    """``python -m pip`` (or ``-m perfbudget.github``) with the working folder on ``sys.path`` runs a
    ``pip/__main__.py`` a pull request commits. Only the step that runs the project's own tests keeps
    it: pytest and the project's code run there by design."""
    for step in action["runs"]["steps"]:
        runs_python = re.search(r"(^|[\s;(])python3? ", str(step.get("run", "")))
        if runs_python and step["name"] != "Perf checks":
            safe = step.get("env", {}).get("PYTHONSAFEPATH") == "1" or "python -P" in step["run"]
            assert safe, f"{step['name']}: runs python without PYTHONSAFEPATH=1 or -P"


def test_this_repositorys_workflows_use_the_action_with_declared_inputs(
        action: dict[str, Any]) -> None:
    """``perf.yml`` publishes the merged results read-only; ``perf-comment.yml`` comments from its
    artifact in a job that runs none of the pull request's code."""
    flows = {name: yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
             for name in ("perf.yml", "perf-comment.yml")}
    uses = [(name, job, s["with"]) for name, wf in flows.items() for job, j in wf["jobs"].items()
            for s in j["steps"] if s.get("uses") == "./"]
    assert [(name, job) for name, job, _ in uses] == [("perf.yml", "report"),
                                                      ("perf-comment.yml", "comment")]
    for _, _, given in uses:
        assert set(given) <= set(action["inputs"]) and given["mode"] == "report"
    assert uses[0][2]["results"] == "perf-report/results.json"
    assert uses[0][2]["comment"] is False and uses[0][2]["artifact"] == "perf-report"
    assert flows["perf.yml"]["jobs"]["report"]["permissions"] == {"contents": "read"}
    comment = flows["perf-comment.yml"]["jobs"]["comment"]
    assert comment["permissions"]["pull-requests"] == "write"
    assert flows["perf-comment.yml"][True]["workflow_run"]["workflows"] == [flows["perf.yml"]["name"]]
    download = next(s for s in comment["steps"] if "download-artifact" in s.get("uses", ""))
    assert download["with"]["name"] == "perf-report" and download["continue-on-error"] is True
    # The write-token job: the untrusted artifact outside the checkout that `uses: ./` and its pip install
    # read, and no token left in .git.
    assert download["with"]["path"] == "${{ runner.temp }}/perf-report"
    assert uses[1][2]["results"] == "${{ runner.temp }}/perf-report/results.json"
    checkouts = [s for s in comment["steps"] if str(s.get("uses", "")).startswith("actions/checkout")]
    assert checkouts and all(s["with"]["persist-credentials"] is False for s in checkouts)
