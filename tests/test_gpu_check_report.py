"""scripts/gpu-check-report.py: the rehearsal's test selection, the device's return limits, the summary; and
scripts/gpu-check.sh's passes as it hands them to pytest and perfbudget ab, on a stand-in GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check-report.py"


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rehearsal_runs_the_cpu_variant_of_each_planned_gpu_test_that_has_one_in_the_plans_order(
        report: ModuleType, tmp_path: Path) -> None:
    collected, planned = tmp_path / "collected.txt", tmp_path / "planned.txt"
    collected.write_text("\n".join([
        "perf_tests/test_encoder.py::test_operators[cpu]",
        "perf_tests/test_encoder.py::test_operators[cuda]",
        "perf_tests/test_encoder.py::test_step_latency_and_throughput[cpu]",
        "perf_tests/test_gpu.py::test_gpm_utilisation[cuda]",   # no CPU variant
        "perf_tests/test_tiny.py::test_tiny_mlp_step_time",     # no GPU variant
        "",
        "5 tests collected in 0.9s",
    ]))
    planned.write_text("perf_tests/test_gpu.py::test_gpm_utilisation[cuda]\nperf_tests/test_encoder.py::test_operators[cuda]\n"
                       "perf_tests/test_encoder.py::test_step_latency_and_throughput[cuda]\n")
    assert report.select(collected, planned) == ["perf_tests/test_encoder.py::test_operators[cpu]",
                                                 "perf_tests/test_encoder.py::test_step_latency_and_throughput[cpu]"]


def test_out_within_the_devices_limits_passes_and_each_breach_is_named(report: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "summary.txt").write_text("x")
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep-enough.txt").write_text("x")
    assert report.check_out(tmp_path) == []
    (tmp_path / "a" / "b" / "c").mkdir()
    (tmp_path / "a" / "b" / "c" / "too-deep.txt").write_text("x")
    (tmp_path / "test[cuda].json").write_text("x")
    for i in range(6):
        (tmp_path / f"f{i}").write_text("x")
    problems = "\n".join(report.check_out(tmp_path))
    assert "a/b/c/too-deep.txt: more than 2 folders down" in problems
    assert "test[cuda].json: name has characters other than" in problems
    assert "10 files, over 8" in problems


def test_the_aa_lines_of_any_results_file_neither_crash_nor_reach_the_terminal_raw(report: ModuleType,
                                                                                  tmp_path: Path) -> None:
    run, out = tmp_path / "gpu-check", tmp_path / "out"
    (run / "aa").mkdir(parents=True)
    out.mkdir()
    (run / "parts.tsv").write_text("a/a\tok\t60\t-\t\n")
    records = [{"metric": "step_ms", "key": "enc\x1b[2J\x1b]0;pwned\x07", "outcome": "pass",
                "base": {"ratio": 1.012, "ratio_ci": None, "pairs": 3}},
               {"metric": "step_ms", "key": "dec", "outcome": "fail\u2028x", "base": {"ratio": "nan", "ratio_ci": [1, "x"]}},
               {"metric": "step_ms", "key": "mlp", "outcome": "pass", "base": {"ratio": 1.0, "ratio_ci": [0.99, 1.02]}},
               "not a record", {"metric": "step_ms", "base": ["not", "a", "mapping"]}]
    (run / "aa" / "results.json").write_text(json.dumps({"schema": 1, "meta": "x", "records": records}))
    text = report.summary(run, out)
    assert "enc [2J ]0;pwned .step_ms head/base 1.0120 [?, ?] over 3 pair(s): pass" in text
    assert "dec.step_ms head/base ? [1.0000, ?] over None pair(s): fail x" in text
    assert "mlp.step_ms head/base 1.0000 [0.9900, 1.0200] over None pair(s): pass" in text
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f\u2028]", text)


def test_summary_names_each_parts_state_and_a_cut_off_results_file(report: ModuleType, tmp_path: Path) -> None:
    run, out = tmp_path / "gpu-check", tmp_path / "out"
    (run / "update").mkdir(parents=True)
    out.mkdir()
    (run / "parts.tsv").write_text("set-up\tok\t7\t-\tinstalled\nupdate\tkilled\t290\t270\t\n"
                                   "a/a\tskipped\t-\t-\tno git on this machine\n")
    record = {"nodeid": "perf_tests/test_encoder.py::test_operators[cuda]", "key": "encoder-train",
              "metric": "flops", "outcome": "unbudgeted"}
    (run / "update" / "results.json").write_text(json.dumps(
        {"schema": 1, "meta": {"mode": "update", "unfinished": "..."}, "records": [record]}))
    (out / "summary.txt").write_text("")
    text = report.summary(run, out)
    assert "update   killed" in text and "1 test(s) recorded" in text and "unfinished" in text
    assert "(plan" not in text  # no plan.tsv: no estimates
    assert "check    not run" in text
    assert "a/a      skipped" in text and "no git on this machine" in text
    assert report.unfinished(run / "update" / "results.json")
    assert report.unfinished(run / "check" / "results.json"), "a missing file counts as cut off"
    # A finished run's file says nothing of being unfinished, or (a reader's own copy) null: finished.
    (run / "check").mkdir()
    (run / "check" / "results.json").write_text(json.dumps(
        {"schema": 3, "meta": {"mode": "check", "unfinished": None}, "records": [record]}))
    assert not report.unfinished(run / "check" / "results.json")
    assert "unfinished" not in report.summary(run, out).split("check", 1)[1].splitlines()[0]


def test_summary_puts_the_plans_estimate_beside_each_tests_seconds(report: ModuleType, tmp_path: Path) -> None:
    run, out = tmp_path / "gpu-check", tmp_path / "out"
    (run / "check").mkdir(parents=True)
    out.mkdir()
    (run / "plan.tsv").write_text("check\tpytest start and collection\t9.0\n"
                                  "check\tperf_tests/test_encoder.py::test_operators[cuda]\t9.5\n")
    (run / "parts.tsv").write_text("check\tok\t31\t56\t\n")
    (run / "check" / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="perf_tests.test_encoder" name="test_operators[cpu]" time="12.25"/>'
        '<testcase classname="perf_tests.test_tiny" name="test_tiny_mlp_step_time" time="0.5"/></testsuite></testsuites>')
    lines = report.summary(run, out).splitlines()
    assert lines[2].startswith("check    ok             31/56 s (plan 18)  tests 2 passed")
    assert "           12.2 s (plan   9.5)  test_encoder::test_operators[cpu]" in lines  # the [cuda] one's estimate
    assert "            0.5 s (plan     -)  test_tiny::test_tiny_mlp_step_time" in lines


FAKE_PYTHON = """#!/usr/bin/env bash
# The GPU machine's python3, standing in: pytest and perfbudget's install logged and skipped.
case "$1 ${2:-}" in
    "-m pytest") printf 'pytest\\t%s\\t%s\\n' "${PERFBUDGET_STABLE_MACHINE:-}" "$*" >> "$GPU_CHECK_LOG" ;;
    "-m pip") ;;
    "- "*) cat > /dev/null; echo "gpu-check: a stand-in machine" ;;
    *) exec "$REAL_PYTHON" "$@" ;;
esac
"""
FAKE_AB = """#!/usr/bin/env bash
printf 'perfbudget\\t%s\\t%s\\n' "${PERFBUDGET_STABLE_MACHINE:-}" "$*" >> "$GPU_CHECK_LOG"
"""


def test_the_script_declares_the_machine_stable_in_the_check_pass_only_and_sizes_every_part_for_the_lease(
        tmp_path: Path) -> None:
    fakes, log, out = tmp_path / "bin", tmp_path / "log.tsv", tmp_path / "out"
    fakes.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("perfbudget", FAKE_AB), ("nvidia-smi", "#!/bin/sh\necho H200\n")):
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fakes}:{os.environ['PATH']}", "PYTHON": str(fakes / "python3"),
           "REAL_PYTHON": sys.executable, "GPU_CHECK_LOG": str(log), "TMPDIR": str(tmp_path),
           "PERFBUDGET_STABLE_MACHINE": "yes"}  # a machine's own declaration is not inherited either
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--commit", "abc1234", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    assert [(tool, stable) for tool, stable, _ in calls] == [("pytest", ""), ("pytest", "yes"), ("perfbudget", "")]
    (_, _, update), (_, _, check), (_, _, ab) = calls
    assert "--update-budgets" in update and "--update-budgets" not in check
    assert "perf_tests -m gpu and not compiles and not instructions" in update
    assert all("-o perfbudget_lease=true" in args for args in (update, check, ab))
    assert check.startswith("-m pytest perf_tests/test_encoder.py::test_step_latency_and_throughput[cuda] "
                            "perf_tests/test_encoder.py::test_operators[cuda] ")
    minutes = re.search(r"--min-pairs 2 --max-pairs 2 --max-minutes (\S+) ", ab)
    assert minutes is not None and re.fullmatch(r"\d+\.\d\d", minutes.group(1)), ab
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        member = tar.extractfile("gpu-check/parts.tsv")
        assert member is not None
        parts = {row.split("\t")[0]: row.split("\t") for row in member.read().decode().splitlines()}
    assert abs(float(minutes.group(1)) * 60 - int(parts["a/a"][3])) <= 0.3  # 63 s is 1.05, not 1.5
    assert "(plan " in (out / "summary.txt").read_text()


def test_a_pass_cut_at_its_bound_counts_the_failures_it_recorded_before(report: ModuleType, tmp_path: Path) -> None:
    """timeout's status hides pytest's: the junit of a pass cut by SIGINT, or the results of one killed later,
    say whether a test had failed before the cut (scripts/gpu-check.sh's run_pass fails the pass then)."""
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b">'
        '<failure message="budget">x</failure></testcase><testcase classname="t" name="c"><skipped/></testcase>'
        '<testcase classname="t" name="d"><error message="boom"/></testcase></testsuite></testsuites>')
    assert report.failures(cut) == 2
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "results.json").write_text(json.dumps({"records": [{"outcome": "pass"}, {"outcome": "fail"}, "junk"]}))
    assert report.failures(killed) == 1
    assert report.failures(tmp_path / "nothing") == 0
    out = subprocess.run([sys.executable, str(SCRIPT), "failures", str(cut)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"
    assert 'failures "$R/$name"' in (ROOT / "scripts" / "gpu-check.sh").read_text()
