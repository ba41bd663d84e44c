"""Every workload and lever runs one full step with model and data on the ``meta`` device.

No GPU is needed to find the defects a GPU finds first: a tensor built on the host meeting
one on the device raises on ``meta`` exactly as on CUDA ("Tensor on device cpu is not on
the expected device meta!"), and reading a value back to the host shows up as a
device-to-host read. The GPU suite's configurations are dry-run here, at their GPU sizes
where building them is cheap; what ``meta`` cannot do is said where it is skipped.

``meta`` tensors carry no data, so a device-to-host read (``.item()``, ``.tolist()``,
``float(t)``, ``.cpu()``) is answered by :class:`HostReads` with zeros and counted: the
code around the read still runs, and the count pins down how often a step synchronises a
GPU (each read is a synchronisation there).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fixtures.workloads import COMPILE_SHAPES
from perfbudget.measure import compile_health
from torchlevers import (
    BucketCollator,
    BucketFitConfig,
    CompileConfig,
    FP32StatsLayerNorm,
    IdSpace,
    PerLayerClipConfig,
    PerLayerClipper,
    PrecisionPolicy,
    check_ids,
    clip_global_norm,
    compile_and_warm,
    fit_buckets,
    fp32_stats_layer_norm,
    normalize_ids,
    select_backend,
)
from torchlevers.workloads import (
    DecoderConfig,
    DecoderWorkload,
    EncoderConfig,
    EncoderWorkload,
    SegConfig,
    SegWorkload,
)

META = torch.device("meta")
aten = torch.ops.aten

# The GPU suite's precision policy resolves its autocast device from the model ("auto" ->
# "cuda" on a GPU). Autocast does not exist for "meta", so the dry run names the CUDA device
# type outright: torch turns CUDA autocast off without CUDA (with a warning, silenced here),
# so the policy's own code (fp32 overrides, loss upcast, non-finite check, skip) runs on
# meta tensors with no casts. The casts themselves are tested on CPU autocast
# (tests/levers/test_levers_precision.py).
GPU_POLICY = functools.partial(PrecisionPolicy, device_type="cuda")
pytestmark = pytest.mark.filterwarnings("ignore:.*CUDA is not available.*:UserWarning")


def _target_device(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    if "device" in kwargs and kwargs["device"] is not None:
        return torch.device(kwargs["device"])
    for a in args[1:]:
        if isinstance(a, torch.device | str):
            try:
                return torch.device(a)
            except RuntimeError:
                return None
    return None


class HostReads(TorchDispatchMode):
    """Answers device-to-host reads of ``meta`` tensors with zeros, and counts them.

    Everything else dispatches unchanged, so mixing devices still raises.
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if src is not None and src.device == META:
            if func is aten._local_scalar_dense.default:
                self.count += 1
                return False if src.dtype == torch.bool else 0.0 if src.is_floating_point() else 0
            # Under inference_mode ``.tolist()``/``.cpu()`` reach the mode as ``aten.to``, not
            # its decomposition ``aten._to_copy``.
            if func.overloadpacket in (aten._to_copy, aten.to):
                target = _target_device(func, args, kwargs)
                if target is not None and target.type == "cpu":
                    self.count += 1
                    return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype)
        return func(*args, **kwargs)


@pytest.fixture
def host_reads() -> Iterator[HostReads]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
        with HostReads() as reads:
            yield reads


def reads_per_step(reads: HostReads, step: Callable[[], object], steps: int) -> list[int]:
    """Run ``step`` ``steps`` times; the host reads each call made."""
    out = []
    for _ in range(steps):
        before = reads.count
        step()
        out.append(reads.count - before)
    return out


def assert_on_meta(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    for name, p in module.named_parameters():
        assert p.device == META, f"parameter {name} left the device: {p.device}"
    for state in (optimizer.state.values() if optimizer is not None else ()):
        for key, value in state.items():
            # AdamW keeps its step counter on the host unless capturable/fused: a 0-dim CPU
            # tensor, which device kernels accept as a scalar.
            if isinstance(value, torch.Tensor) and not (key == "step" and value.dim() == 0):
                assert value.device == META, f"optimizer state {key} is on {value.device}"


# -- the reference workloads, as the GPU suite builds them (fixtures/workloads.py) -------------


def test_encoder_training_step_as_the_gpu_suite_times_it(host_reads: HostReads) -> None:
    # GPU size ("large": BERT-base geometry), fp32-statistics LayerNorm, per-layer clipping,
    # the bf16 policy: the encoder step, operator, memory, energy and compile tests' workload.
    cfg = EncoderConfig.for_size("large", device="meta")
    w = EncoderWorkload(cfg, norm_factory=FP32StatsLayerNorm, precision=GPU_POLICY(dtype="bf16").apply,
                        clip=PerLayerClipper(PerLayerClipConfig()).clip)
    batch = w.make_batch()
    # Past the clipper's warm-up, so its clipping branch runs too.
    reads = reads_per_step(host_reads, lambda: w.step(batch), PerLayerClipConfig().warmup_steps + 2)
    # One read by the policy (loss and non-finite count together), one by the clipper.
    assert reads == [2] * len(reads)
    assert w.last_clip_report is not None and w.last_step_report is not None
    assert_on_meta(w.model, w.optimizer)


@pytest.mark.parametrize(
    "clip",
    [
        pytest.param(lambda: PerLayerClipper(PerLayerClipConfig(warmup_steps=1)).clip, id="per-layer-running"),
        pytest.param(lambda: PerLayerClipper(PerLayerClipConfig(mode="per_step")).clip, id="per-layer-step"),
        pytest.param(lambda: functools.partial(clip_global_norm, max_norm=1.0), id="global-norm"),
    ],
)
def test_encoder_phases_with_each_clipper(host_reads: HostReads, clip: Callable[[], Any]) -> None:
    # fp32, phase by phase, as the memory test drives it; each clipper reads the host once.
    w = EncoderWorkload(EncoderConfig.for_size("tiny", device="meta"), norm_factory=FP32StatsLayerNorm, clip=clip())
    batch = w.make_batch()

    def step() -> None:
        loss = w.forward_loss(batch)
        assert loss.device == META and loss.dtype == torch.float32
        w.backward(loss)
        w.optimizer_step()

    assert reads_per_step(host_reads, step, 3) == [1, 1, 1]
    assert_on_meta(w.model, w.optimizer)


def test_encoder_fp16_policy_with_loss_scaler(host_reads: HostReads) -> None:
    # torch disables a CUDA GradScaler without CUDA, so scaling, unscaling, the scaler's skip
    # and its loss-scale read (one more on a GPU, plus the scaler's own in its step) are not
    # exercised here; the policy's code around them is, with its one read (loss and flags).
    w = EncoderWorkload(EncoderConfig.for_size("tiny", device="meta"), precision=GPU_POLICY(dtype="fp16").apply)
    assert w.precision is not None and w.precision.scaler is not None
    batch = w.make_batch()
    assert reads_per_step(host_reads, lambda: w.step(batch), 2) == [1, 1]
    assert_on_meta(w.model, w.optimizer)


def test_encoder_collated_bucketed_batch(host_reads: HostReads) -> None:
    # The bucketing lever's hot path: samples collated on the host (a DataLoader worker),
    # padded to their bucket, adopted and moved by the step. Real tokens are counted from the
    # collated lengths while they are still on the host: no device read.
    w = EncoderWorkload(EncoderConfig.for_size("tiny", device="meta"))
    lengths = [5, 9, 17, 30, 33, 47, 60, 64] * 4
    buckets = fit_buckets(lengths, BucketFitConfig(num_buckets=3)).buckets
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(2, 100, (n,), generator=g), "labels": i % 2}
               for i, n in enumerate(lengths[:8])]
    batch = BucketCollator(buckets)(samples)
    assert batch["input_ids"].shape[1] in buckets.boundaries
    assert reads_per_step(host_reads, lambda: w.step(batch), 2) == [0, 0]
    assert_on_meta(w.model, w.optimizer)


def test_compiled_encoder_as_the_gpu_suite_warms_it() -> None:
    # fixtures/workloads.py::encoder_compiled: fp32-statistics LayerNorm, bf16 policy,
    # per-layer clipping, the forward compiled with dynamic=True and warmed with every
    # sequence length it times. Here fullgraph=True (the suite does not ask for it) proves the
    # forward, LayerNorm and autocast-off included, holds no graph break; aot_eager stands in
    # for inductor, which has no code generation for meta. Dynamo runs frames under a dispatch
    # mode eagerly, so only the eager part of the step (backward, clip, optimizer: the host
    # reads) runs under HostReads. One tiny layer: tracing BERT-base's 12 identical layers
    # takes minutes here and finds nothing one layer does not.
    w = EncoderWorkload(EncoderConfig.for_size("tiny", device="meta", n_layers=1), norm_factory=FP32StatsLayerNorm,
                        precision=GPU_POLICY(dtype="bf16").apply, clip=PerLayerClipper(PerLayerClipConfig()).clip)
    batches = [w.make_batch(batch_size=w.config.batch_size, seq_len=n) for n in COMPILE_SHAPES]
    reads = HostReads()

    def step(batch: Any) -> None:
        loss = w.forward_loss(batch)
        with warnings.catch_warnings(), reads:
            warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
            w.backward_and_step(loss)

    compile_health.reset_compiler()
    try:
        w.compile(backend="aot_eager", dynamic=True, fullgraph=True)
        report = compile_health.warm_until_stable(step, [(b,) for b in batches])
        assert report.stable and report.rounds == 2  # one round compiles, the next changes nothing
        assert report.counters.graph_breaks == 0 and report.counters.unique_graphs == 1
        assert reads.count == 2 * 2 * len(COMPILE_SHAPES)  # policy and clipper, once a step each
        assert_on_meta(w.model, w.optimizer)
    finally:
        compile_health.reset_compiler()


def test_segmentation_training_step_as_the_gpu_suite_times_it(host_reads: HostReads) -> None:
    # channels_last, grouped convolutions, per-layer clipping (fixtures.segmentation_clip).
    w = SegWorkload(SegConfig.for_size("large", device="meta"), clip=PerLayerClipper(PerLayerClipConfig()).clip)
    batch = w.make_batch()
    assert batch.images.device == META
    assert reads_per_step(host_reads, lambda: w.step(batch), PerLayerClipConfig().warmup_steps + 1) == [1] * 6
    assert_on_meta(w.model, w.optimizer)


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_decoder_serving_path(host_reads: HostReads, precision: str | None) -> None:
    cfg = DecoderConfig.for_size("tiny", device="meta")
    w = DecoderWorkload(cfg, norm_factory=FP32StatsLayerNorm,
                        precision=GPU_POLICY(dtype=precision).apply if precision else None)
    request = w.requests()[0]
    before = host_reads.count
    timing = w.generate(request.prompt_ids)
    # Tokens stay on the device while generating: one read at the end, for the token ids.
    assert host_reads.count - before == 1
    assert len(timing.token_ids) == cfg.max_new_tokens
    before = host_reads.count
    tokens = list(w.stream(request.prompt_ids))
    assert host_reads.count == before, "streaming must not read tokens back while generating"
    assert len(tokens) == cfg.max_new_tokens and all(t.device == META for t in tokens)
    assert_on_meta(w.model)


# -- the levers' hot paths ---------------------------------------------------------------------


def test_layernorm_torch_path_keeps_fp32_statistics(host_reads: HostReads) -> None:
    # The Triton kernel needs a CUDA device (it is tested on CPU under TRITON_INTERPRET=1 in
    # tests/levers/test_levers_layernorm_triton.py); on any other device "auto" takes the
    # torch path, which is what runs here, forward and backward.
    assert select_backend(torch.empty(2, 256, device=META, dtype=torch.bfloat16), 256) == "torch"
    x = torch.empty(8, 64, 256, device=META, dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(256, device=META, requires_grad=True)
    b = torch.empty(256, device=META, requires_grad=True)
    y = fp32_stats_layer_norm(x, (256,), w, b, 1e-5, backend="auto")
    assert y.dtype == torch.bfloat16 and y.device == META
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16 and w.grad is not None and b.grad is not None
    assert host_reads.count == 0


def test_id_normalisation_on_the_device(host_reads: HostReads) -> None:
    ids = torch.empty(4, 32, dtype=torch.int64, device=META)
    for method in ("modulo", "hash"):
        out = normalize_ids(ids, IdSpace(vocab_size=1000, method=method))
        assert out.device == META and out.dtype == torch.int64
    assert host_reads.count == 0
    check_ids(ids, 1000)  # validation reads one flag back: documented, one sync
    assert host_reads.count == 1


def test_compile_warm_up() -> None:
    # Dynamo traces meta tensors like any other, but not under a Python dispatch mode (it
    # runs such frames eagerly), so this step has no host reads to answer: no clipper.
    # Inductor has no code generation for meta, so the lifecycle (warm every shape class until
    # the counters settle, then fail_on_recompile) runs with the aot_eager backend, which runs
    # the same graphs eagerly. As in the suite, the forward is compiled; backward and the
    # optimizer step run eagerly on its graph.
    w = EncoderWorkload(EncoderConfig.for_size("tiny", device="meta"))
    batches = [w.make_batch(seq_len=n) for n in (32, 64)]
    torch._dynamo.reset()
    try:
        forward = compile_and_warm(w.forward_loss, batches, CompileConfig(backend="aot_eager", dynamic=True))
        assert forward.rounds is not None and forward.compile_s > 0
        loss = forward(batches[1])
        assert loss.device == META and loss.requires_grad
        w.backward(loss)
        w.optimizer_step()
        assert_on_meta(w.model, w.optimizer)
    finally:
        torch._dynamo.reset()
