"""Encoder training step: latency, throughput, operators, FLOPs, memory per phase, numerical health."""

from __future__ import annotations

import pytest

from fixtures.measuring import record_operators, time_step
from fixtures.workloads import SIZES, TrainStep, _encoder
from perfbudget.measure import memory, numerics
from perfbudget.measure.operators import count_flops
from torchlevers import PrecisionPolicy
from torchlevers.workloads import EncoderConfig, EncoderWorkload

pytestmark = pytest.mark.budget("encoder-train")


def test_step_latency_and_throughput(perf, encoder_train: TrainStep) -> None:
    e = encoder_train
    time_step(perf, e.step, device=e.device, samples_per_step=e.samples_per_step)


def test_operators(perf, encoder_train: TrainStep) -> None:
    e = encoder_train
    record_operators(perf, e.step, device=e.device)
    perf.record("flops", count_flops(e.step).total_flops)


def test_peak_memory_per_phase(perf, device: str) -> None:
    # fp32 and no policy: the phases can run apart (a loss scaler would own backward + step).
    w = EncoderWorkload(EncoderConfig.for_size(SIZES[device], device=device))
    batch = w.make_batch()
    peaks = memory.peak_by_phase(
        lambda: w.forward_loss(batch), backward=w.backward, optimizer=w.optimizer_step, device=device  # type: ignore[arg-type]
    )
    for phase, mib in peaks.by_phase().items():
        perf.record(f"peak_allocated_mib[{phase}]", mib)


def test_numerical_health(perf, device: str) -> None:
    # The encoder under the layered policy: no non-finite gradient in 20 steps, and its
    # losses track an fp32 run of the same weights and data.
    steps = 20
    policy = PrecisionPolicy(dtype="bf16")
    ref = _encoder(device)
    mixed = EncoderWorkload(ref.config, precision=policy.apply)
    batch = ref.make_batch()
    grads = numerics.check_grads(lambda: mixed.step(batch), mixed.model, steps=steps, stop_at_first=False)
    perf.record("nonfinite_grads", grads.nonfinite_grads, attribution=grads.lines())
    mixed2 = EncoderWorkload(ref.config, precision=policy.apply)
    fp32 = EncoderWorkload(ref.config)
    drift = numerics.compare_to_reference(lambda: mixed2.step(batch), lambda: fp32.step(batch), steps=steps)
    perf.record("loss_drift", drift.max_rel)
