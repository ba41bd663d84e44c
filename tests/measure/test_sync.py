"""Tests of measure.sync: one device-synchronisation helper for every measurement."""

from __future__ import annotations

import pytest
import torch

from perfbudget.measure.sync import device_sync


def test_cpu_sync_is_a_no_op_and_cuda_sync_is_torchs() -> None:
    assert device_sync("cpu")() is None
    assert device_sync("cuda") is torch.cuda.synchronize


def test_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda', got 'mps'"):
        device_sync("mps")  # type: ignore[arg-type]
