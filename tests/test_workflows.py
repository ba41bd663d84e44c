"""The pull-request check as files: workflow schema, job shape, the commands it runs, tox and README agree."""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_docs import docs_text

from perfbudget.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
PERF = ROOT / ".github" / "workflows" / "perf.yml"


@pytest.fixture(scope="module")
def wf() -> dict[str, Any]:
    data = yaml.safe_load(PERF.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def runs(job: dict[str, Any]) -> str:
    return "\n".join(str(s.get("run", "")) for s in steps(job))


def test_workflow_files_match_githubs_schema() -> None:
    # check-jsonschema ships GitHub's workflow schema (vendored), so this works offline.
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema is not installed (it comes with `pip install -e .[dev]`)")
    assert WORKFLOWS, "no workflow files"
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_triggers_permissions_and_pinned_actions(wf: dict[str, Any]) -> None:
    assert {"pull_request", "push"} <= set(wf["on"]) and wf["on"]["push"]["branches"] == ["main"]
    assert wf["permissions"] == {"contents": "read"}
    # A pull request's newer push cancels its older run; a push to main never (each is a link of the history).
    assert wf["concurrency"]["cancel-in-progress"] == "${{ github.event_name == 'pull_request' }}"
    assert "github.sha" in wf["concurrency"]["group"]
    uses = [s["uses"] for job in wf["jobs"].values() for s in steps(job) if "uses" in s]
    # GitHub's own actions, pinned to a major version, and this repository's action (action.yml).
    assert uses and all(re.fullmatch(r"actions/[a-z-]+@v\d+", u) or u == "./" for u in uses), uses


def test_cpu_job_runs_lint_types_workflows_and_unit_tests_but_no_stored_timing(wf: dict[str, Any]) -> None:
    job = wf["jobs"]["cpu"]
    text = runs(job)
    for needed in (".venv/bin/ruff check src tests", ".venv/bin/mypy", "check-jsonschema --builtin-schema "
                   "vendor.github-workflows", "scripts/test.sh", "scripts/setup.sh"):
        assert needed in text, needed
    # A hosted runner is another machine every time: stored timing never gates there.
    assert "scripts/perf.sh" not in text
    # Every check after set-up runs even when an earlier one failed.
    after = steps(job)[[s.get("id") for s in steps(job)].index("setup") + 1:]
    assert all("!cancelled()" in str(s.get("if", "")) for s in after)


def test_gpu_job_is_a_matrix_of_self_hosted_gpu_runners_one_worker_per_gpu(wf: dict[str, Any]) -> None:
    job = wf["jobs"]["gpu"]
    assert job["runs-on"][:3] == ["self-hosted", "linux", "gpu"] and "matrix.gpu" in job["runs-on"][3]
    assert "matrix" in job["strategy"] and job["strategy"]["fail-fast"] is False
    assert "PERFBUDGET_GPU_MODELS" in str(job["strategy"]["matrix"]["gpu"])
    assert "vars.PERFBUDGET_GPU_RUNNERS" in job["if"]
    text = runs(job)
    assert re.search(r'pytest perf_tests -m gpu -n auto\s+--perf-json="\.perfbudget/results-\$GPU\.json"', text)
    upload = next(s for s in steps(job) if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["name"].startswith("perf-shard-gpu-")


def test_the_persistent_gpu_runners_run_no_forks_code_and_no_expression_in_a_script(wf: dict[str, Any]) -> None:
    """The GPU runners keep .venv and the inductor cache between jobs: a fork's pull request never runs there."""
    job = wf["jobs"]["gpu"]
    assert " ".join(job["if"].split()) == (
        "${{ vars.PERFBUDGET_GPU_RUNNERS == 'true' && (github.event_name != 'pull_request' "
        "|| github.event.pull_request.head.repo.full_name == github.repository) }}")
    assert job["env"]["GPU"] == "${{ matrix.gpu }}"
    assert "${{" not in runs(job)  # the model through the environment, never spliced into a script
    # Every job on a runner that outlives it (self-hosted) runs only this repository's code.
    for name, other in wf["jobs"].items():
        if "self-hosted" in other["runs-on"]:
            assert "github.event.pull_request.head.repo.full_name == github.repository" in other["if"], name


def test_report_job_merges_every_shard_and_is_the_gate(wf: dict[str, Any]) -> None:
    job = wf["jobs"]["report"]
    assert job["name"] == "perf budgets" and job["needs"] == ["cpu", "gpu", "ab"] and "always()" in job["if"]
    download = next(s for s in steps(job) if str(s.get("uses", "")).startswith("actions/download-artifact"))
    assert download["with"]["pattern"] == "perf-shard-*"
    text = runs(job)
    assert "perfbudget merge" in text
    # The repository's own action publishes the merged results: summary, reports, the comment.
    publish = next(s for s in steps(job) if s.get("uses") == "./")
    assert publish["with"]["mode"] == "report" and publish["with"]["artifact"] == "perf-report"
    assert publish["with"]["results"] == "perf-report/results.json"
    assert job["permissions"] == {"contents": "read"} and publish["with"]["comment"] is False
    assert text.index("perfbudget merge") < text.index('echo "$PWD/.venv/bin" >> "$GITHUB_PATH"')
    gate = next(s for s in steps(job) if s.get("name") == "Gate on regressions")
    assert "--exit-zero" not in gate["run"] and "perfbudget report" in gate["run"]
    assert any("needs.*.result" in str(s.get("if", "")) for s in steps(job))


def _perfbudget_commands(wf: dict[str, Any]) -> list[list[str]]:
    out = []
    for job in wf["jobs"].values():
        for s in steps(job):
            script = re.sub(r"\$\{\{[^}]*\}\}", "x", str(s.get("run", "")))
            for line in script.replace("\\\n", " ").splitlines():
                line = line.split(">>", 1)[0].split(" | ", 1)[0].strip()  # the command, not what takes its output
                if "perfbudget " in line and "bin/perfbudget" in line:
                    argv = shlex.split(line.replace('"${files[@]}"', "a.json b.json"))
                    out.append(argv[argv.index(next(a for a in argv if a.endswith("bin/perfbudget"))) + 1:])
    return out


def test_every_perfbudget_command_in_the_workflow_parses(wf: dict[str, Any]) -> None:
    commands = _perfbudget_commands(wf)
    # `perfbudget ab` runs inside scripts/perf-ab.sh (pull requests and pushes alike).
    assert {c[0] for c in commands} == {"report", "merge", "history"}
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)  # exits (fails the test) on a bad flag
        assert args.command in ("report", "merge", "history")


def test_pull_requests_and_pushes_judge_timing_by_lockstep_ab(wf: dict[str, Any]) -> None:
    job = wf["jobs"]["ab"]
    assert "if" not in job  # pull requests and pushes to main alike
    checkout = next(s for s in steps(job) if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0  # the base commit must be in the clone
    text = runs(job)
    assert text.index("scripts/setup.sh") < text.index("scripts/perf-ab.sh")
    pr, push = (s for s in steps(job) if "scripts/perf-ab.sh" in str(s.get("run", "")))
    assert pr["if"] == "${{ github.event_name == 'pull_request' }}"
    assert pr["env"] == {"PERFBUDGET_AB_BASE": "${{ github.event.pull_request.base.sha }}",
                         "PERFBUDGET_AB_MERGE_BASE": "1"}
    assert push["if"] == "${{ github.event_name != 'pull_request' }}"
    # A push of several commits is one run against main before it: a link of the history's chain.
    assert push["env"] == {"PERFBUDGET_AB_PUSH_BEFORE": "${{ github.event.before }}"}
    assert text.index("apt-get install -y --no-install-recommends valgrind") < text.index("scripts/perf-ab.sh")
    upload = next(s for s in steps(job) if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["name"] == "perf-shard-ab" and "!cancelled()" in upload["if"]
    assert ".perfbudget/results-ab.json" in upload["with"]["path"]  # merged by the report job
    assert wf["jobs"]["gpu"]["env"]["PERFBUDGET_STABLE_MACHINE"]  # a GPU runner of one model is stable


def test_perf_ab_script_refuses_a_missing_parent(tmp_path: Path) -> None:
    """The parent A/B of CI: a first commit or a shallow clone is a clear error, never a silent pass."""
    script = (ROOT / "scripts" / "perf-ab.sh").read_text()
    assert "HEAD~1" in script and "fetch-depth: 0" in script and "first commit" in script
    repo = tmp_path / "r"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "perf-ab.sh").write_text(script)
    (repo / "scripts" / "setup.sh").write_text("#!/bin/sh\n")
    for f in ("perf-ab.sh", "setup.sh"):
        (repo / "scripts" / f).chmod(0o755)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    done = subprocess.run(["bash", str(repo / "scripts" / "perf-ab.sh")], capture_output=True, text=True,
                          cwd=repo, timeout=60)
    assert done.returncode == 2 and "first commit" in done.stderr, done.stderr


def test_tox_environments_match_the_readme_and_ci() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    envs = {s.removeprefix("testenv:"): tox[s] for s in tox.sections() if s.startswith("testenv:")}
    assert {"unit", "perf", "gpu", "lint", "type"} <= set(envs)
    # The tiers as the README's test command runs them: the fast one, and the integration one beside it.
    assert envs["unit"]["commands"].strip() == "{toxinidir}/scripts/test.sh {posargs}"
    assert envs["integration"]["commands"].strip() == "{toxinidir}/scripts/test.sh --integration {posargs}"
    assert "pytest perf_tests" in envs["perf"]["commands"]
    assert "-m gpu -n auto" in envs["gpu"]["commands"]
    assert "ruff check" in envs["lint"]["commands"] and "mypy" in envs["type"]["commands"]
    readme = docs_text()
    for env in ("unit", "perf", "gpu", "lint", "type"):
        assert f"tox -e {env}" in readme
    assert "**`perf budgets`**" in readme and "required status check" in readme


FAKE_PERFBUDGET = """#!/bin/sh
# Stands in for perfbudget: logs its arguments, writes the --out / -o file it is given.
echo "$*" >> "$PERFBUDGET_CALLS"
out=""
prev=""
for a in "$@"; do
    case "$prev" in --out|-o) out="$a" ;; esac
    prev="$a"
done
[ -n "$out" ] && echo '{}' > "$out"
exit 0
"""


def perf_ab_repo(tmp: Path) -> Path:
    """A folder holding scripts/perf-ab.sh, a set-up that does nothing and a fake perfbudget (FAKE_PERFBUDGET)."""
    repo = tmp / "r"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "perf-ab.sh").write_text((ROOT / "scripts" / "perf-ab.sh").read_text())
    (repo / "scripts" / "setup.sh").write_text("#!/bin/sh\n")
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "perfbudget").write_text(FAKE_PERFBUDGET)
    (repo / ".venv" / "bin" / "python").symlink_to(sys.executable)
    for f in (repo / "scripts" / "perf-ab.sh", repo / "scripts" / "setup.sh", repo / ".venv" / "bin" / "perfbudget"):
        f.chmod(0o755)
    return repo


@pytest.mark.parametrize("valgrind", [True, False])
def test_perf_ab_script_runs_instruction_counts_beside_the_timing_pairs(tmp_path: Path, valgrind: bool) -> None:
    """With valgrind and a second CPU: counts on the other CPUs, timing without them, one merged
    report. Without valgrind the timing run keeps the instruction tests (reported unmeasurable)."""
    repo = perf_ab_repo(tmp_path)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("git", "sed", "rm", "mkdir", "cut", "dirname", "cat"):
        found = shutil.which(name)
        assert found, name
        (tools / name).symlink_to(found)
    if valgrind:
        (tools / "valgrind").write_text("#!/bin/sh\n")
    for f in tools.iterdir():
        f.chmod(0o755)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    for message in ("first", "second"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True)
    calls = tmp_path / "calls"
    env = {"PATH": str(tools), "PERFBUDGET_CALLS": str(calls), "HOME": str(tmp_path)}
    cpus = sorted(os.sched_getaffinity(0))
    bash = shutil.which("bash")
    assert bash
    done = subprocess.run([bash, str(repo / "scripts" / "perf-ab.sh"), "--max-pairs", "4"], capture_output=True,
                          text=True, cwd=repo, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    counted = [c for c in lines if "--instructions" in c]
    timing = [c for c in lines if c.startswith("ab") and "--instructions" not in c]
    assert len(timing) == 1 and "--max-pairs 4" in timing[0]
    if valgrind and len(cpus) > 1:
        others = ",".join(map(str, cpus[:-1]))
        assert len(counted) == 1 and f"--cpus {others}" in counted[0]
        assert counted[0].endswith("-- perf_tests -m instructions -p no:randomly --durations=0")
        assert timing[0].endswith("-- perf_tests -m not instructions")
        assert any(c.startswith("merge .perfbudget/results-ab.json .perfbudget/results-ab-instructions.json") for c in lines)
    else:
        assert counted == [] and timing[0].endswith("-- perf_tests")
        assert not any(c.startswith("merge") for c in lines)


@pytest.mark.parametrize("before", ["ancestor", "zeros", "unknown", "side-branch", "head", "explicit-base"])
def test_perf_ab_script_takes_main_before_the_push_as_the_base(tmp_path: Path, before: str) -> None:
    """A push of several commits compared with HEAD~1 leaves the others unmeasured, a gap in the
    history's chain: the push's `before`, when an earlier commit of HEAD, is the base instead."""
    repo = perf_ab_repo(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]

    def rev(ref: str) -> str:
        return subprocess.run([*git, "rev-parse", ref], capture_output=True, text=True, check=True).stdout.strip()

    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    for message in ("first", "second"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True)
    subprocess.run([*git, "checkout", "-q", "-b", "side"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "side"], check=True)
    side = rev("HEAD")
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    for message in ("third", "fourth"):  # the push: two commits on top of `second`
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True)
    env_before, expected = {
        "ancestor": (rev("HEAD~2"), rev("HEAD~2")),
        "zeros": ("0" * 40, "HEAD~1"),  # the push created the branch
        "unknown": ("f" * 40, "HEAD~1"),  # a force push: the old head is gone
        "side-branch": (side, "HEAD~1"),
        "head": (rev("HEAD"), "HEAD~1"),
        "explicit-base": (rev("HEAD~2"), rev("HEAD~3")),
    }[before]
    calls = tmp_path / "calls"
    env = {**os.environ, "PERFBUDGET_CALLS": str(calls), "PERFBUDGET_AB_INSTRUCTIONS": "0",
           "PERFBUDGET_AB_PUSH_BEFORE": env_before}
    if before == "explicit-base":
        env["PERFBUDGET_AB_BASE"] = rev("HEAD~3")
    done = subprocess.run(["bash", str(repo / "scripts" / "perf-ab.sh")], capture_output=True, text=True, cwd=repo,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    [timing] = [c for c in calls.read_text().splitlines() if c.startswith("ab ")]
    assert timing.startswith(f"ab --base {expected} --out "), timing
    if before == "ancestor":
        assert f"base {expected[:12]}, the branch before this push (2 commit(s))" in done.stderr
    elif before != "explicit-base":
        assert "base HEAD~1" in done.stderr


def test_pushes_to_main_keep_the_ab_results_in_the_history_and_check_it(wf: dict[str, Any]) -> None:
    job = wf["jobs"]["history"]
    assert job["needs"] == ["ab"] and "!cancelled()" in job["if"]
    assert "github.event_name == 'push'" in job["if"] and "refs/heads/main" in job["if"]
    assert job["permissions"] == {"contents": "write"}  # the branch perf-history is pushed
    checkout = next(s for s in steps(job) if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0
    download = next(s for s in steps(job) if str(s.get("uses", "")).startswith("actions/download-artifact"))
    assert download["with"]["name"] == "perf-shard-ab"  # what the ab job uploads
    text = runs(job)
    order = [text.index(x) for x in ("scripts/setup.sh", "scripts/perf-history.sh ab-results/results-ab.json",
                                     "perfbudget history report", "perfbudget history check --since")]
    assert order == sorted(order)
    assert "set -o pipefail" in text and 'exit "$status"' in text  # the check's exit status is the step's
    upload = next(s for s in steps(job) if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["name"] == "perf-history" and "history.html" in upload["with"]["path"]
