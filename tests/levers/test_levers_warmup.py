"""Warm-up until steady, the compile lifecycle (warm, compile_s, fail_on_recompile) and the allocator-config helper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from torchlevers.bucketing import (
    BucketBatchSampler,
    BucketCollator,
    Buckets,
    shape_class_batches,
)
from torchlevers.warmup import (
    CompileConfig,
    CompiledStep,
    CudaAllocConf,
    compile_and_warm,
    set_cuda_alloc_conf,
)

EAGER = CompileConfig(backend="eager")  # exercises dynamo without inductor's C++ build


def _shapes() -> list[torch.Tensor]:
    return [torch.randn(2, 4), torch.randn(3, 4), torch.randn(5, 4)]


def _dynamo_frames() -> int:
    # The test reads dynamo's counter itself: the lever exposes no counter type on purpose.
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


def test_compile_warms_every_shape_class_then_refuses_to_recompile() -> None:
    def step(x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 1).sum(-1)

    before_warm = _dynamo_frames()
    compiled = compile_and_warm(step, _shapes(), EAGER)
    assert _dynamo_frames() > before_warm  # it compiled during the warm-up ...
    assert compiled.rounds == 2 and compiled.compile_s > 0  # ... and the minimum 2 passes sufficed
    torch.testing.assert_close(compiled(torch.ones(5, 4)), step(torch.ones(5, 4)))
    before = _dynamo_frames()
    with pytest.raises(torch._dynamo.exc.RecompileError, match="warm-up batches"):
        compiled(torch.ones(5, 4, dtype=torch.float64))  # a shape class never warmed
    assert _dynamo_frames() == before  # refused, not recompiled


def test_without_the_stance_an_unwarmed_input_recompiles_silently() -> None:
    """Why the wrapper exists: the plain compiled function pays a compile inside the measurement."""

    def step(x: torch.Tensor) -> torch.Tensor:
        return x.relu().sum()

    compiled = compile_and_warm(step, _shapes(), EAGER)
    before = _dynamo_frames()
    compiled.compiled(torch.ones(5, 4, dtype=torch.float64))
    assert _dynamo_frames() > before


def test_static_shapes_beyond_the_recompile_limit_are_refused() -> None:
    limit = int(torch._dynamo.config.recompile_limit)
    shapes = [torch.randn(n, 2) for n in range(1, limit + 2)]
    with pytest.raises(ValueError, match="recompile_limit"):
        compile_and_warm(lambda x: x + 1, shapes, CompileConfig(backend="eager", dynamic=False))


def test_a_step_that_keeps_compiling_is_refused() -> None:
    """Each pass meets a new static shape: dynamo never settles within max_rounds."""

    def step(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compiled = CompiledStep(step, CompileConfig(backend="eager", dynamic=False, max_rounds=3))
    with pytest.raises(torch._dynamo.exc.RecompileError, match="still recompiling after 3 warm-up passes"):
        compiled.warm(_NewShapeEachPass())


class _NewShapeEachPass(Sequence[torch.Tensor]):
    """One shape class that is a new shape every time it is read (once per pass)."""

    def __init__(self) -> None:
        self.n = 0

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: Any) -> Any:
        if i != 0:
            raise IndexError(i)
        self.n += 1
        return torch.ones(self.n)


def test_no_shape_classes_is_refused() -> None:
    with pytest.raises(ValueError, match="shape_classes is empty"):
        compile_and_warm(lambda x: x, [], EAGER)


def test_not_warmed_compiled_step_refuses_calls() -> None:
    step = CompiledStep(lambda x: x, EAGER)
    with pytest.raises(RuntimeError, match="not warmed up"):
        step(torch.ones(1))
    with pytest.raises(RuntimeError, match="not warmed up"):
        _ = step.compile_s


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mode": "fast"}, "'fast'"),
        ({"backend": ""}, "backend"),
        ({"min_rounds": 0}, "min_rounds"),
        ({"min_rounds": 3, "max_rounds": 2}, "max_rounds"),
    ],
)
def test_compile_config_names_bad_values(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        CompileConfig(**kwargs)


# --------------------------------------------------------------------------- allocator


def test_alloc_conf_string_round_trips() -> None:
    conf = CudaAllocConf(expandable_segments=True, max_split_size_mb=128, garbage_collection_threshold=0.8)
    text = conf.to_env()
    assert text == "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.8"
    assert CudaAllocConf.parse(text) == conf
    assert CudaAllocConf().to_env() == ""


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("expandable_segment:True", "expandable_segment: unknown option"),
        ("expandable_segments:yes", "expected True or False, got 'yes'"),
        ("max_split_size_mb:16", "> 20"),
        ("max_split_size_mb:big", "not a number: 'big'"),
        ("garbage_collection_threshold:1.5", "1.5"),
        ("roundup_power2_divisions:3", "power of two"),
        ("backend:cudaMallocAsync,max_split_size_mb:64", "ignores max_split_size_mb"),
        ("expandable_segments", "expected key:value"),
        ("expandable_segments:True,expandable_segments:False", "given twice"),
    ],
)
def test_bad_alloc_conf_names_key_and_value(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match="PYTORCH_CUDA_ALLOC_CONF") as info:
        CudaAllocConf.parse(text)
    assert needle in str(info.value)


def test_set_alloc_conf_writes_before_cuda_starts() -> None:
    env: dict[str, str] = {}
    text = set_cuda_alloc_conf("expandable_segments:True", environ=env, cuda_initialized=lambda: False)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} and text == env["PYTORCH_CUDA_ALLOC_CONF"]
    # Same value again is fine; a different one needs override.
    set_cuda_alloc_conf(CudaAllocConf(expandable_segments=True), environ=env, cuda_initialized=lambda: False)
    with pytest.raises(ValueError, match="override=True"):
        set_cuda_alloc_conf("max_split_size_mb:128", environ=env, cuda_initialized=lambda: False)
    set_cuda_alloc_conf("max_split_size_mb:128", environ=env, override=True, cuda_initialized=lambda: False)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def test_set_alloc_conf_refuses_after_cuda_init() -> None:
    with pytest.raises(RuntimeError, match="before CUDA is initialised"):
        set_cuda_alloc_conf("expandable_segments:True", environ={}, cuda_initialized=lambda: True)


def test_set_alloc_conf_refuses_a_conflicting_generic_variable() -> None:
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}
    with pytest.raises(ValueError, match="takes precedence"):
        set_cuda_alloc_conf("expandable_segments:True", environ=env, cuda_initialized=lambda: False)


def test_bucket_shape_classes_warm_a_compiled_model_for_a_whole_epoch() -> None:
    """Bucketing + compile: warm one batch per bucket, then a full epoch runs without recompiling."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 2))
    buckets = Buckets(boundaries=(4, 8, 16))
    lengths = np.random.default_rng(0).integers(1, 17, size=120)
    sequences = [[1] * int(n) for n in lengths]
    step = compile_and_warm(lambda b: model(b["input_ids"]).sum(), shape_class_batches(buckets, batch_size=8), EAGER)
    sampler = BucketBatchSampler(lengths, buckets, batch_size=8, seed=0, drop_last=True)
    collate = BucketCollator(buckets)
    before = _dynamo_frames()
    for batch in sampler:
        step(collate([sequences[i] for i in batch]))
    assert _dynamo_frames() == before
