"""torch.compile health of the encoder: graph breaks, graphs, recompiles, compile time, compiled step."""

from __future__ import annotations

import pytest

from fixtures.workloads import CompiledStep

pytestmark = [pytest.mark.budget("encoder-compiled"), pytest.mark.compiles]


def test_compile_health(perf, encoder_compiled: CompiledStep) -> None:
    assert encoder_compiled.warmup is not None, "the compiled fixture always warms up"
    perf.compile_health(encoder_compiled.warmup)


def test_compiled_step_without_recompiles(perf, encoder_compiled: CompiledStep) -> None:
    c = encoder_compiled
    # Every shape class was warmed: a recompile while measuring is recorded and fails.
    with perf.no_recompiles():
        perf.step(c.step, samples_per_step=c.samples_per_step)
        for batch in c.batches.values():
            c.workload.step(batch)
