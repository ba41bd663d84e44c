"""Tests of measure.timing: sample counts, warm-up, thread pinning, validation; CUDA glue on a GPU."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from perfbudget.measure import stats
from perfbudget.measure.timing import Samples, _counts_from_estimate, bench, pinned_threads

from .support import gpu_test


def test_bench_returns_raw_samples_after_warmup() -> None:
    calls = []
    s = bench(lambda: calls.append(1), warmup_ms=0, min_samples=7, max_ms=0, min_warmup_calls=3)
    assert s.n == 7
    assert s.warmup_calls == 3
    # Every call is either warm-up or a timed sample: nothing is hidden.
    assert len(calls) == s.warmup_calls + s.n
    assert all(x >= 0 for x in s.samples_ms)
    assert s.threads == 1 and s.device == "cpu" and s.timer == "perf_counter"


def test_time_budget_adds_samples_beyond_the_minimum() -> None:
    s = bench(lambda: None, warmup_ms=0, min_samples=3, max_ms=20)
    assert s.n > 3


def test_max_samples_caps_the_run() -> None:
    s = bench(lambda: None, warmup_ms=0, min_samples=5, max_ms=10_000, max_samples=50)
    assert s.n == 50


def test_timer_measures_the_call() -> None:
    # time.sleep sleeps at least as long as asked: a lower bound that cannot flake.
    s = bench(lambda: time.sleep(0.002), warmup_ms=0, min_samples=3, max_ms=0, min_warmup_calls=1)
    assert min(s.samples_ms) >= 2.0


def test_threads_are_pinned_during_the_run_and_restored() -> None:
    seen = []
    torch.set_num_threads(2)
    try:
        bench(
            lambda: seen.append(torch.get_num_threads()),
            warmup_ms=0,
            min_samples=2,
            max_ms=0,
            threads=1,
        )
        assert set(seen) == {1}
        assert torch.get_num_threads() == 2
        seen.clear()
        bench(
            lambda: seen.append(torch.get_num_threads()),
            warmup_ms=0,
            min_samples=2,
            max_ms=0,
            threads=None,
        )
        assert set(seen) == {2}
    finally:
        torch.set_num_threads(1)


def test_threads_restored_when_fn_raises() -> None:
    torch.set_num_threads(2)
    try:
        with pytest.raises(ZeroDivisionError):
            bench(lambda: 1 / 0, threads=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_pinned_threads_rejects_zero() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1"), pinned_threads(0):
        pass


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_samples": 0}, "min_samples"),
        ({"device": "tpu"}, "device must be one of"),
        ({"flush_l2": True}, "need device='cuda'"),
        ({"cuda_graph": True}, "need device='cuda'"),
        ({"max_samples": 2, "min_samples": 3}, "max_samples"),
        ({"warmup_ms": -1}, "must be >= 0"),
    ],
)
def test_bench_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bench(lambda: None, **kwargs)


def test_cuda_bench_without_cuda_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        bench(lambda: None, device="cuda")


def test_summary_is_stats_summarize_of_the_samples() -> None:
    s = Samples(samples_ms=(3.0, 1.0, 2.0, 4.0, 5.0), warmup_calls=1, threads=1)
    assert s.summary() == stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.median_ms == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.warmup_calls = 2  # type: ignore[misc]


def test_samples_reject_empty_and_unknown_device() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        Samples(samples_ms=(), warmup_calls=0, threads=1)
    with pytest.raises(ValueError, match="device"):
        Samples(samples_ms=(1.0,), warmup_calls=0, threads=1, device="tpu")  # type: ignore[arg-type]


def test_counts_from_estimate_turn_budgets_into_calls() -> None:
    # 2 ms per call: 200 ms warm-up -> 100 calls; 1000 ms budget -> 500 calls.
    assert _counts_from_estimate(
        2.0, warmup_ms=200, min_samples=30, max_ms=1000, min_warmup_calls=2, max_samples=10_000
    ) == (100, 500)
    # A slow call still gets the minimums.
    assert _counts_from_estimate(
        500.0, warmup_ms=200, min_samples=30, max_ms=1000, min_warmup_calls=2, max_samples=10_000
    ) == (2, 30)
    # A zero estimate is capped, not a division by zero.
    assert (
        _counts_from_estimate(
            0.0, warmup_ms=1, min_samples=1, max_ms=1, min_warmup_calls=0, max_samples=1000
        )[1]
        == 1000
    )


@gpu_test
def test_cuda_events_time_gpu_work() -> None:
    a = torch.randn(2048, 2048, device="cuda")
    s = bench(lambda: a @ a, device="cuda", warmup_ms=20, min_samples=10, max_ms=50)
    assert s.timer == "cuda_event" and s.n >= 10 and min(s.samples_ms) > 0


@gpu_test
def test_cuda_l2_flush_and_graph_modes_run() -> None:
    a = torch.randn(512, 512, device="cuda")
    flushed = bench(
        lambda: a @ a, device="cuda", flush_l2=True, warmup_ms=5, min_samples=5, max_ms=10
    )
    assert flushed.l2_flushed
    graphed = bench(
        lambda: a @ a, device="cuda", cuda_graph=True, warmup_ms=5, min_samples=5, max_ms=10
    )
    assert graphed.timer == "cuda_graph" and graphed.calls_per_sample >= 1


@gpu_test
def test_each_cuda_mode_times_a_known_kernel_at_its_own_length() -> None:
    """Events, L2 flush and graph replays all read one spin kernel's length in ms, against the kernel timed by
    hand: a wrong unit, a missing synchronise or a per-call division done twice would show as a factor."""
    cycles = 4_000_000  # a few ms at GPU clocks

    def spin() -> None:
        torch.cuda._sleep(cycles)

    spin()
    torch.cuda.synchronize()
    by_hand = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        spin()
        end.record()
        end.synchronize()
        by_hand.append(start.elapsed_time(end))
    expected = sorted(by_hand)[2]
    assert expected > 0.1, by_hand
    budget = dict(warmup_ms=20, min_samples=10, max_ms=200)
    for mode in ({}, {"flush_l2": True}, {"cuda_graph": True}):
        s = bench(spin, device="cuda", **budget, **mode)  # type: ignore[arg-type]
        assert 0.8 < s.median_ms / expected < 1.25, (mode, s.median_ms, expected)
