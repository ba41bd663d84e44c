"""Warm-up until steady, the compile lifecycle (warm, compile_s, fail_on_recompile) and the allocator-config helper."""

from __future__ import annotations

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
    DynamoCounters,
    RecompileError,
    WarmupConfig,
    compile_and_warm,
    set_cuda_alloc_conf,
    warm_up,
)

EAGER = CompileConfig(backend="eager")  # exercises dynamo without inductor's C++ build


def _shapes() -> list[torch.Tensor]:
    return [torch.randn(2, 4), torch.randn(3, 4), torch.randn(5, 4)]


def test_eager_step_is_steady_after_the_minimum_rounds() -> None:
    calls: list[tuple[int, ...]] = []
    report = warm_up(lambda b: calls.append(tuple(b.shape)), _shapes(), WarmupConfig(min_rounds=2))
    assert report.steady and report.rounds == 2 and report.steps == 6
    assert calls == [(2, 4), (3, 4), (5, 4)] * 2
    assert report.compile_s == 0.0 and report.counters == DynamoCounters()


def test_compile_warms_every_shape_class_then_refuses_to_recompile() -> None:
    def step(x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 1).sum(-1)

    compiled = compile_and_warm(step, _shapes(), EAGER)
    report = compiled.report
    assert report is not None and report.steady
    assert report.changed[0] and not report.changed[-1]  # compiled in pass 1, quiet after
    assert report.counters.frames_total >= 1 and report.counters.unique_graphs >= 1
    assert compiled.compile_s > 0
    torch.testing.assert_close(compiled(torch.ones(5, 4)), step(torch.ones(5, 4)))
    before = DynamoCounters.read()
    with pytest.raises(RecompileError, match="warm-up batches"):
        compiled(torch.ones(5, 4, dtype=torch.float64))  # a shape class never warmed
    assert DynamoCounters.read() == before  # refused, not recompiled


def test_without_the_stance_an_unwarmed_input_recompiles_silently() -> None:
    """Why the wrapper exists: the plain compiled function pays a compile inside the measurement."""

    def step(x: torch.Tensor) -> torch.Tensor:
        return x.relu().sum()

    compiled = compile_and_warm(step, _shapes(), EAGER)
    before = DynamoCounters.read()
    compiled.compiled(torch.ones(5, 4, dtype=torch.float64))
    assert DynamoCounters.read().changed_since(before)


def test_static_shapes_beyond_the_recompile_limit_are_refused() -> None:
    limit = int(torch._dynamo.config.recompile_limit)
    shapes = [torch.randn(n, 2) for n in range(1, limit + 2)]
    with pytest.raises(ValueError, match="recompile_limit"):
        compile_and_warm(lambda x: x + 1, shapes, CompileConfig(backend="eager", dynamic=False))


def test_unsteady_warmup_is_reported() -> None:
    """A step that keeps compiling never counts as steady (counters faked, not the global ones)."""
    frames = {"total": 0}

    def step(batch: Any) -> None:
        frames["total"] += 1

    def read() -> DynamoCounters:
        return DynamoCounters(frames_total=frames["total"])

    report = warm_up(step, [0, 1], WarmupConfig(max_rounds=3), read_counters=read)
    assert not report.steady and report.rounds == 3 and all(report.changed)
    assert report.counters.frames_total == 6 and report.steps == 6


def test_steady_needs_quiet_rounds_in_a_row() -> None:
    frames = {"total": 0, "calls": 0}

    def step(batch: Any) -> None:
        frames["calls"] += 1
        if frames["calls"] <= 2:  # compiles during the first pass only
            frames["total"] += 1

    def read() -> DynamoCounters:
        return DynamoCounters(frames_total=frames["total"])

    report = warm_up(step, [0, 1], WarmupConfig(min_rounds=1, steady_rounds=2, max_rounds=5), read_counters=read)
    assert report.steady and report.rounds == 3 and report.changed == (True, False, False)


def test_not_warmed_compiled_step_refuses_calls() -> None:
    step = CompiledStep(lambda x: x, EAGER)
    with pytest.raises(RuntimeError, match="not warmed up"):
        step(torch.ones(1))
    with pytest.raises(RuntimeError, match="not warmed up"):
        _ = step.compile_s


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"min_rounds": 0}, "min_rounds"),
        ({"min_rounds": 3, "max_rounds": 2}, "max_rounds"),
        ({"steady_rounds": 0}, "steady_rounds"),
        ({"time_tolerance": 0.0}, "time_tolerance"),
    ],
)
def test_warmup_config_names_bad_values(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        WarmupConfig(**kwargs)


def test_compile_config_names_bad_mode() -> None:
    with pytest.raises(ValueError, match="'fast'"):
        CompileConfig(mode="fast")  # type: ignore[arg-type]


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
    before = DynamoCounters.read()
    for batch in sampler:
        step(collate([sequences[i] for i in batch]))
    assert DynamoCounters.read() == before
