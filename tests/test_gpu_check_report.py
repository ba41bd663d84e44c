"""scripts/gpu-check-report.py: the rehearsal's test selection, the device's return limits, the summary."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check-report.py"


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rehearsal_runs_the_cpu_variant_of_each_gpu_test_that_has_one(report: ModuleType, tmp_path: Path) -> None:
    collected = tmp_path / "collected.txt"
    collected.write_text("\n".join([
        "perf_tests/test_encoder.py::test_operators[cpu]",
        "perf_tests/test_encoder.py::test_operators[cuda]",
        "perf_tests/test_gpu.py::test_gpm_utilisation[cuda]",   # no CPU variant
        "perf_tests/test_tiny.py::test_tiny_mlp_step_time",     # no GPU variant
        "",
        "4 tests collected in 0.9s",
    ]))
    assert report.select(collected) == ["perf_tests/test_encoder.py::test_operators[cpu]"]


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
