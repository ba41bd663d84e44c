"""Tests of measure.operators: the operator table, FLOPs (attention included), roofline, diffs."""

from __future__ import annotations

import json
import types
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perfbudget.measure.operators import (
    DevicePeaks,
    OpMove,
    OpRow,
    OpTable,
    attention_flops,
    count_flops,
    datasheet_peaks,
    moved_operators,
    op_metric,
    profile_steps,
    read_event_field,
    table_from_events,
    trace_steps,
)

from .support import gpu_test

# Fixed ceilings (ridge point 10 FLOP/byte) so roofline classes do not depend on this CPU.
PEAKS = DevicePeaks(
    name="test", flops_per_s={"float32": 100e9}, bytes_per_s=10e9, source="measured"
)


def train_step(batch: int = 8) -> Callable[[], None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 32)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


@pytest.fixture(scope="module")
def base_table() -> OpTable:
    return profile_steps(train_step(), steps=2, warmup=1, peaks=PEAKS)


def test_table_rows_are_per_step_and_sorted(base_table: OpTable) -> None:
    assert base_table.steps == 2 and base_table.device == "cpu"
    selfs = [r.self_ms for r in base_table.rows]
    assert selfs == sorted(selfs, reverse=True)
    assert sum(r.share for r in base_table.rows) == pytest.approx(1.0)
    assert not any(r.name.startswith("ProfilerStep") for r in base_table.rows)
    addmm = base_table.by_name("aten::addmm")
    # Two Linear layers per forward, same every step.
    assert addmm.calls == 2
    # 2*B*in*out per layer: 2*8*32*64 + 2*8*64*8.
    assert addmm.flops == 2 * 8 * 32 * 64 + 2 * 8 * 64 * 8
    assert ((64,), (8, 32), (32, 64), (), ()) in addmm.input_shapes
    assert addmm.roofline in ("compute", "memory")


def test_flop_counter_runs_on_the_warmup_step(base_table: OpTable) -> None:
    fc = base_table.flop_count
    assert fc is not None
    # forward addmm + backward mm: 3x the forward matmul FLOPs (grad input of layer 0 skipped).
    fwd = 2 * 8 * 32 * 64 + 2 * 8 * 64 * 8
    assert fc.by_op["aten::addmm"] == fwd
    assert fc.total_flops == fc.by_op["aten::addmm"] + fc.by_op["aten::mm"]


def test_extra_matmul_moves_aten_mm_in_the_diff(base_table: OpTable) -> None:
    a = torch.randn(256, 256)
    base = train_step()

    def planted() -> None:
        base()
        torch.mm(a, a)

    new = profile_steps(planted, steps=2, warmup=1, peaks=PEAKS)
    diff = base_table.diff(new)
    moved = {c.name: c for c in diff.moved()}
    assert "aten::mm" in moved
    mm = moved["aten::mm"]
    assert mm.status == "changed"
    assert mm.new_calls == mm.base_calls + 1
    assert mm.new_flops - mm.base_flops == 2 * 256**3
    assert mm.delta_ms > 0
    text = str(diff)
    assert "aten::mm" in text and "calls" in text


def test_same_step_twice_names_no_exact_change(base_table: OpTable) -> None:
    again = profile_steps(train_step(), steps=2, warmup=1, peaks=PEAKS)
    exact = [c for c in base_table.diff(again).changes if c.status != "same"]
    assert exact == []


def test_attention_flops_formula() -> None:
    # q = k = v = [2, 4, 8, 16]: forward 2*b*h*s*s*(d+d) = 2*2*4*8*8*32.
    assert attention_flops([2, 4, 8, 16], [2, 4, 8, 16], [2, 4, 8, 16]) == 32768
    # backward 2*b*h*s*s*(3d + 2d).
    assert attention_flops([2, 4, 8, 16], [2, 4, 8, 16], [2, 4, 8, 16], backward=True) == 81920
    # grouped-query attention: 2 kv heads, 8 query heads -> matmuls at 8 heads.
    assert attention_flops([1, 8, 4, 16], [1, 2, 6, 16], [1, 2, 6, 32]) == 2 * 8 * 4 * 6 * 48
    with pytest.raises(ValueError, match="4-D"):
        attention_flops([2, 8, 16], [2, 8, 16], [2, 8, 16])


def attention_step() -> Callable[[], None]:
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    k = torch.randn(2, 4, 8, 16, requires_grad=True)
    v = torch.randn(2, 4, 8, 16, requires_grad=True)

    def step() -> None:
        F.scaled_dot_product_attention(q, k, v).sum().backward()

    return step


def test_cpu_attention_is_counted_by_the_profiler_table() -> None:
    table = profile_steps(attention_step(), steps=1, warmup=1, peaks=None)
    fwd = table.by_name("aten::_scaled_dot_product_flash_attention_for_cpu")
    bwd = table.by_name("aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    assert fwd.flops == 32768
    assert bwd.flops == 81920
    assert fwd.roofline == "unknown"  # peaks=None
    assert table.flop_count is not None and table.flop_count.total_flops == 32768 + 81920


def test_cpu_attention_without_warmup_still_counted_from_shapes() -> None:
    table = profile_steps(attention_step(), steps=1, warmup=0, peaks=None)
    assert table.flop_count is None
    assert table.by_name("aten::_scaled_dot_product_flash_attention_for_cpu").flops == 32768


def test_count_flops_per_op_and_module() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    x = torch.randn(5, 16)
    fc = count_flops(lambda: model(x))
    assert fc.total_flops == 2 * 5 * 16 * 32 + 2 * 5 * 32 * 4
    assert fc.by_op == {"aten::addmm": fc.total_flops}
    assert fc.by_module["Sequential.0"] == 2 * 5 * 16 * 32
    assert count_flops(attention_step()).total_flops == 32768 + 81920


def test_roofline_classes_against_fixed_peaks() -> None:
    assert PEAKS.ridge_flop_per_byte() == pytest.approx(10.0)
    # 256^3 matmul: 33.5 MFLOP over 3 * 256 KiB -> ~43 FLOP/byte.
    assert PEAKS.classify(2 * 256**3, 3 * 256 * 256 * 4) == "compute"
    assert PEAKS.classify(1e6, 1e6) == "memory"
    assert PEAKS.classify(0, 1e6) == "memory"
    assert PEAKS.classify(1e6, 0) == "unknown"
    a = torch.randn(256, 256)
    b = torch.randn(256, 256)
    table = profile_steps(lambda: (torch.mm(a, b), a + b), steps=1, warmup=1, peaks=PEAKS)
    assert table.by_name("aten::mm").roofline == "compute"
    assert table.by_name("aten::add").roofline == "memory"
    mm = table.by_name("aten::mm")
    assert mm.flops / mm.bytes_accessed == pytest.approx(
        2 * 256**3 / (3 * 256 * 256 * 4)
    )


def test_datasheet_peaks_by_device_name() -> None:
    h200 = datasheet_peaks("NVIDIA H200")
    assert h200 is not None and h200.bytes_per_s == 4.8e12
    assert datasheet_peaks("NVIDIA H100 80GB HBM3") is not None
    assert datasheet_peaks("NVIDIA H100 PCIe").name == "NVIDIA H100 PCIe"  # type: ignore[union-attr]
    assert datasheet_peaks("NVIDIA A100-SXM4-40GB").bytes_per_s == 1.555e12  # type: ignore[union-attr]
    assert datasheet_peaks("Tesla T4") is None
    assert h200.ridge_flop_per_byte("bfloat16") > h200.ridge_flop_per_byte("float32")


def test_by_name_suggests_close_names(base_table: OpTable) -> None:
    with pytest.raises(KeyError, match="aten::addmm"):
        base_table.by_name("aten::addm")
    assert base_table.get("nope") is None


def test_top_and_text(base_table: OpTable) -> None:
    top = base_table.top(3)
    assert len(top) == 3 and top[0] == base_table.rows[0]
    assert base_table.top(1, by="flops")[0].name in ("aten::addmm", "aten::mm")
    lines = base_table.lines(5)
    assert lines[0].startswith("operator") and "self (ms)" in lines[0] and len(lines) == 6
    with pytest.raises(ValueError, match="by must be"):
        base_table.top(3, by="nope")  # type: ignore[arg-type]


def test_chrome_trace_export(tmp_path) -> None:
    path = tmp_path / "step.json"
    table = profile_steps(train_step(), steps=1, warmup=1, trace_path=path, peaks=None)
    assert table.trace_path == str(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in events)


def test_trace_steps_writes_the_profiled_steps_trace_and_builds_no_table(tmp_path) -> None:
    path = tmp_path / "steps.json"
    assert trace_steps(train_step(), path=path, steps=2) is None
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep")) == 2
    assert any(e.get("name") == "aten::addmm" for e in events)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        trace_steps(train_step(), path=path, steps=0)


def test_field_fallbacks_for_older_torch() -> None:
    # Before torch 2.4 the profiler only had the CUDA spellings.
    old = types.SimpleNamespace(self_cuda_time_total=7.0, cuda_time_total=9.0)
    assert read_event_field(old, "self_device_time_total") == 7.0
    assert read_event_field(old, "device_time_total") == 9.0
    new = types.SimpleNamespace(self_device_time_total=3.0, self_cuda_time_total=7.0)
    assert read_event_field(new, "self_device_time_total") == 3.0
    assert read_event_field(types.SimpleNamespace(), "self_device_time_total", default=-1) == -1


def test_table_from_old_style_events_uses_device_time() -> None:
    from torch.autograd import DeviceType

    def event(name: str, self_dev: float, self_cpu: float) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            name=name,
            device_type=DeviceType.CPU,
            self_cpu_time_total=self_cpu,
            cpu_time_total=self_cpu,
            self_cuda_time_total=self_dev,
            cuda_time_total=self_dev,
            input_shapes=[[64, 64], [64, 64]],
            flops=2 * 64**3,
            cpu_children=[],
        )

    events = [
        event("aten::mm", 300.0, 20.0),
        event("aten::mm", 300.0, 20.0),
        event("aten::relu", 100.0, 5.0),
    ]
    table = table_from_events(events, steps=2, device="cuda")
    mm = table.by_name("aten::mm")
    assert (
        mm.calls == 1 and mm.self_ms == pytest.approx(0.3) and mm.self_cpu_ms == pytest.approx(0.02)
    )
    assert mm.flops == 2 * 64**3
    assert mm.share == pytest.approx(0.3 / 0.35)
    # No dtypes recorded: bytes unknown, not guessed as float32.
    assert mm.bytes_accessed == 0 and mm.roofline == "unknown"


def test_a_cuda_op_that_launches_kernels_is_a_leaf_with_its_bytes() -> None:
    """On CUDA the runtime calls an op makes are its CPU children: they do not make it a composite, whose
    bytes would be left to children (a memory-bound op would lose its roofline)."""
    from torch.autograd import DeviceType

    def event(name: str, children: list[types.SimpleNamespace]) -> types.SimpleNamespace:
        return types.SimpleNamespace(name=name, device_type=DeviceType.CPU, self_cpu_time_total=5.0,
                                     cpu_time_total=5.0, self_device_time_total=100.0, device_time_total=100.0,
                                     input_shapes=[[4096, 8192]], input_dtypes=["float"], flops=0,
                                     cpu_children=children)

    launch = types.SimpleNamespace(name="cudaLaunchKernel")
    relu = table_from_events([event("aten::relu", [launch, types.SimpleNamespace(name="cuLaunchKernel")])],
                             steps=1, device="cuda").by_name("aten::relu")
    assert relu.bytes_accessed > 0
    composite = table_from_events([event("aten::linear", [launch, types.SimpleNamespace(name="aten::addmm")])],
                                  steps=1, device="cuda").by_name("aten::linear")
    assert composite.bytes_accessed == 0  # its data work is its children's


def test_diff_statuses_and_lines() -> None:
    def row(name: str, self_ms: float, calls: float = 1, flops: float = 0) -> OpRow:
        return OpRow(
            name=name, calls=calls, self_ms=self_ms, total_ms=self_ms, flops=flops, share=0
        )

    base = OpTable(rows=(row("a", 10.0), row("b", 5.0), row("gone", 1.0)), steps=1, device="cpu")
    new = OpTable(rows=(row("a", 10.05), row("b", 8.0), row("new", 2.0)), steps=1, device="cpu")
    diff = base.diff(new)
    status = {c.name: c.status for c in diff.changes}
    assert status == {"a": "same", "b": "same", "gone": "removed", "new": "added"}
    moved = [c.name for c in diff.moved()]
    # "a" moved 0.5 %: noise. "b" moved 60 %: named, first (largest change).
    assert moved[0] == "b" and "a" not in moved and {"gone", "new"} <= set(moved)
    assert diff.changes[0].line().startswith("b: self 5.000 -> 8.000 ms/step (+3.000 ms, +60%)")
    quiet = base.diff(base)
    assert quiet.lines()[1].strip() == "no operator moved beyond noise"


def test_moved_operators_of_constructed_tables_one_slower_one_new_one_gone() -> None:
    def row(name: str, self_ms: float, calls: float = 1) -> OpRow:
        return OpRow(name=name, calls=calls, self_ms=self_ms, total_ms=self_ms, flops=0, share=0)

    base = OpTable(rows=(row("aten::mm", 4.0), row("aten::relu", 2.0), row("aten::gone", 1.0),
                         row("aten::tiny", 0.01)), steps=1, device="cpu")
    new = OpTable(rows=(row("aten::mm", 6.0), row("aten::relu", 2.02), row("aten::new", 0.5, calls=2),
                        row("aten::tiny", 0.02)), steps=1, device="cpu")
    moves = base.diff(new).moves()
    # Slower by 50 % first; then the operators on one side only, largest first, each once (by time).
    assert [(m.op, m.family, m.before, m.after) for m in moves] == [
        ("aten::mm", "op_self_ms", 4.0, 6.0), ("aten::gone", "op_self_ms", 1.0, None),
        ("aten::new", "op_self_ms", None, 0.5)]
    assert moves[0].change == pytest.approx(0.5) and moves[0].against == "table"
    assert moves[1].change == -1.0 and moves[2].one_sided
    # relu moved 1 % (noise); tiny doubled, but by less than 1 % of the step.
    assert {c.name for c in base.diff(new).moved()} == {"aten::mm", "aten::gone", "aten::new"}


def test_one_rule_names_failing_checks_first_and_moves_beyond_tolerance() -> None:
    def check(op: str, before: float | None, after: float, *, failing: bool = False, tol: float = 0.05) -> OpMove:
        return OpMove(op=op, family="op_self_ms", before=before, after=after, unit="ms", tolerance=tol,
                      failing=failing)

    candidates = [check("aten::a", 1.0, 1.3), check("aten::b", 1.0, 1.04), check("aten::c", 1.0, 1.06, failing=True),
                  check("aten::d", None, 0.2), check("aten::e", 2.0, 1.0), check("aten::f", 1.0, 1.06, tol=0.1)]
    assert [m.op for m in moved_operators(candidates, k=None)] == ["aten::c", "aten::e", "aten::a", "aten::d"]
    assert [m.op for m in moved_operators(candidates, k=2)] == ["aten::c", "aten::e"]
    # A floor on the absolute change leaves out a tiny operator's large relative change.
    tiny = [check("aten::t", 0.001, 0.002)]
    assert moved_operators(tiny) and not moved_operators(tiny, min_delta={"op_self_ms": 0.01})
    assert op_metric("op_share[aten::mm]") == ("op_share", "aten::mm") and op_metric("step_ms") is None


def test_profile_steps_validation() -> None:
    with pytest.raises(ValueError, match="steps"):
        profile_steps(lambda: None, steps=0)
    with pytest.raises(ValueError, match="device"):
        profile_steps(lambda: None, device="tpu")  # type: ignore[arg-type]


@gpu_test
def test_cuda_table_uses_device_self_time() -> None:
    a = torch.randn(1024, 1024, device="cuda")
    table = profile_steps(lambda: a @ a, steps=2, warmup=1, device="cuda")
    mm = table.by_name("aten::mm")
    assert mm.self_ms > 0 and table.peaks is not None


def test_new_operators_are_chosen_by_their_median_share_over_rounds() -> None:
    from perfbudget.measure.operators.profiling import OpRounds

    def table(addmm: float, transpose: float) -> OpTable:
        rows = (OpRow(name="aten::addmm", calls=1, self_ms=addmm, total_ms=addmm, flops=0, share=addmm / (addmm + transpose)),
                OpRow(name="aten::transpose", calls=1, self_ms=transpose, total_ms=transpose, flops=0,
                      share=transpose / (addmm + transpose)))
        return OpTable(rows=rows, steps=1, device="cpu")

    # Four rounds; in one the process was stopped inside transpose (0.9 of that round).
    rounds = OpRounds(tables=(table(1.0, 0.01), table(1.0, 0.01), table(0.1, 0.9), table(1.0, 0.01)))
    assert rounds.top(0.05) == ["aten::addmm"]
    assert rounds.mean_share("aten::transpose") > 0.05  # what the mean would have listed
