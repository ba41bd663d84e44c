"""Test support for the measurement layer: a fake NVML, records, a CUDA skip marker."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch


# GPU-only glue: the plugin registers ``gpu``; the skipif keeps these tests honest when the
# suite runs without the plugin (a skip with the reason, never a silent pass).
def gpu_test(fn: Any) -> Any:
    """Mark ``fn`` as GPU glue: ``gpu`` marker plus a skip with the reason when CUDA is absent."""
    fn = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(fn)
    return pytest.mark.gpu(fn)


class FakeNvml:
    """A pynvml stand-in for one GPU: the functions return configurable values; constants,
    error classes and ctypes structs are the real ``pynvml`` ones."""

    def __init__(self) -> None:
        import pynvml

        self._real = pynvml
        self.name = "NVIDIA H200"
        self.mem_total = 141 * 1024**3
        self.mem_used = 2 * 1024**3
        self.power_mw = 350_000
        self.power_instant_mw: int | None = 420_000
        self.energy_mj = 1_000_000
        self.energy_supported = True
        self.sm_clock = 1980
        self.max_sm_clock = 1980
        self.reasons = 0
        self.compute_procs: list[Any] = []
        self.graphics_procs: list[Any] = []
        self.cc = (9, 0)
        self.gpm_supported = True
        self.gpm_values = {2: 91.0, 3: 47.5, 5: 63.0, 10: 30.0}
        self.init_error: Exception | None = None
        self.inits = 0
        self.shutdowns = 0
        self.samples_alloc = 0
        self.samples_freed = 0

    def __getattr__(self, name: str) -> Any:
        # Constants, structs and exception classes come from the real module; its functions
        # would call the real library, so they are not forwarded.
        value = getattr(self._real, name)
        if isinstance(value, types.FunctionType):
            raise AttributeError(name)
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index != 0:
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        return ("handle", index)

    def nvmlDeviceGetName(self, h: Any) -> bytes:
        return self.name.encode()

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        return types.SimpleNamespace(
            total=self.mem_total, used=self.mem_used, free=self.mem_total - self.mem_used
        )

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self.power_mw

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[int]) -> Any:
        values = (self._real.c_nvmlFieldValue_t * len(ids))()
        for i, fid in enumerate(ids):
            values[i].fieldId = fid
            if fid == self._real.NVML_FI_DEV_POWER_INSTANT and self.power_instant_mw is not None:
                values[i].nvmlReturn = self._real.NVML_SUCCESS
                values[i].value.uiVal = self.power_instant_mw
            else:
                values[i].nvmlReturn = self._real.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        if not self.energy_supported:
            raise self._real.NVMLError_NotSupported(self._real.NVML_ERROR_NOT_SUPPORTED)
        return self.energy_mj

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        return self.sm_clock

    def nvmlDeviceGetMaxClockInfo(self, h: Any, clock: int) -> int:
        return self.max_sm_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return list(self.compute_procs)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        return list(self.graphics_procs)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "560.35.03"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12060

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        return self.cc

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        return types.SimpleNamespace(isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self.samples_alloc += 1
        return self._real.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, s: Any) -> None:
        self.samples_freed += 1

    def nvmlGpmSampleGet(self, h: Any, s: Any) -> Any:
        return s

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        for i in range(req.numMetrics):
            mid = req.metrics[i].metricId
            if mid in self.gpm_values:
                req.metrics[i].value = self.gpm_values[mid]
                req.metrics[i].nvmlReturn = self._real.NVML_SUCCESS
            else:
                req.metrics[i].nvmlReturn = self._real.NVML_ERROR_NOT_SUPPORTED
        return req


def process(pid: int, used_mib: float) -> Any:
    """A running-process record as pynvml returns it."""
    return types.SimpleNamespace(pid=pid, usedGpuMemory=int(used_mib * 1024 * 1024))
