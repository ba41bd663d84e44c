"""Tests of measure.memory: the running-sum peak, CPU peaks from profiler events, per-phase peaks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from perfbudget.measure.memory import (
    _own_allocations,
    memory_events,
    peak_by_phase,
    peak_cpu_mib,
    peak_live_bytes,
)

from .support import gpu_test


def test_peak_live_bytes_is_the_running_sum_peak() -> None:
    # levels 100, 150, 50, 250, 0
    assert peak_live_bytes([(0, 100), (1, 50), (2, -100), (3, 200), (4, -250)]) == 250
    # Out-of-order input is sorted by time first.
    assert peak_live_bytes([(3, 200), (0, 100), (2, -100), (1, 50)]) == 250
    assert peak_live_bytes([]) == 0
    # Frees of memory allocated before the window never push the peak below zero.
    assert peak_live_bytes([(0, -64), (1, 32)]) == 0


def test_only_the_windows_own_blocks_are_freed() -> None:
    records = [
        (0, -4096, 0xA0),  # a block from before the window, freed with a (possibly stale) size
        (1, 1000, 0xB0),
        (2, 500, 0xC0),
        (3, -1000, 0xB0),
        (4, -500, 0xD0),  # address never allocated in the window: dropped
        (9, 64, 0xE0),  # outside the window
    ]
    assert _own_allocations(records, 0, 5) == [(1, 1000), (2, 500), (3, -1000)]
    assert peak_live_bytes(_own_allocations(records, 0, 5)) == 1500
    # Without addresses every event counts.
    assert _own_allocations([(1, 10, None), (2, -30, None)], 0, 5) == [(1, 10), (2, -30)]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    # Small weights, wide activations: the step's peak is dominated by batch-sized tensors.
    return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 64))


def train_step(model: nn.Module, batch: int) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 64)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


def test_larger_batch_raises_cpu_peak_proportionally() -> None:
    model = make_model()
    small = peak_cpu_mib(train_step(model, 256), warmup=1, steps=1)
    large = peak_cpu_mib(train_step(model, 1024), warmup=1, steps=1)
    # Activations are 1024 floats per sample per hidden tensor: 4x the batch is ~4x the peak,
    # less the batch-independent gradients (0.5 MiB).
    assert small > 2.0
    assert 3.5 * small < large <= 4.0 * small


def test_peak_is_reproducible() -> None:
    model = make_model()
    step = train_step(model, 128)
    # Allocator addresses are reused across runs; the peak must not depend on it.
    first = peak_cpu_mib(step)
    assert all(peak_cpu_mib(step) == first for _ in range(5))


def test_forward_only_peak_scales_with_batch() -> None:
    model = make_model()
    x1, x4 = torch.randn(100, 64), torch.randn(400, 64)
    with torch.no_grad():
        p1 = peak_cpu_mib(lambda: model(x1))
        p4 = peak_cpu_mib(lambda: model(x4))
    # Peak: the Linear's [B, 1024] output and the ReLU's output live together, 2 * B * 4 KiB.
    assert p1 == pytest.approx(2 * 100 * 1024 * 4 / 2**20, rel=0.05)
    assert p4 == pytest.approx(4 * p1, rel=0.05)


def test_cpu_phase_peaks() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 64)
    peaks = peak_by_phase(lambda: model(x).square().mean(), optimizer=opt, device="cpu")
    assert peaks.reference == "step_start" and peaks.device == "cpu"
    # Forward keeps two [512, 1024] activations (pre- and post-ReLU) for backward: >= 4 MiB.
    assert peaks.forward_mib >= 4.0
    # Backward adds gradients on top of what forward left live.
    assert peaks.backward_mib > peaks.forward_mib
    assert peaks.optimizer_mib < peaks.backward_mib
    assert peaks.peak_mib == peaks.backward_mib
    assert set(peaks.by_phase()) == {"forward", "backward", "optimizer"}


def test_phase_peaks_accept_callables() -> None:
    model = make_model()
    x = torch.randn(64, 64)
    calls: list[str] = []

    def backward(loss: torch.Tensor) -> None:
        calls.append("b")
        loss.backward()

    peaks = peak_by_phase(
        lambda: model(x).sum(),
        backward=backward,
        optimizer=lambda: calls.append("o"),
        device="cpu",
        warmup=0,
    )
    assert calls == ["b", "o"]
    assert peaks.forward_mib > 0


def test_bad_optimizer_and_device() -> None:
    with pytest.raises(TypeError, match="optimizer must be"):
        peak_by_phase(lambda: torch.ones(1, requires_grad=True).sum(), optimizer=3, device="cpu")
    with pytest.raises(ValueError, match="device"):
        peak_by_phase(lambda: torch.ones(1), device="tpu")  # type: ignore[arg-type]


def test_memory_events_needs_a_finished_profile() -> None:
    with pytest.raises(RuntimeError, match="profile_memory=True"):
        memory_events(object())


@gpu_test
def test_cuda_phase_peaks_count_from_the_step_start_as_on_cpu() -> None:
    model = make_model()
    x = torch.randn(4096, 64)
    cpu = peak_by_phase(lambda: model(x).square().mean(), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                        device="cpu")
    model = model.cuda()
    x = x.cuda()
    peaks = peak_by_phase(lambda: model(x).square().mean(), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                          device="cuda")
    assert peaks.reference == cpu.reference == "step_start"
    assert peaks.backward_mib >= peaks.forward_mib > 0
    # Same tensors on both devices: the CUDA allocator rounds blocks up, never by 2x here.
    assert cpu.forward_mib * 0.8 <= peaks.forward_mib <= cpu.forward_mib * 2


def test_a_phase_that_runs_nothing_is_not_measured() -> None:
    # A precision policy that owns backward and the optimizer step passes optimizer=None: no
    # optimizer phase ran, so there is no peak to report for it (not a peak of 0).
    model = make_model()
    x = torch.randn(64, 64)
    peaks = peak_by_phase(lambda: model(x).square().mean(), optimizer=None, device="cpu")
    assert peaks.optimizer_mib is None
    assert set(peaks.by_phase()) == {"forward", "backward"}
    assert peaks.peak_mib == max(peaks.forward_mib, peaks.backward_mib)


def test_a_calls_allocation_counts_the_bytes_it_asks_for_whether_or_not_it_frees_them() -> None:
    from perfbudget.measure.memory import allocation

    x = torch.ones(256, 256)

    def two_temporaries() -> torch.Tensor:
        return (x * 2.0) + 1.0  # two 256 KiB results, one freed before the call returns

    two_temporaries()
    got = allocation(two_temporaries)
    assert got.bytes_per_call == pytest.approx(2 * 256 * 256 * 4, rel=0.01)
    assert got.minor_faults_per_call >= 0
    with pytest.raises(ValueError, match="calls must be >= 1"):
        allocation(two_temporaries, calls=0)


def test_on_a_gpu_a_calls_allocation_is_the_caching_allocators_counter_over_the_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU path on a CPU machine: the caching allocator's cumulative counter, faked.
    from perfbudget.measure.memory import allocation

    counter = {"allocated_bytes.all.allocated": 1000}

    def call() -> None:
        counter["allocated_bytes.all.allocated"] += 3 << 20

    monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a, **k: dict(counter))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    got = allocation(call, device="cuda", calls=4, threads=None)
    assert got.bytes_per_call == 3 << 20
