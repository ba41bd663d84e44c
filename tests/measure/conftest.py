"""Shared fixtures for the measurement-layer unit tests: one intra-op thread, a fake NVML."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from .support import FakeNvml


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    # Two cores shared with other jobs: one intra-op thread keeps the tests quick and calm.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake_nvml() -> FakeNvml:
    """A fresh fake NVML with one healthy, idle H200."""
    return FakeNvml()
