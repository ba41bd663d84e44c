"""Test support for the measurement layer: a fake NVML, records, a CUDA skip marker."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch


# GPU-only glue: the plugin registers ``gpu``; the skipif keeps these tests honest when the
# suite runs without the plugin (a skip with the reason, never a silent pass).
def gpu_test(fn: Any) -> Any:
    """Mark ``fn`` as GPU glue: ``gpu`` marker plus a skip with the reason when CUDA is absent."""
    fn = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(fn)
    return pytest.mark.gpu(fn)


@dataclasses.dataclass
class FakeGpu:
    """One fake GPU's state; its NVML handle is the object itself."""

    index: int
    uuid: str
    pci_bus: int
    """PCI bus number (domain 0, device 0): NVML's bus id is ``00000000:<bus>:00.0``."""
    name: str = "NVIDIA H200"
    mem_total: int = 141 * 1024**3
    mem_used: int = 2 * 1024**3
    power_mw: int = 350_000
    power_instant_mw: int | None = 420_000
    energy_mj: int = 1_000_000
    energy_supported: bool = True
    sm_clock: int = 1980
    max_sm_clock: int = 1980
    reasons: int = 0
    compute_procs: list[Any] = dataclasses.field(default_factory=list)
    graphics_procs: list[Any] = dataclasses.field(default_factory=list)
    cc: tuple[int, int] = (9, 0)
    gpm_supported: bool = True
    gpm_values: dict[int, float] = dataclasses.field(
        default_factory=lambda: {2: 91.0, 3: 47.5, 5: 63.0, 10: 30.0}
    )
    gpm_samples: int = 0
    """GPM samples taken on this GPU."""

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.pci_bus:02X}:00.0"


class FakeNvml:
    """A pynvml stand-in for ``gpus`` GPUs (distinct UUIDs, PCI bus ids and state): the
    functions return configurable values; constants, error classes and ctypes structs are the
    real ``pynvml`` ones."""

    def __init__(self, gpus: int = 1) -> None:
        import pynvml

        self._real = pynvml
        self.gpus = [
            FakeGpu(index=i, uuid=f"GPU-{i:04d}a1b2-c3d4-e5f6-0718-293a4b5c6d7e", pci_bus=0x1B + 0x20 * i)
            for i in range(gpus)
        ]
        self.init_error: Exception | None = None
        self.inits = 0
        self.shutdowns = 0
        self.samples_alloc = 0
        self.samples_freed = 0

    @property
    def gpu(self) -> FakeGpu:
        """The first GPU (the only one of the default fake)."""
        return self.gpus[0]

    def __getattr__(self, name: str) -> Any:
        # Constants, structs and exception classes come from the real module; its functions
        # would call the real library, so they are not forwarded.
        value = getattr(self._real, name)
        if isinstance(value, types.FunctionType):
            raise AttributeError(name)
        return value

    def _error(self, code: int) -> Exception:
        return self._real.NVMLError(code)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise self._error(self._real.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeGpu:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self.gpus:
            if g.uuid == text:
                return g
        raise self._error(self._real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> FakeGpu:
        text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        domain, bus, rest = text.split(":")
        dev, fn = rest.split(".")
        want = (int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16))
        for g in self.gpus:
            if want == (0, g.pci_bus, 0, 0):
                return g
        raise self._error(self._real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return h.index

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(total=h.mem_total, used=h.mem_used, free=h.mem_total - h.mem_used)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.power_mw

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, ids: list[int]) -> Any:
        values = (self._real.c_nvmlFieldValue_t * len(ids))()
        for i, fid in enumerate(ids):
            values[i].fieldId = fid
            if fid == self._real.NVML_FI_DEV_POWER_INSTANT and h.power_instant_mw is not None:
                values[i].nvmlReturn = self._real.NVML_SUCCESS
                values[i].value.uiVal = h.power_instant_mw
            else:
                values[i].nvmlReturn = self._real.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        if not h.energy_supported:
            raise self._real.NVMLError_NotSupported(self._real.NVML_ERROR_NOT_SUPPORTED)
        return h.energy_mj

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        return h.sm_clock

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, clock: int) -> int:
        return h.max_sm_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return h.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return list(h.compute_procs)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return list(h.graphics_procs)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "560.35.03"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12060

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.cc

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(isSupportedDevice=int(h.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self.samples_alloc += 1
        return self._real.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, s: Any) -> None:
        self.samples_freed += 1

    def nvmlGpmSampleGet(self, h: FakeGpu, s: Any) -> Any:
        h.gpm_samples += 1
        self._gpm_gpu = h
        return s

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        values = self._gpm_gpu.gpm_values
        for i in range(req.numMetrics):
            mid = req.metrics[i].metricId
            if mid in values:
                req.metrics[i].value = values[mid]
                req.metrics[i].nvmlReturn = self._real.NVML_SUCCESS
            else:
                req.metrics[i].nvmlReturn = self._real.NVML_ERROR_NOT_SUPPORTED
        return req


def process(pid: int, used_mib: float) -> Any:
    """A running-process record as pynvml returns it."""
    return types.SimpleNamespace(pid=pid, usedGpuMemory=int(used_mib * 1024 * 1024))


def cuda_properties(
    nv: FakeNvml, visible: Sequence[int], *, uuid: bool = True, pci: bool = True
) -> Callable[[int], Any]:
    """``torch.cuda.get_device_properties`` as a process that sees only NVML GPUs ``visible``
    would: ``cuda:i`` is ``nv.gpus[visible[i]]``. Torch prints the UUID without NVML's ``GPU-``."""

    def props(cuda_index: int) -> Any:
        if not 0 <= cuda_index < len(visible):
            raise AssertionError(f"Invalid device id {cuda_index}")  # what torch raises
        g = nv.gpus[visible[cuda_index]]
        fields: dict[str, Any] = {"name": g.name}
        if uuid:
            fields["uuid"] = g.uuid.removeprefix("GPU-")
        if pci:
            fields.update(pci_domain_id=0, pci_bus_id=g.pci_bus, pci_device_id=0)
        return types.SimpleNamespace(**fields)

    return props
