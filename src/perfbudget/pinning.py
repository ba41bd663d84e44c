"""One GPU per pytest-xdist worker: which GPUs are visible and which one worker ``gwN`` gets."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

__all__ = ["gpu_for_worker", "nvml_gpu_count", "visible_gpus", "wants_gpu_workers"]


def visible_gpus(cuda_visible_devices: str | None, device_count: int) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    Args:
        cuda_visible_devices: the variable's value, or ``None`` when unset.
        device_count: GPUs the driver reports (used when the variable is unset).

    Returns:
        Indices or UUIDs (``["0", "1"]``, ``["GPU-8f…", "MIG-…"]``); empty for none. As CUDA
        does, entries after an invalid one (``-1``, an empty entry) are ignored.
    """
    if cuda_visible_devices is None:
        return [str(i) for i in range(max(device_count, 0))]
    out = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if not entry or re.fullmatch(r"-\d+", entry):
            break
        out.append(entry)
    return out


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


def nvml_gpu_count(nvml: Callable[[], object] | None = None) -> int:
    """GPUs the NVIDIA driver reports, via NVML (never initialises CUDA); 0 without a driver."""
    try:
        pynvml = nvml() if nvml is not None else __import__("pynvml")
        pynvml.nvmlInit()  # type: ignore[attr-defined]
        try:
            return int(pynvml.nvmlDeviceGetCount())  # type: ignore[attr-defined]
        finally:
            pynvml.nvmlShutdown()  # type: ignore[attr-defined]
    except Exception:  # no driver, no library: no GPUs to pin
        return 0
