"""Tests of measure.compile_health on tiny functions (backend "eager": dynamo only, no codegen)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from perfbudget.measure.compile_health import (
    CompileCounters,
    RecompileError,
    explain_graph_breaks,
    inductor_dirs,
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
    assert report.cache == "warm"  # backend "eager": inductor compiled nothing
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
    a = CompileCounters(frames_total=3, unique_graphs=2, break_reasons={"x": 2, "y": 1}, fx_cache_misses=2)
    b = CompileCounters(frames_total=1, unique_graphs=1, break_reasons={"x": 2}, fx_cache_misses=2)
    d = a - b
    assert d == CompileCounters(frames_total=2, unique_graphs=1, break_reasons={"y": 1})
    assert d.graph_breaks == 1 and d.recompiles == 2 and d.changed()
    assert not (a - a).changed()


def test_cache_state_from_inductor_counters() -> None:
    """cold: a graph missed or bypassed the FX-graph cache; warm: every one was a hit."""
    from torch._dynamo.utils import counters

    before = read_counters()
    counters["inductor"]["fxgraph_cache_hit"] += 2
    hits = read_counters() - before
    assert (hits.fx_cache_hits, hits.cache) == (2, "warm") and hits.changed()
    counters["inductor"]["fxgraph_cache_miss"] += 1
    assert (read_counters() - before).cache == "cold"
    after_miss = read_counters()
    counters["inductor"]["fxgraph_cache_bypass"] += 1
    assert (read_counters() - after_miss).cache == "cold"
    assert CompileCounters().cache == "warm"


def test_warm_until_stable_reports_a_cold_cache() -> None:
    from torch._dynamo.utils import counters

    def compiles_cold(x: torch.Tensor) -> torch.Tensor:
        if not counters["inductor"]["fxgraph_cache_miss"]:  # the first call "compiles"
            counters["inductor"]["fxgraph_cache_miss"] += 1
        return x

    report = warm_until_stable(compiles_cold, [(torch.ones(1),)])
    assert report.cache == "cold" and report.counters.fx_cache_misses == 1 and report.rounds == 2


def test_inductor_dirs_keep_the_cache_and_headers_in_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", "/elsewhere")
    monkeypatch.setattr(tempfile, "tempdir", None)
    inductor_dirs(tmp_path / ".perfbudget")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / ".perfbudget" / "inductor")
    assert os.environ["TMPDIR"] == str(tmp_path / ".perfbudget" / "tmp")
    assert tempfile.gettempdir() == str(tmp_path / ".perfbudget" / "tmp")
    assert (tmp_path / ".perfbudget" / "inductor").is_dir()


def test_inductor_dirs_keep_what_the_user_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/mine")
    monkeypatch.setenv("TMPDIR", "/my-tmp")
    inductor_dirs(tmp_path, keep_tmpdir=True)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/mine" and os.environ["TMPDIR"] == "/my-tmp"
