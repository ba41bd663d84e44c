"""The smallest end-to-end budget loop: a tiny MLP step's time, FLOPs and operator counts."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fixtures.measuring import machine_reference
from fixtures.tiny import TinyStep


@pytest.mark.cpu
@pytest.mark.budget("tiny-mlp-train")
def test_tiny_mlp_step_time(perf, tiny_mlp: TinyStep) -> None:
    # Paired with the machine-speed reference so host drift cancels out.
    perf.time("step_ms", tiny_mlp.step, reference=machine_reference("cpu"), warmup_ms=100, min_samples=30, max_ms=800)


@pytest.mark.cpu
@pytest.mark.budget("tiny-mlp-train")
def test_tiny_mlp_flops_and_ops(perf, tiny_mlp: TinyStep) -> None:
    with FlopCounterMode(display=False) as counter:
        tiny_mlp.step()
    perf.record("flops", counter.get_total_flops())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tiny_mlp.step()
    calls = {e.key: e.count for e in prof.key_averages()}
    perf.record("op_count[aten::addmm]", calls.get("aten::addmm", 0))
    perf.record("op_count[aten::mm]", calls.get("aten::mm", 0))
