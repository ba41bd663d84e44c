"""The lease plan (perfbudget.lease): it fits a lease, it is computed for the suite's constants as they are,
it covers every GPU test the update pass selects, and the plugin and the recorder follow it under the lease."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

# In-process pytester runs restore sys.modules afterwards; importing torch here keeps it loaded.
import torch  # noqa: F401

from perfbudget import lease
from perfbudget.recorder import PerfRecorder, energy, gpu, operators, serving
from torchlevers.workloads import DecoderConfig, EncoderConfig

ROOT = Path(__file__).resolve().parent.parent


def test_the_plan_says_its_total_against_the_lease_with_the_cuda_only_tests_first() -> None:
    text = lease.plan_text()
    # Literal: a constant the estimates are computed from that changes changes this total.
    assert text.endswith("\ntotal 418 s") and round(lease.total_s()) == 418 <= lease.LIMIT_S
    assert [t.split("::")[0] for t in lease.ORDER[:4]] == ["perf_tests/test_gpu.py"] * 2 + ["perf_tests/test_energy.py"] * 2
    assert not any("test_compile" in t for t in lease.ORDER)  # a cold compile would take the A/A's time
    parts = {p.name: p for p in lease.PARTS}
    assert [p.name for p in lease.PARTS] == ["set-up", "update", "check", "a/a", "finish"]
    assert set(parts["check"].tests) <= set(lease.ORDER) and parts["a/a"].tests == parts["check"].tests
    # The A/A's bound holds its estimate, even when it starts as late as planned.
    assert parts["a/a"].bound_s >= parts["a/a"].seconds
    assert "~ 142.9  2 pairs of the encoder step and operators" in text  # not measured: marked
    assert f"{lease.STEP_MS:.1f}" == "117.4" and f"{lease.STEP_RATIO:.3f}" == "1.792"  # 2 x 58.7 / 65.5
    # Unprofiled steps scale with the step; profiled ones are host-bound and keep their measured cost.
    assert "~  12.5  perf_tests/test_encoder.py::test_step_latency_and_throughput[cuda]  (3.9 measured x 1.792 + 7" in text
    assert "~   9.5  perf_tests/test_encoder.py::test_operators[cuda]  (50.5 s measured at 32 rounds x 6/32, profiled" in text


def test_the_estimates_are_computed_for_the_suites_constants_as_they_are() -> None:
    levers = (ROOT / "perf_tests" / "test_levers.py").read_text()
    energy_test = (ROOT / "perf_tests" / "test_energy.py").read_text()
    gpu_test = (ROOT / "perf_tests" / "test_gpu.py").read_text()
    large = EncoderConfig.for_size("large", device="cuda")
    live = {
        "OP_ROUND_STEPS": operators.OP_ROUND_STEPS,
        "encoder batch": large.batch_size,
        "encoder sequence": large.seq_len,
        "occupancy rounds": gpu.OCC_ROUNDS,
        "gpm steps": int(re.search(r"for _ in range\((\d+)\):\n\s+encoder_train.step\(\)", gpu_test).group(1)),  # type: ignore[union-attr]
        "energy windows": inspect.signature(energy.Energy.energy).parameters["windows"].default,
        "decoder requests": DecoderConfig.for_size("large", device="cpu").n_requests,
        "energy requests": int(re.search(r"requests\(\)\[:(\d+)\]", energy_test).group(1)),  # type: ignore[union-attr]
        "speedup rounds": int(re.search(r"^SPEEDUP_ROUNDS = (\d+)", levers, re.M).group(1)),  # type: ignore[union-attr]
    }
    assert live == lease.ASSUMED, "a constant the lease plan's estimates assume changed: update src/perfbudget/lease.py"


def test_every_gpu_test_the_update_pass_selects_is_planned() -> None:
    script = (ROOT / "scripts" / "gpu-check.sh").read_text()
    selection = re.search(r'update_tests=\(perf_tests -m "([^"]+)"\)', script)
    assert selection is not None
    got = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-m", selection.group(1), "--collect-only",
                          "-q", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, check=True)
    collected = [line for line in got.stdout.splitlines() if "::" in line]
    assert sorted(collected) == sorted(lease.ORDER)


def test_a_test_runs_at_its_place_in_the_plan_its_cpu_variant_at_its_cuda_ones_unplanned_after() -> None:
    first, second = lease.ORDER[:2]
    assert lease.position(first) == 0 and lease.position(second.replace("[cuda]", "[cpu]")) == 1
    assert lease.position("perf_tests/test_tiny.py::test_tiny_mlp_step_time") == len(lease.ORDER)


def test_the_plans_command_line_gives_the_script_its_tests_bounds_and_rows() -> None:
    def run(*args: str) -> str:
        # By path, with no package import: the script runs it before perfbudget is installed.
        return subprocess.run([sys.executable, str(ROOT / "src" / "perfbudget" / "lease.py"), *args],
                              capture_output=True, text=True, check=True).stdout

    assert run("tests", "a/a").split() == list(lease.PARTS[3].tests)
    assert run("bound", "update").strip() == str(lease.PARTS[1].bound_s)
    assert (run("limit").strip(), run("pairs").strip()) == (str(lease.LIMIT_S), str(lease.AA_PAIRS))
    rows = [r.split("\t") for r in run("tsv").splitlines()]
    assert rows[0] == ["set-up", "pip install", "2.0"]
    assert len(rows) == sum(len(p.steps) for p in (*lease.PARTS, lease.COMPILE))
    assert run("tests", "compile").split() == list(lease.COMPILE.tests)
    assert subprocess.run([sys.executable, str(ROOT / "src" / "perfbudget" / "lease.py"), "bound", "nope"],
                          capture_output=True).returncode == 2


# -- the recorder and the plugin under the lease ------------------------------------------------


def test_under_the_lease_serving_operators_and_occupancy_take_the_plans_rounds(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    from perfbudget.budgets import load_dir
    from perfbudget.device import DeviceInfo
    from perfbudget.verdict.judge import Judge, JudgeConfig

    me = DeviceInfo(type="cpu", model="Test CPU", count=1, threads=1, cpuid="6/207/2", isa="avx2", isa_class="avx2")

    class Profiled(Exception):  # stops perf.operators at its profiler, which is handed the rounds
        pass

    def profile_rounds(step: object, *, rounds: int, **_: object) -> None:
        raise Profiled(rounds)

    monkeypatch.setattr(operators, "profile_rounds", profile_rounds)
    monkeypatch.setattr(gpu.Gpu, "_occupancy_pass", lambda self, step, *, rounds, steps: profile_rounds(step, rounds=rounds))
    served: list[int] = []

    def requests() -> list:
        served.append(1)
        return [lambda: iter([1, 2])] * 3

    monkeypatch.setattr(gpu, "_gpm_pass", lambda window, *, windows, metrics: profile_rounds(window, rounds=windows))
    monkeypatch.setattr(gpu, "_device_pass", lambda step, *, steps, **_: profile_rounds(step, rounds=steps))
    for on, want_serve, want_ops, want_occ, want_gpm, want_steps in (
            (True, lease.LEASE_SERVE_ROUNDS, lease.LEASE_OP_ROUNDS, lease.LEASE_OCC_ROUNDS, lease.LEASE_GPM_WINDOWS,
             lease.LEASE_DEVICE_STEPS),
            (False, serving.SERVE_ROUNDS, operators.OP_ROUNDS, gpu.OCC_ROUNDS, gpu.GPM_WINDOWS, gpu.DEVICE_STEPS)):
        rec = PerfRecorder(Judge("k", me, load_dir(tmp_path), JudgeConfig()), lease=on)
        served.clear()
        rec.serve(requests)
        assert len(served) == want_serve
        with pytest.raises(Profiled) as profiled:
            rec.operators(lambda: None)
        assert profiled.value.args == (want_ops,)
        with pytest.raises(Profiled) as profiled:
            rec.occupancy(lambda: None)
        assert profiled.value.args == (want_occ,)
        with pytest.raises(Profiled) as profiled:
            rec.gpm(lambda: None)
        assert profiled.value.args == (want_gpm,)
        with pytest.raises(Profiled) as profiled:
            rec._device_time(lambda: None, None, explain=None)  # type: ignore[arg-type]
        assert profiled.value.args == (want_steps,)
    served.clear()
    rec.serve(requests, rounds=2)  # a test's own rounds win
    assert len(served) == 2


def _suite(pytester: pytest.Pytester) -> None:
    test = "\n@pytest.mark.parametrize('device', ['cuda'])\ndef test_{}(perf, device):\n    perf.record('flops', 1)\n"
    head = "import pytest\n"
    folder = pytester.mkdir("perf_tests")
    (folder / "test_compile.py").write_text(head + "pytestmark = pytest.mark.compiles\n" + test.format("compile_health"))
    (folder / "test_encoder.py").write_text(head + test.format("operators") + test.format("unplanned")
                                            + test.format("step_latency_and_throughput"))
    (folder / "test_gpu.py").write_text(head + test.format("gpm_utilisation") + test.format("sm_occupancy_and_kernels"))


def test_under_the_lease_the_plugin_runs_the_plans_order_and_the_results_say_so(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    plain = pytester.runpytest_inprocess("perf_tests", "--collect-only", "-q", "-p", "no:cacheprovider")
    leased = pytester.runpytest_inprocess("perf_tests", "-p", "no:cacheprovider", "-o", "perfbudget_lease=true",
                                          "-o", "perfbudget_max_load=1e9", "--perf-json", "r.json", "-v")
    ran = [line.split(" ")[0] for line in leased.outlines if line.startswith("perf_tests/") and "::" in line]
    assert ran == ["perf_tests/test_gpu.py::test_sm_occupancy_and_kernels[cuda]",
                   "perf_tests/test_gpu.py::test_gpm_utilisation[cuda]",
                   "perf_tests/test_encoder.py::test_step_latency_and_throughput[cuda]",
                   "perf_tests/test_encoder.py::test_operators[cuda]",
                   "perf_tests/test_encoder.py::test_unplanned[cuda]",    # unplanned: after the plan's
                   "perf_tests/test_compile.py::test_compile_health[cuda]"]  # compiling: last whatever the plan
    assert [line for line in plain.outlines if "::" in line][:2] == [  # file order, compiling last
        "perf_tests/test_encoder.py::test_operators[cuda]", "perf_tests/test_encoder.py::test_unplanned[cuda]"]
    assert json.loads((pytester.path / "r.json").read_text())["meta"]["lease"] is True
    pytester.runpytest_inprocess("perf_tests", "-p", "no:cacheprovider", "-o", "perfbudget_max_load=1e9",
                                 "--perf-json", "plain.json")
    assert "lease" not in json.loads((pytester.path / "plain.json").read_text())["meta"]
