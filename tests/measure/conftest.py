"""Shared fixtures for the measurement-layer unit tests: one intra-op thread, a fake NVML."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from perfbudget.measure import nvml

from .support import FakeNvml, cuda_properties, process


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    # Two cores shared with other jobs: one intra-op thread keeps the tests quick and calm.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """A fresh fake NVML with one healthy, idle H200, in a process without CUDA or
    CUDA_VISIBLE_DEVICES (so cuda:0 is NVML GPU 0)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", None)
    return FakeNvml()


@pytest.fixture
def worker_on_gpu2(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Four GPUs, one xdist worker process on each; this process is pinned to GPU 2
    (``CUDA_VISIBLE_DEVICES=2``), so its cuda:0 is NVML GPU 2. Torch's device properties are
    faked to match; every GPU has its own energy counter and its worker's process."""
    nv = FakeNvml(gpus=4)
    for g in nv.gpus:
        g.compute_procs = [process(os.getpid() if g.index == 2 else 5000 + g.index, 1024)]
        g.energy_mj = 1_000_000 * (g.index + 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", cuda_properties(nv, [2]))
    return nv
