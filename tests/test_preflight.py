"""Preflight: busy CPU or shared/throttled GPU makes timing checks skip (strict: fail); faults mid-run."""

from __future__ import annotations

import json
import os

import pytest
import torch  # noqa: F401  (kept loaded across in-process pytester runs)

from perfbudget.measure import nvml
from perfbudget.preflight import check
from tests.measure.support import FakeNvml, cuda_properties, process


def test_cpu_load_above_limit_is_a_problem() -> None:
    busy = check("cpu", loadavg=lambda: (3.9, 2.0, 1.0), cpu_count=2)
    assert not busy.ok and "CPU load average 3.90 on 2 cores exceeds 1.5 per core" in busy.problems[0]
    assert check("cpu", loadavg=lambda: (1.2, 1.0, 1.0), cpu_count=2).ok


def test_gpu_with_another_process_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", None)
    nv = FakeNvml()
    nv.gpu.compute_procs = [process(4242, 1024)]
    got = check("cuda", loadavg=lambda: (0.5, 0.5, 0.5), cpu_count=2, nvml_module=nv)
    assert any("pid 4242" in p for p in got.problems), got.problems


def test_gpu_preflight_of_a_pinned_worker_looks_at_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 2 of 4 (CUDA_VISIBLE_DEVICES=2): the other workers' processes on GPUs 0, 1, 3 are
    not its problem; a stranger on GPU 2 is."""
    nv = FakeNvml(gpus=4)
    for g in nv.gpus:
        g.compute_procs = [process(os.getpid() if g.index == 2 else 5000 + g.index, 512)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", cuda_properties(nv, [2]))
    quiet = lambda: (0.5, 0.5, 0.5)  # noqa: E731
    assert check("cuda", loadavg=quiet, cpu_count=2, nvml_module=nv).ok
    nv.gpus[2].compute_procs.append(process(4242, 512))
    got = check("cuda", loadavg=quiet, cpu_count=2, nvml_module=nv)
    assert got.problems == ("other processes use GPU 2 (cuda:0): pid 4242 (compute, 512 MiB)",)


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


def test_busy_machine_skips_timing_but_still_checks_exact(project: pytest.Pytester, stable_machine: str) -> None:
    r = run(project, "-o", "perfbudget_max_load=-1", "test_p.py::test_mixed")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["*timing checks of k not judged (step_ms): preflight: CPU load average*judged: flops pass*"])
    cpu = project.path / "budgets" / "cpu.yaml"
    cpu.write_text(cpu.read_text().replace("value: 1000", "value: 999"))
    r = run(project, "-o", "perfbudget_max_load=-1", "test_p.py::test_mixed")
    r.assert_outcomes(failed=1)  # the exact check still ran, and fails
    r.stdout.fnmatch_lines(["*flops: fail*"])


def test_busy_machine_fails_under_strict(project: pytest.Pytester, stable_machine: str) -> None:
    r = run(project, "-o", "perfbudget_max_load=-1", "--perf-strict", "test_p.py::test_mixed")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*step_ms: not_judged: preflight: CPU load average*"])


def test_busy_machine_not_declared_stable_shows_timing_as_advisory(project: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Advisory timing fails nothing, so a busy machine is no reason to set it aside: shown, with the load.
    monkeypatch.delenv("PERFBUDGET_STABLE_MACHINE", raising=False)
    r = run(project, "-o", "perfbudget_max_load=-1", "test_p.py::test_mixed")
    r.assert_outcomes(passed=1)
    rec = next(x for x in json.loads((project.path / ".perfbudget" / "results.json").read_text())["records"]
               if x["metric"] == "step_ms")
    assert rec["outcome"] == "advisory" and "measured while CPU load average" in rec["reason"]


def test_fault_mid_run_fails_that_test_and_keeps_the_results_file_complete(project: pytest.Pytester) -> None:
    r = run(project, "-o", "perfbudget_max_load=1e9")
    r.assert_outcomes(passed=2, failed=1)
    r.stdout.fnmatch_lines(["*RuntimeError: CUDA out of memory*", "ERROR test_p.py::test_fault (k2): RuntimeError: CUDA out of memory*"])
    data = json.loads((project.path / ".perfbudget" / "results.json").read_text())
    assert {(x["key"], x["metric"]) for x in data["records"]} == {("k", "step_ms"), ("k", "flops"), ("k2", "flops")}
    assert data["meta"]["errors"][0]["nodeid"] == "test_p.py::test_fault"
