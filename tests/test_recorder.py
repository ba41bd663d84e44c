"""PerfRecorder without pytest: failing records carry the operators that moved, as data, and the failure message names them."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

import pytest
import torch

from perfbudget.budgets import load_dir
from perfbudget.budgets.update import apply_updates
from perfbudget.device import DeviceInfo
from perfbudget.extras import OperatorMoves
from perfbudget.measure import instructions as ins
from perfbudget.measure.measurement import Passes
from perfbudget.measure.unmeasurable import Unmeasurable
from perfbudget.recorder import CountedSteps, PerfRecorder, gpu
from perfbudget.recorder.core import Timed
from perfbudget.report import markdown_report, terminal_report
from perfbudget.report.terminal import gpu_steps
from perfbudget.verdict.judge import Judge, JudgeConfig, Stored, Update
from perfbudget.verdict.rule import tolerance_for
from perfbudget.verdict.text import decision_text

# A machine with an identity, declared stable, so its stored timing budgets gate.
ME = DeviceInfo(type="cpu", model="Test CPU", count=1, threads=1, cpuid="6/207/2", isa="avx2", isa_class="avx2")

BUDGETS = """schema: 1
device: {{type: cpu, identity: {identity}, threads: 1}}
budgets:
  k:
    step_ms: {{value: 0.00001, tolerance: 0.05}}
    op_self_ms[aten::mm]: {{value: 8.0, tolerance: 0.05}}
    op_self_ms[aten::gelu]: {{value: 3.0, tolerance: 0.05}}
    op_count[aten::mm]: {{value: 6, tolerance: 0.0}}
"""


@pytest.fixture
def recorder(tmp_path: Path) -> PerfRecorder:
    (tmp_path / "cpu-me.yaml").write_text(BUDGETS.format(identity=ME.identity))
    judge = Judge("k", ME, load_dir(tmp_path), JudgeConfig(stable_identity=ME.identity))
    return PerfRecorder(judge, nodeid="t.py::test_k")


def test_failing_records_carry_the_moved_operators_and_the_message_names_them(recorder: PerfRecorder) -> None:
    recorder.record("op_self_ms[aten::mm]", [12.0 + 0.01 * i for i in range(30)])  # +50 %: fails
    recorder.record("op_self_ms[aten::gelu]", [3.0 + 0.001 * i for i in range(30)])  # within tolerance
    recorder.record("op_count[aten::mm]", 7)  # one call more: fails
    recorder.record("step_ms", [1.0] * 30)
    records = {r.metric: r for r in recorder.records()}
    assert {m for m, r in records.items() if r.outcome == "fail"} == {"op_self_ms[aten::mm]", "op_count[aten::mm]",
                                                                      "step_ms"}
    moved = OperatorMoves.from_extra(records["step_ms"].extra)
    assert moved is not None and not records["step_ms"].attribution
    assert [(m.op, m.family, m.before, m.outcome) for m in moved.moves] == [
        ("aten::mm", "op_self_ms", 8.0, "fail"), ("aten::mm", "op_count", 6.0, "fail")]
    assert OperatorMoves.from_extra(records["op_count[aten::mm]"].extra) == moved
    assert OperatorMoves.from_extra(records["op_self_ms[aten::gelu]"].extra) is None  # passed: nothing to explain

    text = decision_text(recorder.decision(), list(records.values()), key="k", device_label=ME.label)
    tail = text.split("operators that moved:", 1)[1].split("judged:", 1)[0]
    assert "aten::mm op_self_ms: 12.14 ms vs budget 8 ms (+51.8%, fail)" in tail
    assert "aten::mm op_count: 7 vs budget 6 (+16.7%, fail)" in tail and "aten::gelu" not in tail


def test_a_failing_step_is_explained_by_profiling_it_against_the_op_budgets(recorder: PerfRecorder) -> None:
    a = torch.randn(64, 64)

    def step() -> None:
        (a @ a).relu_()

    step_ms, _ = recorder.step(step, samples_per_step=1, min_samples=5, max_ms=5, warmup_ms=1)
    assert step_ms.outcome == "fail" and recorder.failure_step is step
    record = next(r for r in recorder.records() if r.metric == "step_ms")
    moved = OperatorMoves.from_extra(record.extra)
    assert moved is not None and "profiled when step_ms failed" in moved.note
    mm = next(m for m in moved.moves if m.op == "aten::mm")
    # Profiled now against its budget, not judged: no verdict of its own.
    assert mm.family == "op_self_ms" and mm.before == 8.0 and mm.after is not None and mm.outcome == ""
    assert "aten::gelu" in {m.op for m in moved.moves}  # budgeted and not run now: -100 %


def test_instructions_outside_a_counter_are_unmeasurable_with_how_to_run_them(recorder: PerfRecorder) -> None:
    a = torch.randn(16, 16)
    v = recorder.instructions(lambda: a @ a, steps=2, warmup=1)
    if v.outcome == "unmeasurable":  # no valgrind around this process and no hardware counter (a VM)
        assert v.metric == "instructions[callgrind]"
        assert "perfbudget instructions" in v.reason
    else:  # a machine whose CPU counter opens: counted, and named by its counter
        assert v.metric == "instructions[hardware]" and v.value is not None and v.value > 0


def test_a_counted_step_records_its_instructions_and_no_timing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the plugin sets for a test marked `instructions` in a session under callgrind.
    (tmp_path / "cpu-me.yaml").write_text(BUDGETS.format(identity=ME.identity))
    judge = Judge("k", ME, load_dir(tmp_path), JudgeConfig(stable_identity=ME.identity))
    rec = PerfRecorder(judge, counted_steps=CountedSteps(steps=3, warmup=2))
    asked: list[dict[str, object]] = []

    def count(step: object, **kw: object) -> Unmeasurable:
        asked.append(kw)
        return Unmeasurable(reason="not running under valgrind; run it under callgrind")

    monkeypatch.setattr(ins, "instructions", count)
    calls = []
    got = rec.step(lambda: calls.append(1), samples_per_step=4)
    assert asked == [{"steps": 3, "warmup": 2, "counter": "callgrind"}] and not calls  # never timed
    assert [v.metric for v in got] == ["instructions[callgrind]"]
    assert [v.metric for v in rec.verdicts] == ["instructions[callgrind]"]
    # The key's step_ms budget belongs to the timed step, not to this count.
    assert rec.decision().not_measured == () and rec.failure_step is None
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        CountedSteps(steps=0)


def test_instruction_counts_are_judged_like_exact_values_with_their_tolerance(tmp_path: Path) -> None:
    from perfbudget.metrics import lookup

    info = lookup("instructions[callgrind]")
    assert info.kind == "count" and not info.statistical and tolerance_for(info).value == 0.005
    (tmp_path / "cpu-me.yaml").write_text(
        f"schema: 1\ndevice: {{type: cpu, identity: {ME.identity}}}\nbudgets:\n  k:\n"
        "    instructions[callgrind]: {value: 1000000}\n")
    judge = Judge("k", ME, load_dir(tmp_path), JudgeConfig())  # gates on any machine of that identity
    rec = PerfRecorder(judge)
    assert rec.record("instructions[callgrind]", 1_004_000.0).outcome == "pass"
    assert rec.record("instructions[callgrind]", 1_006_000.0).outcome == "fail"  # +0.6 %: beyond 0.5 %
    assert rec.record("instructions[callgrind]", 990_000.0).outcome == "stale"


def test_instruction_profiles_round_trip_and_name_the_functions_that_moved() -> None:
    from perfbudget.extras import ExtraError, InstructionProfile

    before = InstructionProfile.of("callgrind Ir", [("at::mm", 10.0, 900.0), ("gelu", 50.0, 50.0)])
    after = InstructionProfile.of("callgrind Ir", [("at::mm", 10.0, 1300.0), ("gelu", 50.0, 50.0),
                                                  ("at::add", 40.0, 40.0)], history_dependent_per_step=120.5)
    assert InstructionProfile.from_extra(after.to_extra()) == after
    assert InstructionProfile.from_extra(after.to_extra()).history_dependent_per_step == 120.5
    older = {"instruction_profile": {"counter": "callgrind Ir", "functions": [["f", 1, 2]]}}  # written before the field
    assert InstructionProfile.from_extra(older).history_dependent_per_step == 0.0  # type: ignore[union-attr]
    with pytest.raises(ExtraError, match="history_dependent_per_step"):
        InstructionProfile.from_extra({"instruction_profile": {**older["instruction_profile"],
                                                               "history_dependent_per_step": "many"}})
    lines = after.moved_against(before)
    assert lines[0].startswith("at::mm: 900 -> 1,300 per step (+400)") and any("at::add" in x for x in lines)
    assert not any(x.startswith("gelu") for x in lines)
    with pytest.raises(ExtraError, match="instruction_profile"):
        InstructionProfile.from_extra({"instruction_profile": {"counter": "x", "functions": [["f", "1", 2]]}})


def test_a_memory_phase_that_runs_nothing_records_no_metric_and_its_budget_is_not_measured(tmp_path: Path) -> None:
    # The bf16 encoder's policy owns backward and the optimizer step: optimizer=None, one phase
    # renamed. A budget left for the optimizer phase is reported, never passed on a 0 MiB value.
    (tmp_path / "cpu.yaml").write_text(
        "schema: 1\ndevice: {type: cpu}\nbudgets:\n  k:\n"
        "    peak_allocated_mib[optimizer]: {value: 1.0}\n")
    rec = PerfRecorder(Judge("k", ME, load_dir(tmp_path), JudgeConfig()))
    model = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16)
    got = rec.memory(lambda: model(x).sum(), optimizer=None, names={"backward": "backward_and_optimizer"})
    assert set(got) == {"forward", "backward_and_optimizer"}
    assert {r.metric for r in rec.records()} == {"peak_allocated_mib[forward]",
                                                 "peak_allocated_mib[backward_and_optimizer]"}
    assert [m for m, _ in rec.decision().not_measured] == ["peak_allocated_mib[optimizer]"]


def test_a_memory_check_is_re_run_for_its_failure_artifacts() -> None:
    # The CUDA memory snapshot of a failing peak_allocated_mib is taken by re-running the step:
    # perf.memory hands its phases over as that step, unless the test chose one.
    rec = PerfRecorder(Judge("k", ME, load_dir(Path("/nonexistent")), JudgeConfig()))
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    rec.memory(lambda: model(x).sum(), optimizer=opt)
    assert rec.failure_step is not None
    before = model.weight.detach().clone()
    rec.failure_step()
    assert not torch.equal(before, model.weight), "the re-run step is the whole step, optimizer included"


def test_a_gpm_metric_nvml_refuses_is_unmeasurable_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    # NVML GPM answers each metric with its own status; tensor_util refused (as on a GPU
    # without it) while sm_occupancy came back.
    from perfbudget.measure import nvml
    from perfbudget.recorder import gpu as recorder_module

    monkeypatch.setattr(nvml, "gpm_metrics", lambda window, metrics: nvml.GpmMetrics(
        values_pct={"sm_occupancy": 40.0}, window_s=1.0, padded_s=0.0))
    got = recorder_module._gpm_pass(lambda: None, windows=2, metrics=("sm_occupancy", "tensor_util"))
    assert isinstance(got, recorder_module.Unmeasurable) and "tensor_util" in got.reason
    monkeypatch.setattr(nvml, "gpm_metrics", lambda window, metrics: nvml.GpmMetrics(
        values_pct={"sm_occupancy": 40.0, "tensor_util": 10.0}, window_s=1.0, padded_s=0.0))
    assert recorder_module._gpm_pass(lambda: None, windows=2, metrics=("sm_occupancy", "tensor_util")) == {
        "sm_occupancy": [0.4, 0.4], "tensor_util": [0.1, 0.1]}


def test_serve_takes_rounds_of_the_same_requests_in_order(recorder: PerfRecorder) -> None:
    served: list[int] = []

    def request(i: int):
        def stream():
            served.append(i)
            for _ in range(3):
                yield i
        return stream

    def requests():
        return [request(i) for i in range(5)]

    recorder.serve(requests, rounds=3)
    assert served == list(range(5)) * 3  # an A/B run pairs request i with itself, round by round
    records = {r.metric: r for r in recorder.records()}
    assert records["e2e_ms_p50"].n == 15 and records["ttft_ms"].n == 15
    assert records["token_ms"].n == 15 * 2  # the tokens after each first one
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        recorder.serve(requests, rounds=0)


def test_each_family_owns_registered_metrics_and_its_own_methods() -> None:
    # The recorder is a face over its families: a family's metric names are registered and no
    # other family records them; every public method of the face is one family's.
    from perfbudget.metrics import METRICS
    from perfbudget.recorder import FAMILIES, RecorderCore

    owned = [m for family in FAMILIES for m in family.METRICS]
    assert owned and set(owned) <= set(METRICS), set(owned) - set(METRICS)
    assert len(owned) == len(set(owned)), "a metric recorded by two families"
    public = {n for n in dir(PerfRecorder) if not n.startswith("_")} - set(dir(RecorderCore)) - {"records", "decision",
                                                                                                 "counted_steps"}
    for name in public:
        owners = [f.__name__ for f in FAMILIES if name in vars(f)]
        assert len(owners) == 1, f"{name}: defined by {owners or 'no family'}"
    assert set(PerfRecorder.__mro__) >= set(FAMILIES)


# -- a GPU step's device side -----------------------------------------------------------------

H200_STEPS = json.loads((Path(__file__).parent / "data" / "measure" / "h200-steps.json").read_text())
H200 = DeviceInfo(**H200_STEPS["device"])


def _gpu_recorder(budgets: Path, *, update: bool = False, key: str = "encoder-train") -> PerfRecorder:
    """A recorder on the H200 the reference samples come from, declared stable: its stored timing gates."""
    judging = Update() if update else Stored()
    judge = Judge(key, H200, load_dir(budgets), JudgeConfig(stable_identity=H200.identity, judging=judging))
    return PerfRecorder(judge, nodeid="perf_tests/test_encoder.py::test_step_latency_and_throughput[cuda]")


def _profiled_steps(*, steps: int, kernel_us: float) -> dict[str, Any]:
    """A kineto trace of ``steps`` profiled steps, 1 ms apart: two kernels on two streams that
    overlap by half of one, and a 10 us copy, each launched by its own host call."""
    events: list[dict[str, Any]] = []
    for i in range(steps):
        t0 = 1000.0 * i
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 2}", "ts": t0, "dur": 1000})
        for j, (cat, start, dur, stream) in enumerate((("kernel", 100, kernel_us, 7), ("kernel", 100 + kernel_us / 2,
                                                        kernel_us, 13), ("gpu_memcpy", 800, 10, 7))):
            corr = 10 * i + j
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "launch", "ts": t0 + 10 + j, "dur": 1,
                           "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": cat, "name": f"{cat}{j}", "ts": t0 + start, "dur": dur,
                           "args": {"correlation": corr, "stream": stream}})
    return {"traceEvents": events}


def _profiler_writing(monkeypatch: pytest.MonkeyPatch, trace: dict[str, Any]) -> None:
    """The profiled pass needs a GPU: here the profiler writes a constructed trace (kineto's layout)."""
    monkeypatch.setattr(gpu, "trace_steps", lambda step, *, path, **kw: Path(path).write_text(
        json.dumps(trace)))


def test_a_gpu_step_records_its_busy_time_and_kernels_beside_the_wall_time_and_says_its_idle_share(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 200 us kernels overlapping by 100 us on two streams plus a 10 us copy: 310 us busy, 410 us summed.
    _profiler_writing(monkeypatch, _profiled_steps(steps=10, kernel_us=200))
    wall = Passes(lambda: Timed([0.62] * 30))
    kernels, busy = _gpu_recorder(tmp_path)._device_time(lambda: None, wall, explain=None)
    assert (kernels.metric, kernels.value, kernels.outcome) == ("kernel_count", 2, "unbudgeted")
    assert busy.metric == "step_device_ms" and busy.value == pytest.approx(0.31) and busy.n == 10
    assert busy.outcome == "unbudgeted"  # device time gates on a GPU: a budget is asked for
    # The idle share is said, never judged: it rises when the GPU's own work gets faster.
    assert busy.attribution == ("per step: 0.310 ms busy, 0.410 ms summed over streams, 2 kernels, "
                                "1 copies and fills; the GPU idle 50% of the unprofiled step",)


def test_a_trace_without_device_work_leaves_the_device_time_unmeasurable(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _profiler_writing(monkeypatch, {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 5}]})
    got = _gpu_recorder(tmp_path)._device_time(lambda: None, Passes(lambda: Timed([1.0] * 30)), explain=None)
    assert [(v.metric, v.outcome) for v in got] == [("step_device_ms", "unmeasurable")]
    assert "no kernel, copy or fill launched in 1 profiled steps" in got[0].reason


def test_a_stored_gpu_check_after_an_update_gates_device_time_and_shows_wall_time(tmp_path: Path) -> None:
    # The H200's encoder step: --update-budgets read 51.2 ms wall, the stored check minutes later
    # on the same code 56.5 ms over its three rounds (the old rule failed it), while every
    # operator's device time repeated within 0.1 %. The step's own device time predates its
    # metric: aten::mm's device time per step, measured in the same passes, stands in for it.
    wall, mm = H200_STEPS["encoder-train"]["step_ms"], H200_STEPS["encoder-train"]["op_self_ms[aten::mm]"]
    update = _gpu_recorder(tmp_path, update=True)
    update.record("step_ms", wall["update"])
    update.record("step_device_ms", mm["pass1"])
    written = apply_updates([m for r in update.records() if (m := r.measured()) is not None], load_dir(tmp_path))
    assert not written.errors
    assert {(c.metric, round(c.new, 2)) for c in written.changes} == {("step_ms", 51.2), ("step_device_ms", 4.09)}

    check = _gpu_recorder(tmp_path)
    step_ms = check.record("step_ms", wall["check"])
    assert step_ms.outcome == "advisory" and step_ms.advice == "fail"  # shown as beyond its budget, not failing
    assert "step_device_ms budget gates here" in step_ms.reason and "perfbudget ab" in step_ms.reason
    assert check.record("step_device_ms", mm["pass2"]).outcome == "pass"
    assert check.decision().outcome == "pass"

    slower = _gpu_recorder(tmp_path)  # a real regression of the GPU's work: +5 %
    device = slower.record("step_device_ms", [x * 1.05 for x in mm["pass2"]])
    assert device.outcome == "fail" and device.budget is not None and device.budget.tolerance == 0.02
    assert slower.decision().outcome == "fail"


def test_the_reports_say_how_each_gpu_step_used_the_gpu(tmp_path: Path) -> None:
    # The H200's two steps as the suite records them: wall samples, kernels and FLOPs per step, and
    # as the device time the aten operators' summed self device time per step (an operator's device
    # time over its share of it), what those passes measured.
    records = []
    for key, op in (("encoder-train", "aten::mm"), ("segmentation-train", "aten::convolution_backward")):
        got = H200_STEPS[key]
        busy = median(got[f"op_self_ms[{op}]"]["pass2"]) / got[f"op_share[{op}]"]["pass2"]
        recorder = _gpu_recorder(tmp_path, key=key)
        recorder.record("step_ms", got["step_ms"]["pass2"])
        recorder.record("step_device_ms", [busy] * len(got["step_ms"]["pass2"]))
        recorder.record("flops", got["flops"])
        if "kernel_count" in got:
            recorder.record("kernel_count", got["kernel_count"])
        records += recorder.records()
    assert [s.line() for s in gpu_steps(records)] == [
        "encoder-train: 1744 kernels/step, GPU idle 66 %, 74 TFLOP/s: launch-bound",
        "segmentation-train: GPU idle 2 %, 35 TFLOP/s: GPU-bound"]
    assert "encoder-train: 1744 kernels/step, GPU idle 66 %, 74 TFLOP/s: launch-bound" in terminal_report(records)
    assert "| `encoder-train` | 1744 | 66 % | 74 | launch | cuda NVIDIA H200 |" in markdown_report(records)
    assert gpu_steps([r.with_(device=ME) for r in records]) == []  # a CPU step has no device side
