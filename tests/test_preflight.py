"""Preflight: busy CPU or shared/throttled GPU makes timing checks skip (strict: fail); faults mid-run."""

from __future__ import annotations

import json

import pytest
import torch  # noqa: F401  (kept loaded across in-process pytester runs)

from perfbudget.preflight import check
from tests.measure.support import FakeNvml


def test_cpu_load_above_limit_is_a_problem() -> None:
    busy = check("cpu", loadavg=lambda: (3.9, 2.0, 1.0), cpu_count=2)
    assert not busy.ok and "CPU load average 3.90 on 2 cores exceeds 1.5 per core" in busy.problems[0]
    assert check("cpu", loadavg=lambda: (1.2, 1.0, 1.0), cpu_count=2).ok


def test_gpu_with_another_process_is_a_problem() -> None:
    nv = FakeNvml()
    nv.compute_procs = [type("P", (), {"pid": 4242, "usedGpuMemory": 1024**3})()]
    got = check("cuda", loadavg=lambda: (0.5, 0.5, 0.5), cpu_count=2, nvml_module=nv)
    assert any("pid 4242" in p for p in got.problems), got.problems


def test_gpu_without_nvml_checks_only_the_cpu() -> None:
    assert check("cuda", loadavg=lambda: (0.1, 0.1, 0.1), cpu_count=2).ok  # NVML absent here


TESTS = """
import pytest

@pytest.mark.budget("k")
def test_mixed(perf):
    perf.record("step_ms", [10.0] * 30)
    perf.record("flops", 1000)

@pytest.mark.budget("k2")
def test_fault(perf):
    perf.record("flops", 5)
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

def test_other():
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_p=TESTS)
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--update-budgets", "-o", "perfbudget_html=false")
    return pytester


def run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    return p.runpytest_inprocess("-p", "no:cacheprovider", "-o", "perfbudget_html=false", "-rs", *args)


def test_busy_machine_skips_timing_but_still_checks_exact(project: pytest.Pytester) -> None:
    r = run(project, "-o", "perfbudget_max_load=-1", "test_p.py::test_mixed")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["*timing checks of k not judged (step_ms): preflight: CPU load average*checked anyway: flops*"])
    cpu = project.path / "budgets" / "cpu.yaml"
    cpu.write_text(cpu.read_text().replace("value: 1000", "value: 999"))
    r = run(project, "-o", "perfbudget_max_load=-1", "test_p.py::test_mixed")
    r.assert_outcomes(failed=1)  # the exact check still ran, and fails
    r.stdout.fnmatch_lines(["*flops: fail*"])


def test_busy_machine_fails_under_strict(project: pytest.Pytester) -> None:
    r = run(project, "-o", "perfbudget_max_load=-1", "--perf-strict", "test_p.py::test_mixed")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*step_ms: unmeasurable: preflight: CPU load average*"])


def test_fault_mid_run_fails_that_test_and_keeps_the_results_file_complete(project: pytest.Pytester) -> None:
    r = run(project)
    r.assert_outcomes(passed=2, failed=1)
    r.stdout.fnmatch_lines(["*RuntimeError: CUDA out of memory*", "ERROR test_p.py::test_fault (k2): RuntimeError: CUDA out of memory*"])
    data = json.loads((project.path / ".perfbudget" / "results.json").read_text())
    assert {(x["key"], x["metric"]) for x in data["records"]} == {("k", "step_ms"), ("k", "flops"), ("k2", "flops")}
    assert data["meta"]["errors"][0]["nodeid"] == "test_p.py::test_fault"
