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
    KVCache,
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
    # The cache holds what the attention computes in: no cast of the whole cache at each decode step.
    _, cache = w.prefill(w.requests(1)[0].prompt_ids)
    assert {t.dtype for t in (*cache.keys, *cache.values)} == {torch.bfloat16}
    assert DecoderWorkload(DecoderConfig()).prefill(w.requests(1)[0].prompt_ids)[1].keys[0].dtype == torch.float32

    def cache_casts(cache: KVCache) -> int:
        """Casts of a layer's cached keys or values (batch, heads, filled positions, head dim) in a decode step."""
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            w.decode_step(torch.tensor([1]), cache)
        k = cache.keys[0]
        filled = [k.shape[0], k.shape[1], cache.length, k.shape[3]]
        return sum(1 for e in prof.events() if e.name == "aten::_to_copy" and list(e.input_shapes[0]) == filled)

    assert cache_casts(cache) == 0
    with w.precision.autocast():  # type: ignore[union-attr]
        fp32 = w.model.new_cache(1, w.config.max_seq_len, dtype=torch.float32)
        w._forward(w.requests(1)[0].prompt_ids[None], fp32, last_only=True)
    assert cache_casts(fp32) == 2 * w.config.n_layers  # the control: such a cache is cast, keys and values
