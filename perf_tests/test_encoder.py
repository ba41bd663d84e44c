"""Encoder training step: latency, throughput, operators, FLOPs, memory per phase, numerical health."""

from __future__ import annotations

import pytest

from fixtures.workloads import TrainStep, build_encoder
from torchlevers import PrecisionPolicy
from torchlevers.workloads import EncoderWorkload

pytestmark = pytest.mark.budget("encoder-train")


def test_step_latency_and_throughput(perf, encoder_train: TrainStep) -> None:
    perf.step(encoder_train.step, samples_per_step=encoder_train.samples_per_step)


def test_operators(perf, encoder_train: TrainStep) -> None:
    perf.operators(encoder_train.step)
    perf.flops(encoder_train.step)


def test_peak_memory_per_phase(perf, device: str) -> None:
    # The configuration that is timed (fp32-statistics LayerNorm, per-layer clipping, the
    # GPU's precision policy), on a fresh instance so the steps measured are its first ones.
    w = build_encoder(device)
    batch = w.make_batch()
    if w.precision is None:
        perf.memory(lambda: w.forward_loss(batch), backward=w.backward, optimizer=w.optimizer_step)
    else:  # the policy owns backward and the optimizer step together: one phase
        perf.memory(lambda: w.forward_loss(batch), backward=w.backward_and_step, optimizer=None,
                    names={"backward": "backward_and_optimizer"})


def test_numerical_health(perf, device: str) -> None:
    # The encoder under the layered policy: no non-finite gradient in 20 steps, and its
    # losses track an fp32 run of the same weights and data.
    policy = PrecisionPolicy(dtype="bf16")
    ref = build_encoder(device)
    mixed = EncoderWorkload(ref.config, precision=policy.apply)
    batch = ref.make_batch()
    perf.grads(lambda: mixed.step(batch), mixed.model, steps=20)
    mixed2 = EncoderWorkload(ref.config, precision=policy.apply)
    fp32 = EncoderWorkload(ref.config)
    perf.loss_drift(lambda: mixed2.step(batch), lambda: fp32.step(batch), steps=20)
