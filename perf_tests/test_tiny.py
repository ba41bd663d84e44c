"""The smallest end-to-end budget loop: a tiny MLP step's time (or instructions), FLOPs and operator counts."""

from __future__ import annotations

import pytest

from fixtures.tiny import TinyStep


@pytest.mark.cpu
@pytest.mark.budget("tiny-mlp-train")
@pytest.mark.instructions(steps=2)
def test_tiny_mlp_step_time(perf, tiny_mlp: TinyStep) -> None:
    # Timed; counted instead under `perfbudget instructions -- perf_tests -m instructions`.
    perf.step(tiny_mlp.step, samples_per_step=tiny_mlp.batch_size, warmup_ms=100, min_samples=30, max_ms=800)


@pytest.mark.cpu
@pytest.mark.budget("tiny-mlp-train")
def test_tiny_mlp_flops_and_ops(perf, tiny_mlp: TinyStep) -> None:
    perf.flops(tiny_mlp.step)
    perf.operators(tiny_mlp.step, rounds=2, families=["op_count"])
