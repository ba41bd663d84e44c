"""Roofline ceilings of a device (datasheet or measured) and the compute/memory-bound class of an operator."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from perfbudget.measure.timing import pinned_threads

__all__ = ["DATASHEET_PEAKS", "DevicePeaks", "Roofline", "datasheet_peaks", "measure_cpu_peaks"]

Roofline = Literal["compute", "memory", "unknown"]
"""Roofline class of an operator against a device's ridge point."""


@dataclass(frozen=True, kw_only=True)
class DevicePeaks:
    """Peak arithmetic rate and memory bandwidth of a device: the roofline's two ceilings."""

    name: str
    """Device name the peaks belong to."""
    flops_per_s: Mapping[str, float]
    """Peak FLOP/s by dtype (``"float32"``, ``"tf32"``, ``"float16"``, ``"bfloat16"``); dense."""
    bytes_per_s: float
    """Peak memory bandwidth in bytes/s."""
    source: Literal["datasheet", "measured"]
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        if not self.flops_per_s or "float32" not in self.flops_per_s:
            raise ValueError(f"flops_per_s must contain 'float32', got {dict(self.flops_per_s)}")
        if self.bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be > 0, got {self.bytes_per_s!r}")

    def ridge_flop_per_byte(self, dtype: str = "float32") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns compute-bound (an unlisted dtype: float32's)."""
        return self.flops_per_s.get(dtype, self.flops_per_s["float32"]) / self.bytes_per_s

    def classify(self, flops: float, bytes_accessed: float, dtype: str = "float32") -> Roofline:
        """Roofline class of ``flops`` FLOPs over ``bytes_accessed`` bytes: ``"compute"`` at or above the ridge
        point, ``"memory"`` below it, ``"unknown"`` without bytes."""
        if bytes_accessed <= 0:
            return "unknown"
        if flops <= 0:
            return "memory"
        return "compute" if flops / bytes_accessed >= self.ridge_flop_per_byte(dtype) else "memory"


def _datasheet(name: str, fp32: float, tf32: float, fp16: float, bytes_per_s: float) -> DevicePeaks:
    flops = {"float32": fp32, "tf32": tf32, "float16": fp16, "bfloat16": fp16}
    return DevicePeaks(name=name, flops_per_s=flops, bytes_per_s=bytes_per_s, source="datasheet")


# Dense (no sparsity) vendor datasheet numbers, SXM parts unless the name says PCIe.
# "tf32" applies to fp32 matmuls only when TF32 is enabled (torch.backends.cuda.matmul).
DATASHEET_PEAKS: Mapping[str, DevicePeaks] = {
    "a100-40gb": _datasheet("NVIDIA A100 40GB", 19.5e12, 156e12, 312e12, bytes_per_s=1.555e12),
    "a100": _datasheet("NVIDIA A100 80GB", 19.5e12, 156e12, 312e12, bytes_per_s=2.039e12),
    "h100-pcie": _datasheet("NVIDIA H100 PCIe", 51.2e12, 378e12, 756e12, bytes_per_s=2.0e12),
    "h100": _datasheet("NVIDIA H100 SXM", 66.9e12, 494.7e12, 989.4e12, bytes_per_s=3.35e12),
    "h200": _datasheet("NVIDIA H200", 66.9e12, 494.7e12, 989.4e12, bytes_per_s=4.8e12),
}


def datasheet_peaks(device_name: str) -> DevicePeaks | None:
    """Datasheet peaks for a GPU name as ``torch.cuda.get_device_name()`` spells it, ``None`` if unknown.

    Args:
        device_name: e.g. ``"NVIDIA H100 80GB HBM3"`` or ``"NVIDIA A100-SXM4-40GB"``.
    """
    n = device_name.lower()
    if "h200" in n:
        return DATASHEET_PEAKS["h200"]
    if "h100" in n:
        return DATASHEET_PEAKS["h100-pcie" if "pcie" in n else "h100"]
    if "a100" in n:
        return DATASHEET_PEAKS["a100-40gb" if "40gb" in n else "a100"]
    return None


@functools.lru_cache(maxsize=8)
def measure_cpu_peaks(threads: int = 1) -> DevicePeaks:
    """Measure this CPU's float32 matmul rate and copy bandwidth (best of 5; ~0.2 s, cached per thread count).

    Args:
        threads: torch intra-op threads to measure with (match the profiled run).
    """
    import torch

    with pinned_threads(threads):
        n = 512
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        torch.mm(a, b)
        best_mm = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best_mm = min(best_mm, time.perf_counter() - t0)
        src = torch.empty(16 * 1024 * 1024 // 4)
        src.fill_(1.0)
        dst = torch.empty_like(src)
        dst.copy_(src)
        best_copy = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best_copy = min(best_copy, time.perf_counter() - t0)
    flops = 2 * n**3 / max(best_mm, 1e-9)
    # A copy reads and writes every byte once.
    bandwidth = 2 * src.numel() * 4 / max(best_copy, 1e-9)
    return DevicePeaks(
        name=f"cpu ({threads} thread{'s' if threads != 1 else ''})",
        flops_per_s={"float32": flops},
        bytes_per_s=bandwidth,
        source="measured",
    )
