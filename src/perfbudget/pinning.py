"""One GPU per pytest-xdist worker: which GPUs are visible and which one worker ``gwN`` gets."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from typing import Any

from .measure import nvml
from .measure.nvml import visible_gpus

__all__ = ["cuda_device_list_fixed", "cuda_driver", "gpu_for_worker", "nvml_gpu_count", "visible_gpus",
           "wants_gpu_workers"]

def gpu_for_worker(worker_id: str, gpus: Sequence[str]) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value for xdist worker ``worker_id``: ``gwN`` gets ``gpus[N % len(gpus)]``.

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


def cuda_driver() -> Any:
    """The CUDA driver library (``libcuda.so.1``), or ``None`` without one; loading it starts nothing."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def cuda_device_list_fixed(torch: Any, *, driver: Callable[[], Any] | None = None) -> str | None:
    """What already fixed this process's list of CUDA devices, or ``None`` while a
    ``CUDA_VISIBLE_DEVICES`` set now is still honoured (CUDA reads it once, at ``cuInit``).

    Args:
        torch: the imported ``torch`` module, or ``None`` when it is not imported.
        driver: returns the driver library or ``None`` (default :func:`cuda_driver`).
    """
    cuda = getattr(torch, "cuda", None)
    # torch's cached count: ``_cached_device_count`` once CUDA is initialised, or an older torch's
    # ``lru_cache`` on ``device_count``, filled by the first call even before CUDA starts.
    if cuda is not None:
        if cuda.is_initialized():
            return "torch initialised CUDA"
        count = getattr(cuda, "device_count", None)
        cache_info = getattr(count, "cache_info", None)
        if getattr(cuda, "_cached_device_count", None) is not None or (
                callable(cache_info) and cache_info().currsize):
            return "torch.cuda.device_count() cached its count"
    # cuDeviceGetCount fails until cuInit ran here, which torch leaves no trace of:
    # ``is_available()`` and a ``device_count()`` NVML cannot answer start the driver alone.
    lib = (driver or cuda_driver)()
    if lib is not None:
        got = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(got)) == 0:
            return ("the CUDA driver was initialised in this process (torch.cuda.is_available() does it, "
                    "and so does torch.cuda.device_count() where NVML cannot count)")
    return None
