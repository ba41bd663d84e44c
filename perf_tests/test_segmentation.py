"""Segmentation training step (channels_last, grouped convolutions): latency, operators, memory."""

from __future__ import annotations

import pytest

from fixtures.workloads import SIZES, TrainStep, segmentation_clip
from torchlevers.workloads import SegConfig, SegWorkload

pytestmark = pytest.mark.budget("segmentation-train")


def test_step_latency_and_throughput(perf, segmentation_train: TrainStep) -> None:
    perf.step(segmentation_train.step, samples_per_step=segmentation_train.samples_per_step)


def test_operators(perf, segmentation_train: TrainStep) -> None:
    perf.operators(segmentation_train.step)
    perf.flops(segmentation_train.step)


def test_peak_memory_per_phase(perf, device: str) -> None:
    # The timed configuration (per-layer clipping), on a fresh instance.
    w = SegWorkload(SegConfig.for_size(SIZES[device], device=device), clip=segmentation_clip())
    batch = w.make_batch()
    perf.memory(lambda: w.forward_loss(batch), backward=w.backward, optimizer=w.optimizer_step)
