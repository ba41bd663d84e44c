"""The levers plug into the workloads' injection points without adapters."""

from __future__ import annotations

import functools

import torch

from torchlevers import (
    BucketCollator,
    FP32StatsLayerNorm,
    PerLayerClipper,
    PrecisionPolicy,
    clip_global_norm,
)
from torchlevers.workloads import (
    DecoderConfig,
    DecoderWorkload,
    EncoderConfig,
    EncoderWorkload,
    TokenDataset,
    query_lengths,
)


def test_encoder_with_bf16_policy_per_layer_clipping_and_fp32_stats_layernorm() -> None:
    w = EncoderWorkload(
        EncoderConfig(),
        precision=PrecisionPolicy(dtype="bf16").apply,
        clip=PerLayerClipper().clip,
        norm_factory=FP32StatsLayerNorm,
    )
    assert all(
        isinstance(m, FP32StatsLayerNorm)
        for m in w.model.modules()
        if isinstance(m, torch.nn.LayerNorm)
    )
    batch = w.make_batch(query_lengths(8, seed=1))
    losses = [float(w.step(batch)) for _ in range(4)]
    assert losses[-1] < losses[0]
    report = w.last_step_report
    assert getattr(report, "nonfinite_grads", None) == 0
    assert w.last_clip_report is not None


def test_encoder_steps_on_a_bucket_collated_batch() -> None:
    ds = TokenDataset(query_lengths(8, seed=2), vocab_size=2048, seed=0)
    collated = BucketCollator()([ds[i] for i in range(len(ds))])
    w = EncoderWorkload(EncoderConfig(), clip=functools.partial(clip_global_norm, max_norm=1.0))
    assert torch.isfinite(w.step(collated))


def test_decoder_serves_under_a_bf16_policy() -> None:
    w = DecoderWorkload(DecoderConfig(), precision=PrecisionPolicy(dtype="bf16").apply)
    timing = w.generate(w.requests(1)[0].prompt_ids, 3)
    assert timing.new_tokens == 3
