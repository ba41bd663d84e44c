"""The pytest plugin end to end, in subprocess pytest runs: skip, update, fail, restore, strict, xdist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# In-process pytester runs restore sys.modules afterwards; importing torch here keeps it
# loaded across runs (re-importing its C extension in one process crashes).
import torch  # noqa: F401
import triton  # noqa: F401

TESTS = """
import pytest

@pytest.mark.budget("toy")
def test_toy(perf):
    perf.record("step_ms", [10.0 + 0.01 * i for i in range(30)], more=lambda: [10.0 + 0.01 * i for i in range(30)])
    perf.record("flops", 1000)

@pytest.mark.budget("mm[{n}]")
@pytest.mark.parametrize("n", [1, 2])
def test_param(perf, n):
    perf.record("op_count[aten::mm]", n)

def test_plain():
    assert True
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_perf=TESTS)
    return pytester


def run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    # In-process keeps each run under a second; xdist runs spawn their own workers anyway.
    # The samples are literal numbers: the machine's load must not set them aside.
    return p.runpytest_inprocess("-p", "no:cacheprovider", "-o", "perfbudget_max_load=1e9", *args)


def results(p: pytest.Pytester) -> list[dict]:
    return json.loads((p.path / ".perfbudget" / "results.json").read_text())["records"]


def test_unbudgeted_skips_with_the_command_that_creates_it(project: pytest.Pytester,
                                                          stable_machine: str) -> None:
    r = run(project, "-rs")
    r.assert_outcomes(passed=1, skipped=3)
    r.stdout.fnmatch_lines(["*unbudgeted: toy has no budget for step_ms, flops on cpu *"
                            "create it with: pytest test_perf.py::test_toy --update-budgets*"])
    assert {rec["outcome"] for rec in results(project)} == {"unbudgeted"}


def test_timing_is_advisory_on_a_machine_not_declared_stable(project: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERFBUDGET_STABLE_MACHINE", raising=False)
    r = run(project, "-rs")
    # No timing budget here is not a skip: one written here would not gate either.
    r.stdout.fnmatch_lines(["*advisory: 1 timing check(s) against stored budgets, not gating*perfbudget ab*"])
    r.stdout.fnmatch_lines(["*unbudgeted: toy has no budget for flops on cpu*"])
    by_metric = {rec["metric"]: rec for rec in results(project)}
    assert by_metric["step_ms"]["outcome"] == "advisory"
    assert by_metric["step_ms"]["advice"] == ""
    # Written here, the timing budget goes to this machine's identity file; it stays advisory.
    run(project, "--update-budgets").assert_outcomes(passed=4)
    identity_file = next((project.path / "budgets").glob("cpu-*.yaml"))
    assert "identity: cpu-" in identity_file.read_text()
    identity_file.write_text(identity_file.read_text().replace("value: 10.14", "value: 9.0"))
    r = run(project)
    r.assert_outcomes(passed=4)  # 13 % over the budget: shown, never a failure here
    r.stdout.fnmatch_lines(["*toy*step_ms*9 ms*10.14 ms*ADVISORY (fail)*",
                            "*advisory, beyond the budget here: toy.step_ms*"])
    rec = next(x for x in results(project) if x["metric"] == "step_ms")
    assert rec["advice"] == "fail" and "would fail" in rec["reason"] and "perfbudget ab" in rec["reason"]
    # The explicit opt-in: strict fails an advisory check beyond its budget.
    run(project, "--perf-strict", "test_perf.py::test_toy").assert_outcomes(failed=1)
    # A declaration naming another machine is refused with both identities.
    monkeypatch.setenv("PERFBUDGET_STABLE_MACHINE", "cpu-some-other-machine-6-1-1-avx2")
    r = run(project, "test_perf.py::test_toy")
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines(["*declares a stable machine, but this cpu device is cpu-*"])


def test_update_then_pass_then_tightened_fails_then_loosen_restores(project: pytest.Pytester,
                                                                    stable_machine: str) -> None:
    r = run(project, "--update-budgets")
    r.assert_outcomes(passed=4)
    r.stdout.fnmatch_lines(["*budget update*", "--- /dev/null", "+++ b/cpu.yaml", "*added*toy.flops*"])
    files = sorted(p.name for p in (project.path / "budgets").glob("*.yaml"))
    assert files[0].startswith("cpu-") and files[1] == "cpu.yaml"
    run(project).assert_outcomes(passed=4)

    device_file = project.path / "budgets" / files[0]
    text = device_file.read_text()
    device_file.write_text(text.replace("value: 10.14", "value: 9.0"))
    r = run(project)
    r.assert_outcomes(passed=3, failed=1)
    r.stdout.fnmatch_lines([
        "*perf budget check failed: toy on cpu*",
        "metric*budget*tol*measured*CI*n*cv*verdict*",
        "step_ms*9 ms*5%*10.14 ms*10.09-10.2*60*FAIL*",
        f"step_ms: fail: median 10.14 with CI 10.09-10.2 is entirely beyond the limit 9.45; confirmed*{files[0]}:*",
    ])
    r = run(project, "--update-budgets")
    r.stdout.fnmatch_lines(["*refused*toy.step_ms*--allow-loosen*"])
    assert "value: 9.0" in device_file.read_text()
    r = run(project, "--update-budgets", "--allow-loosen")
    r.stdout.fnmatch_lines(["*-      value: 9.0", "*+      value: 10.14", "*loosened*toy.step_ms*"])
    run(project).assert_outcomes(passed=4)


def test_strict_turns_stale_and_unbudgeted_into_failures(project: pytest.Pytester) -> None:
    run(project, "--update-budgets")
    cpu = project.path / "budgets" / "cpu.yaml"
    cpu.write_text(cpu.read_text().replace("value: 1000", "value: 2000"))
    r = run(project)
    r.assert_outcomes(passed=4)
    r.stdout.fnmatch_lines(["*toy*flops*2000*1000*STALE*", "*stale budgets*--update-budgets*"])
    r = run(project, "--perf-strict")
    r.assert_outcomes(passed=3, failed=1)
    project.makepyfile(test_new="""
def test_new(perf):
    perf.record("flops", 1)
""")
    run(project, "--perf-strict", "test_new.py").assert_outcomes(failed=1)


def test_broken_budget_file_names_file_and_key_and_other_tests_run(project: pytest.Pytester) -> None:
    run(project, "--update-budgets")
    cpu = project.path / "budgets" / "cpu.yaml"
    cpu.write_text(cpu.read_text().replace("tolerance: 0.0", "tolerance: 5%", 1))
    r = run(project)
    # The error sits in one entry: only that key's test fails; the others still run and pass.
    r.assert_outcomes(passed=3, failed=1)
    r.stdout.fnmatch_lines(["*cpu.yaml:*: budgets.mm[[]1[]].op_count[[]aten::mm[]].tolerance: expected a number in [[]0, 1], got '5%'*"])
    cpu.write_text("schema: 1\ndevice: {type: cpu\n")
    r = run(project)
    r.assert_outcomes(passed=1, errors=3)  # a file that cannot be loaded stops every perf test
    r.stdout.fnmatch_lines(["*cpu.yaml:3: invalid YAML*"])


@pytest.mark.parametrize(("text", "expected"), [
    ("schema: 1\ndevice: {type: cuda}\nbudgets:\n  toy:\n    flops: 1\n    flops: 2\n", "*gpu.yaml:6:*duplicate*"),
    ("schema: 1\ndevice: {type: cuda}\nbudgets: !!python/object/apply:os.system ['true']\n", "*gpu.yaml:3:*tag*"),
    ("schema: 1\ndevice: {type: cpu, model: 123}\nbudgets: {}\n", "*gpu.yaml:2: device.model:*123*"),
])
def test_a_file_that_cannot_be_loaded_fails_the_run_whatever_its_device(
    project: pytest.Pytester, text: str, expected: str
) -> None:
    (project.path / "budgets").mkdir()
    (project.path / "budgets" / "gpu.yaml").write_text(text)
    r = run(project)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.assert_outcomes(passed=1, errors=3)  # every perf test; the plain test still runs
    r.stdout.fnmatch_lines(["*budget files that cannot be loaded*", expected])


def test_nan_measurement_and_empty_test_are_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad="""
def test_nan(perf):
    perf.record("step_ms", [1.0, float("nan")])

def test_nothing(perf):
    pass

def test_unknown(perf):
    perf.record("stepms", 1.0)
""")
    r = run(pytester)
    r.assert_outcomes(failed=3)
    r.stdout.fnmatch_lines([
        "*step_ms: error: non-finite measurement(s) [[]nan[]]*",
        "*nothing: the test used `perf` but recorded no measurement*",
        "*unknown metric 'stepms'; did you mean 'step_ms'*",
    ])


def test_gpu_marker_skips_without_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
import pytest
@pytest.mark.gpu
def test_g(perf):
    perf.record("step_ms", [1.0] * 30)
""")
    r = run(pytester, "-rs")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["*needs a CUDA GPU: torch.cuda.is_available() is False*"])


def test_xdist_matches_serial_and_controller_writes_once(project: pytest.Pytester, stable_machine: str) -> None:
    r = run(project, "-n", "2", "--update-budgets")
    r.assert_outcomes(passed=4)
    r.stdout.fnmatch_lines(["*added*toy.flops*"])
    assert len(list((project.path / "budgets").glob("*.yaml"))) == 2
    serial = {(x["nodeid"], x["metric"]): x["outcome"] for x in results(project)}
    assert len(serial) == 4
    run(project).assert_outcomes(passed=4)
    serial = {(x["nodeid"], x["metric"]): x["outcome"] for x in results(project)}
    run(project, "-n", "2").assert_outcomes(passed=4)
    parallel = {(x["nodeid"], x["metric"]): x["outcome"] for x in results(project)}
    assert parallel == serial and set(serial.values()) == {"pass"}


def test_perf_json_option_and_junit_properties(project: pytest.Pytester, stable_machine: str) -> None:
    out = project.path / "out" / "r.json"
    junit = project.path / "junit.xml"
    run(project, f"--perf-json={out}", f"--junitxml={junit}")
    data = json.loads(out.read_text())
    assert data["schema"] == 4 and len(data["records"]) == 4
    rec = next(x for x in data["records"] if x["metric"] == "step_ms")
    assert rec["n"] == 30 and rec["device"]["type"] == "cpu" and len(rec["samples"]) == 30
    assert 'name="perf.toy.step_ms" value="unbudgeted"' in junit.read_text()


def test_budgets_dir_option(project: pytest.Pytester, tmp_path: Path) -> None:
    where = tmp_path / "elsewhere"
    r = run(project, f"--budgets-dir={where}", "--update-budgets")
    r.assert_outcomes(passed=4)
    assert len(list(where.glob("*.yaml"))) == 2 and not (project.path / "budgets").exists()
    r = run(project, "-rs")
    r.stdout.fnmatch_lines(["*unbudgeted*"])


def test_skips_and_failures_name_the_tests_location_not_the_plugins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_where="""
import pytest

def test_unbudgeted(perf):
    perf.record("flops", 1)

def test_misspelt(perf):
    perf.record("stepms", 1.0)

@pytest.mark.gpu
def test_gpu(perf):
    perf.record("flops", 1)

@pytest.mark.budget("lonely")
def test_marked_without_perf():
    pass
""")
    where = str(pytester.path / "test_where.py")
    # Lines of each test's definition (its first decorator), as pytest reports a skipif mark.
    expected = {"test_unbudgeted": 3, "test_misspelt": 6, "test_gpu": 9, "test_marked_without_perf": 13}
    for args in [(), ("-n", "2")]:  # under xdist each report comes from its worker
        r = run(pytester, "-rs", "--tb=line", *args)
        r.assert_outcomes(failed=1, skipped=2, errors=1)
        seen = {}
        for rep in r.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
            if rep.passed:
                continue
            path, lineno = rep.longrepr[:2] if rep.skipped else (rep.longrepr.reprcrash.path,
                                                                  rep.longrepr.reprcrash.lineno)
            seen[rep.nodeid.split("::")[-1]] = (path, lineno)
        assert seen == {name: (where, line) for name, line in expected.items()}, args
        # Each line on its own: under xdist the summary lists the skips in the order the workers finished.
        r.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_where.py:3: unbudgeted: *"])
        r.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_where.py:9: needs a CUDA GPU*"])
        r.stdout.fnmatch_lines([f"{where}:6: Failed: perf budget check failed: misspelt on cpu*"])
        assert "plugin.py" not in r.stdout.str()


def test_an_update_in_a_tree_without_git_records_the_commit_passed_or_says_it_is_unknown(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A working tree copied to a GPU machine without .git (pytester's folder is in no repository).
    for name in ("GITHUB_ACTIONS", "GITHUB_SHA", "GITLAB_CI", "CI_COMMIT_SHA"):
        monkeypatch.delenv(name, raising=False)
    cpu = project.path / "budgets" / "cpu.yaml"
    r = run(project, "--update-budgets", "test_perf.py::test_param")
    r.stdout.fnmatch_lines(["*commit: unknown*", "*warning*commit*unknown*--perf-commit*"])
    cpu.unlink()
    r = run(project, "--update-budgets", "--perf-commit", "1f262dc", "test_perf.py::test_param")
    r.assert_outcomes(passed=2)
    assert "commit: 1f262dc" in cpu.read_text() and "unknown" not in cpu.read_text()
    r = run(project, "--update-budgets", "--perf-commit", "main", "test_perf.py::test_param")
    r.stderr.fnmatch_lines(["*--perf-commit: expected a git commit hash*got 'main'*"])


STEP_MARKED = """
import pytest

@pytest.mark.budget("counted")
@pytest.mark.instructions(steps=2, warmup=1)
def test_step(perf):
    perf.step(lambda: sum(range(100)), samples_per_step=1, min_samples=5, max_ms=20, warmup_ms=1)
"""


@pytest.mark.parametrize("counting", [False, True], ids=["plain", "callgrind"])
def test_a_step_marked_instructions_is_timed_or_else_counted_and_no_budget_is_missed(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, counting: bool) -> None:
    from perfbudget import session as session_module

    monkeypatch.setattr(session_module, "running_under_valgrind", lambda: counting)
    pytester.makepyfile(test_step=STEP_MARKED)
    (pytester.path / "budgets").mkdir()
    (pytester.path / "budgets" / "cpu.yaml").write_text(
        "schema: 1\ndevice: {type: cpu}\nbudgets:\n  counted:\n    step_ms: {value: 1000.0, tolerance: 1.0}\n"
        "    throughput_samples_per_s: {value: 1.0, tolerance: 1.0}\n    instructions[callgrind]: {value: 1000}\n")
    r = run(pytester, "-m", "instructions", "--perf-strict")
    assert r.ret == 0, r.stdout.str()
    recorded = {rec["metric"]: rec["outcome"] for rec in results(pytester)}
    # Neither session reports the budgets only the other kind of session measures as not measured.
    if counting:  # this process is not on valgrind, so the count itself is unmeasurable: the wiring is tested
        assert recorded == {"instructions[callgrind]": "unmeasurable"}, recorded
    else:
        assert set(recorded) == {"step_ms", "throughput_samples_per_s"}, recorded


def test_the_instructions_marker_takes_only_steps_and_warmup(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
import pytest

@pytest.mark.instructions(5)
def test_step(perf):
    perf.record("flops", 1)
""")
    r = run(pytester)
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines(["*@pytest.mark.instructions takes only steps= and warmup=, got (5,) {}*"])


def test_a_budget_under_a_key_no_test_has_is_reported_with_the_key_it_may_mean(project: pytest.Pytester,
                                                                                stable_machine: str) -> None:
    run(project, "--update-budgets").assert_outcomes(passed=4)
    cpu = project.path / "budgets" / "cpu.yaml"
    # A renamed or misspelt key, and the key of a test that -k deselects: only the first has no test.
    cpu.write_text(cpu.read_text().replace("  toy:\n", "  tyo:\n    flops: {value: 1000}\n  toy:\n", 1))
    run(project).assert_outcomes(passed=4)
    orphans = [x for x in results(project) if x["key"] == "tyo"]
    assert [(x["metric"], x["outcome"], x["nodeid"]) for x in orphans] == [("flops", "not_measured", "")]
    assert "which no test of this run has, deselected ones included (did you mean 'toy'?)" in orphans[0]["reason"]
    run(project, "-n", "2").assert_outcomes(passed=4)
    assert [x["key"] for x in results(project) if x["outcome"] == "not_measured"] == ["tyo"]
    # A deselected test's budgets are reported as its own (not recorded), never as a key without a test.
    run(project, "-k", "param").assert_outcomes(passed=2, deselected=2)
    reasons = {x["key"]: x["reason"] for x in results(project) if x["outcome"] == "not_measured"}
    assert set(reasons) == {"tyo"}
    # A file named: the run knows only that file's tests, so it says nothing of other keys.
    run(project, "test_perf.py").assert_outcomes(passed=4)
    assert not [x for x in results(project) if x["key"] == "tyo"]


def test_a_budget_no_test_recorded_fails_a_strict_run(project: pytest.Pytester, stable_machine: str) -> None:
    run(project, "--update-budgets").assert_outcomes(passed=4)
    cpu = project.path / "budgets" / "cpu.yaml"
    cpu.write_text(cpu.read_text().replace("  toy:\n", "  tyo:\n    flops: {value: 1000}\n  toy:\n", 1))
    assert run(project).ret == 0  # reported, not failed
    r = run(project, "--perf-strict")
    r.assert_outcomes(passed=4)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*tyo*flops*NOT MEASURED*"])
