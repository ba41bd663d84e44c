"""Waiting for queued device work before a host clock or counter is read."""

from __future__ import annotations

from collections.abc import Callable

from perfbudget.device import DeviceType

__all__ = ["device_sync"]


def _no_sync() -> None:
    """CPU work is finished when the call returns: nothing to wait for."""


def device_sync(device: DeviceType) -> Callable[[], None]:
    """The function that waits for ``device``'s queued work: ``torch.cuda.synchronize`` for ``"cuda"``,
    a no-op for ``"cpu"``; ``ValueError`` for any other name."""
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    if device == "cpu":
        return _no_sync
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
