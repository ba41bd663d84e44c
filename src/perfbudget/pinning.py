"""One GPU per pytest-xdist worker: which GPUs are visible and which one worker ``gwN`` gets."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .measure import nvml
from .measure.nvml import visible_gpus

__all__ = ["gpu_for_worker", "nvml_gpu_count", "visible_gpus", "wants_gpu_workers"]


def gpu_for_worker(worker_id: str, gpus: Sequence[str]) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value for xdist worker ``worker_id`` (``gw0``, ``gw1``…).

    Worker ``gwN`` gets ``gpus[N % len(gpus)]``: with one worker per GPU each has its own;
    with more workers than GPUs they share round-robin.

    Returns:
        The entry, or ``None`` when there is no GPU or the id is not an xdist worker id.
    """
    m = re.fullmatch(r"gw(\d+)", worker_id)
    if m is None or not gpus:
        return None
    return gpus[int(m.group(1)) % len(gpus)]


def wants_gpu_workers(markexpr: str) -> bool:
    """Whether a ``-m`` expression selects GPU tests (``gpu``, ``gpu and not slow``), not ``not gpu``."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", markexpr)
    return any(w == "gpu" and (i == 0 or words[i - 1] != "not") for i, w in enumerate(words))


def nvml_gpu_count(*, module: Any = None) -> int:
    """GPUs the NVIDIA driver reports, via NVML (never initialises CUDA); 0 without a driver.

    Args:
        module: a ``pynvml``-compatible module (default: ``measure.nvml``'s).
    """
    got = nvml.gpu_count(module=module)
    return got if isinstance(got, int) else 0  # no driver, no library: no GPUs to pin
