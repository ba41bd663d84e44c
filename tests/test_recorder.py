"""PerfRecorder without pytest: failing records carry the operators that moved, as data, and the failure message names them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from perfbudget.budgets import load_dir
from perfbudget.device import DeviceInfo
from perfbudget.extras import OperatorMoves
from perfbudget.judge import Judge, JudgeConfig
from perfbudget.outcome import decision_text
from perfbudget.recorder import PerfRecorder

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
