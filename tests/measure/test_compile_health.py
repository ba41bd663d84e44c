"""Tests of measure.compile_health on tiny functions (backend "eager": dynamo only, no codegen)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from perfbudget.measure.compile_health import (
    CompileCounters,
    RecompileError,
    explain_graph_breaks,
    no_recompiles,
    read_counters,
    reset_compiler,
    warm_until_stable,
)

torch_dynamo = pytest.importorskip("torch._dynamo")


@pytest.fixture(autouse=True)
def _fresh_compiler() -> Iterator[None]:
    # Counters and caches are process-global: every test starts and ends clean.
    reset_compiler()
    yield
    reset_compiler()


def smooth(x: torch.Tensor) -> torch.Tensor:
    return (x * 2 + 1).relu()


def broken(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    torch._dynamo.graph_break()  # planted
    return y.cos()


def test_planted_graph_break_is_counted_with_its_reason() -> None:
    before = read_counters()
    torch.compile(smooth, backend="eager")(torch.randn(4))
    clean = read_counters() - before
    assert clean.graph_breaks == 0 and clean.unique_graphs == 1

    before = read_counters()
    torch.compile(broken, backend="eager")(torch.randn(4))
    delta = read_counters() - before
    assert delta.graph_breaks == 1
    (reason,) = delta.break_reasons
    assert "graph_break()" in reason
    # Two graphs: before and after the break.
    assert delta.unique_graphs == 2


def test_explain_names_the_break_location() -> None:
    report = explain_graph_breaks(broken, torch.randn(4))
    assert report.graph_count == 2 and report.graph_break_count == 1
    (brk,) = report.breaks
    assert brk.location is not None and "test_compile_health.py" in brk.location
    assert "broken" in brk.location
    assert "graph break" in report.lines()[0]


def test_planted_recompile_is_counted() -> None:
    f = torch.compile(smooth, backend="eager", dynamic=False)
    f(torch.randn(4))
    before = read_counters()
    f(torch.randn(4))
    assert (read_counters() - before).recompiles == 0
    f(torch.randn(8))  # planted: a new static shape
    delta = read_counters() - before
    assert delta.recompiles == 1
    assert delta.unique_graphs == 1


def test_warm_until_stable_covers_every_shape_class() -> None:
    f = torch.compile(smooth, backend="eager", dynamic=False)
    report = warm_until_stable(f, [(torch.randn(4),), (torch.randn(8),)])
    # Round 1 compiles both shapes, round 2 changes nothing.
    assert report.stable and report.rounds == 2
    assert report.counters.frames_total == 2 and report.counters.unique_graphs == 2
    assert report.first_call_s > 0 and report.compile_s >= 0
    with no_recompiles() as watch:
        f(torch.randn(4))
        f(torch.randn(8))
    assert not watch.delta().changed()


def test_no_recompiles_fails_on_a_new_shape() -> None:
    f = torch.compile(smooth, backend="eager", dynamic=False)
    warm_until_stable(f, [(torch.randn(4),)])
    with pytest.raises(RecompileError, match="recompile"), no_recompiles():
        f(torch.randn(16))


def test_no_recompiles_counter_guard_without_stance() -> None:
    f = torch.compile(smooth, backend="eager", dynamic=False)
    warm_until_stable(f, [(torch.randn(4),)])
    with pytest.raises(RecompileError, match=r"frames_total \+1"), no_recompiles(stance=False):
        f(torch.randn(16))


def test_warm_until_stable_gives_up_after_max_rounds() -> None:
    calls = []
    report = warm_until_stable(lambda: calls.append(1), [()], max_rounds=1)
    assert report.rounds == 1 and calls == [1]
    with pytest.raises(ValueError, match="inputs"):
        warm_until_stable(smooth, [])


def test_counter_arithmetic() -> None:
    a = CompileCounters(frames_total=3, unique_graphs=2, break_reasons={"x": 2, "y": 1})
    b = CompileCounters(frames_total=1, unique_graphs=1, break_reasons={"x": 2})
    d = a - b
    assert d == CompileCounters(frames_total=2, unique_graphs=1, break_reasons={"y": 1})
    assert d.graph_breaks == 1 and d.recompiles == 2 and d.changed()
    assert not (a - a).changed()
