"""Waiting for queued device work: one helper for every timer and fixture."""

from __future__ import annotations

from collections.abc import Callable

from perfbudget.device import DeviceType

__all__ = ["device_sync"]


def device_sync(device: DeviceType) -> Callable[[], None]:
    """``torch.cuda.synchronize`` for ``"cuda"``, a no-op for ``"cpu"``."""
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    if device != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return lambda: None
