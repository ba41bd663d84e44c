"""Is this machine quiet enough to gate on timing? CPU load, and another process or throttling on the GPU."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .device import DeviceType
from .settings import DEFAULT_MAX_LOAD_PER_CORE

__all__ = ["DEFAULT_MAX_LOAD_PER_CORE", "Preflight", "check"]


@dataclass(frozen=True)
class Preflight:
    """Problems that make timing checks meaningless right now (empty: go ahead)."""

    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def check(
    device: DeviceType,
    *,
    max_load_per_core: float = DEFAULT_MAX_LOAD_PER_CORE,
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
    cpu_count: int | None = None,
    device_index: int | None = None,
    nvml_module: Any = None,
) -> Preflight:
    """Check the conditions timing budgets need: a 1-minute load average within ``max_load_per_core``
    x cores and, on CUDA, no other process on the GPU and no throttling (skipped without NVML).

    Args:
        device: the device the test measures.
        max_load_per_core: CPU load limit per logical core.
        loadavg: returns the 1/5/15-minute load averages (injected in tests).
        cpu_count: logical cores (default ``os.cpu_count()``).
        device_index: the CUDA device measured, as torch numbers it (default: the current one).
        nvml_module: a ``pynvml``-compatible module (injected in tests).

    Returns:
        :class:`Preflight` naming every problem found.
    """
    problems: list[str] = []
    cores = cpu_count or os.cpu_count() or 1
    try:
        load = loadavg()[0]
    except OSError:
        load = None
    if load is not None and load > max_load_per_core * cores:
        problems.append(
            f"CPU load average {load:.2f} on {cores} cores exceeds {max_load_per_core:g} per core: "
            "another process competes with the timed code"
        )
    if device == "cuda":
        from .measure import nvml

        got = nvml.gpu_preflight(device_index, module=nvml_module)
        if isinstance(got, nvml.GpuPreflight):
            problems.extend(got.problems)
    return Preflight(tuple(problems))
