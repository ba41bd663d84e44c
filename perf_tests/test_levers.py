"""Each lever's effect as a ratio measured in one run: bucketing, precision, clipping, LayerNorm."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fixtures.data import LengthSample
from fixtures.plant import plant
from fixtures.workloads import build_encoder
from perfbudget.measure.memory import PhasePeaks, peak_by_phase
from torchlevers import (
    MixedPrecision,
    PerLayerClipper,
    PrecisionPolicy,
    clip_global_norm,
    fp32_stats_layer_norm,
    plan_bucketed,
    plan_static,
)
from torchlevers.workloads.planted import OverflowProne, TwoScale, overflow_batches, two_scale_batch

SPEEDUP_SAMPLES = 24  # three static batches of 8 at 512 tokens: ~0.7 s per round on one core
SPEEDUP_ROUNDS = 6


@pytest.mark.budget("lever-bucketing")
def test_bucketing_speedup(perf, device: str, length_sample: LengthSample) -> None:
    """Encoder samples/s with length buckets vs static max-length padding, same samples, interleaved."""
    w = build_encoder(device)
    lengths = length_sample.lengths[:SPEEDUP_SAMPLES]
    static = plan_static(lengths, batch_size=8, max_len=length_sample.max_len)
    bucketed = static if plant().no_bucketing else plan_bucketed(lengths, length_sample.buckets, batch_size=8)
    batches = {
        name: [w.make_batch(list(real), seq_len=width) for real, width in zip(plan.real_lens, plan.padded_lens, strict=True)]
        for name, plan in (("static", static), ("bucketed", bucketed))
    }

    def epoch(name: str):
        def run() -> None:
            for b in batches[name]:
                w.step(b)
        return run

    # Interleaved rounds (static, bucketed, static, ...): the machine's drift hits both.
    perf.speedup("bucketing", epoch("static"), epoch("bucketed"), rounds=SPEEDUP_ROUNDS,
                 attribution=[f"static widths {sorted(set(static.padded_lens))}, "
                              f"bucketed widths {sorted(set(bucketed.padded_lens))}"])


@pytest.mark.cpu
@pytest.mark.budget("lever-precision")
def test_precision_policy_on_overflow_prone_model(perf) -> None:
    """Layered fp16 (embeddings + loss in fp32) vs whole-model fp16 autocast on large embedding outputs."""
    steps = 50
    data = overflow_batches(steps)

    def train(policy: PrecisionPolicy) -> list:
        m = OverflowProne()
        mp = policy.apply(m)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        return [mp.step(lambda x=x: m(x), lambda out, y=y: F.cross_entropy(out, y), opt) for x, y in data]

    layered = train(PrecisionPolicy(dtype="fp16"))
    whole = train(PrecisionPolicy(dtype="fp16", fp32_modules=(), loss_in_fp32=False))
    fp32 = train(PrecisionPolicy(dtype="fp32"))
    # Non-finite gradients that reached the optimizer (a scaler skip is the guard working).
    applied = sum(r.nonfinite_grads for r in layered if not r.skipped)
    bad_whole = sum(1 for r in whole if r.nonfinite_grads or not r.loss_finite)
    # The ratio below means something only while the negative control still overflows.
    assert bad_whole > 0, "whole-model fp16 no longer overflows on this model: the control shows nothing to compare with"
    perf.record("nonfinite_grads", applied)
    perf.record("scaler_skipped_steps", sum(r.skipped for r in layered))
    perf.record("ratio[nonfinite_steps_layered_vs_whole_fp16]",
                sum(1 for r in layered if r.nonfinite_grads and not r.skipped) / max(1, bad_whole),
                attribution=[f"whole-model fp16: {bad_whole}/{steps} steps non-finite"])
    mean = lambda rs: float(np.mean([r.loss for r in rs]))  # noqa: E731
    perf.record("loss_drift", abs(mean(layered) - mean(fp32)) / mean(fp32))


@pytest.mark.budget("lever-precision-memory")
def test_precision_memory_saving(perf, device: str) -> None:
    """Peak memory of the encoder's first training step under the layered bf16 policy vs fp32."""

    def first_step(dtype: str) -> PhasePeaks:
        w = build_encoder(device)  # fresh: the step measured allocates the optimizer state
        if isinstance(w.precision, MixedPrecision):  # the GPU's own bf16 policy, replaced below
            w.precision.remove()
        # Both sides through the policy (fp32: autocast off), so only the dtype differs.
        w.precision = PrecisionPolicy(dtype=dtype).apply(w.model)
        batch = w.make_batch()
        return peak_by_phase(lambda: w.forward_loss(batch), backward=w.backward_and_step,
                             device=device, warmup=0)

    peaks: dict[str, PhasePeaks] = {}
    for dtype in ("bf16", "fp32") * 2:  # the first round takes process-wide lazy allocations (cuBLAS workspace)
        peaks[dtype] = first_step(dtype)
    bf16, fp32 = peaks["bf16"], peaks["fp32"]
    seen = [f"{d}: forward {p.forward_mib:.2f} MiB, backward+optimizer {p.backward_mib:.2f} MiB "
            "(counted from the step's start: weights left out)" for d, p in peaks.items()]
    perf.record("ratio[peak_memory_bf16_vs_fp32]", bf16.peak_mib / fp32.peak_mib, attribution=seen)
    # The activations autocast keeps in bf16: what the step's peak shows once they outweigh
    # the gradients and optimizer state allocated at the step.
    perf.record("ratio[forward_peak_memory_bf16_vs_fp32]", bf16.forward_mib / fp32.forward_mib, attribution=seen)


@pytest.mark.cpu
@pytest.mark.budget("lever-clipping")
def test_per_layer_clipping_spares_small_layers(perf) -> None:
    """On a gradient spike in one layer: how much the small-gradient layer is shrunk, per-layer vs global."""

    def shrink(clip) -> float:
        model = TwoScale()
        g = torch.Generator().manual_seed(1)

        def grads(spike: float = 1.0) -> None:
            model.zero_grad(set_to_none=True)
            x, ys, yl = two_scale_batch(g, spike)
            a, b = model(x)
            (F.mse_loss(a, ys) + F.mse_loss(b, yl)).backward()

        for _ in range(10):  # ordinary steps: running statistics settle
            grads()
            clip(model.named_parameters())
        grads(spike=100.0)
        before = model.small.weight.grad.norm().item()
        clip(model.named_parameters())
        return 1.0 - model.small.weight.grad.norm().item() / before

    per_layer = shrink(PerLayerClipper().clip)
    global_ = shrink(lambda p: clip_global_norm(p, max_norm=1.0))
    # The negative control: one global factor shrinks the small layer too (else the spike is too small to tell).
    assert global_ > 0.5, f"global-norm clipping shrank the small layer by only {global_:.1%}: the spike tells nothing"
    perf.record("ratio[small_layer_shrink]", per_layer,
                attribution=[f"global-norm clipping shrinks it by {global_:.1%}"])


@pytest.mark.cpu
@pytest.mark.budget("lever-layernorm")
def test_fp32_statistics_layernorm(perf) -> None:
    """Error of the fp32-statistics LayerNorm against references; fp16 with large activations."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 768, generator=g)
    w, b = torch.randn(768, generator=g), torch.randn(768, generator=g)
    ours = fp32_stats_layer_norm(x, 768, w, b)
    perf.record("max_abs_error[fp32]", (ours - F.layer_norm(x, (768,), w, b)).abs().max().item())

    big = (2000 + 300 * torch.randn(64, 768, generator=g)).half()
    ref = F.layer_norm(big.double(), (768,), w.double(), b.double())
    ours16 = fp32_stats_layer_norm(big, 768, w.half(), b.half())
    err = (ours16.double() - ref).abs().max().item()
    # Naive fp16 statistics: the variance's squares overflow fp16 (max 65504).
    mean = big.mean(-1, keepdim=True)
    var = ((big - mean) * (big - mean)).mean(-1, keepdim=True)
    naive = ((big - mean) / torch.sqrt(var + 1e-5)) * w.half() + b.half()
    naive_err = (naive.double() - ref).abs().max().item()
    perf.record("max_abs_error[fp16_large]", err)
    overflowed = int((~torch.isfinite(var)).sum())
    # err / inf is 0 (the naive statistics lost every row); a naive error of 0 makes any error of ours infinitely worse.
    ratio = err / naive_err if naive_err else (math.inf if err else 1.0)
    perf.record("ratio[fp16_error_vs_naive_stats]", ratio,
                attribution=[f"naive fp16 statistics: max error {naive_err:.3g}, variance overflowed in {overflowed} "
                             f"of {var.numel()} rows"])
