"""Segmentation training step (channels_last, grouped convolutions): latency, operators, memory."""

from __future__ import annotations

import pytest

from fixtures.measuring import record_operators, time_step
from fixtures.workloads import SIZES, TrainStep
from perfbudget.measure import memory
from perfbudget.measure.operators import count_flops
from torchlevers.workloads import SegConfig, SegWorkload

pytestmark = pytest.mark.budget("segmentation-train")


def test_step_latency_and_throughput(perf, segmentation_train: TrainStep) -> None:
    s = segmentation_train
    time_step(perf, s.step, device=s.device, samples_per_step=s.samples_per_step)


def test_operators(perf, segmentation_train: TrainStep) -> None:
    s = segmentation_train
    record_operators(perf, s.step, device=s.device)
    perf.record("flops", count_flops(s.step).total_flops)


def test_peak_memory_per_phase(perf, device: str) -> None:
    w = SegWorkload(SegConfig.for_size(SIZES[device], device=device))
    batch = w.make_batch()
    peaks = memory.peak_by_phase(
        lambda: w.forward_loss(batch), backward=w.backward, optimizer=w.optimizer_step, device=device  # type: ignore[arg-type]
    )
    for phase, mib in peaks.by_phase().items():
        perf.record(f"peak_allocated_mib[{phase}]", mib)
