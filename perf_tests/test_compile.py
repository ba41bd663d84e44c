"""torch.compile health of the encoder: graph breaks, graphs, recompiles, compile time, compiled step."""

from __future__ import annotations

import pytest

from fixtures.measuring import time_step
from fixtures.workloads import CompiledStep
from perfbudget.measure import compile_health

pytestmark = pytest.mark.budget("encoder-compiled")


def test_compile_health(perf, encoder_compiled: CompiledStep) -> None:
    c = encoder_compiled
    assert c.warmup is not None
    grown = c.warmup.counters
    perf.record("graph_breaks", grown.graph_breaks,
                attribution=[f"{n} x {why}" for why, n in grown.break_reasons.items()])
    perf.record("unique_graphs", grown.unique_graphs)
    # One sample per run: cold and warm inductor caches are budgeted apart.
    perf.record(f"compile_s[{c.cache}]", c.warmup.compile_s)


def test_compiled_step_without_recompiles(perf, encoder_compiled: CompiledStep) -> None:
    c = encoder_compiled
    before = compile_health.read_counters()
    # Every shape class was warmed: any recompile while measuring raises RecompileError.
    with compile_health.no_recompiles():
        time_step(perf, c.step, device=c.device, samples_per_step=c.samples_per_step)
        for batch in c.batches.values():
            c.workload.step(batch)
    perf.record("recompiles", (compile_health.read_counters() - before).recompiles)
