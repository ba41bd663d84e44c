"""Shared set-up of the workload unit tests: one intra-op thread, like the timing runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # One thread keeps these tests fast on the shared 2-core machine and matches how
    # the workloads are timed; the previous setting is restored for other suites.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
