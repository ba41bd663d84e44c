"""NVIDIA GPU state through NVML: VRAM, energy, power, GPM, processes, throttling, clocks."""

from __future__ import annotations

import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar

from perfbudget.measure.unmeasurable import Unmeasurable

__all__ = [
    "CUDA_PROPERTIES",
    "GPM_METRICS",
    "GPU_IDLE",
    "NVML_MODULE",
    "ClockSample",
    "ClockSampler",
    "GpmMetrics",
    "GpuClocks",
    "GpuInfo",
    "GpuPreflight",
    "GpuProcess",
    "NvmlGpu",
    "NvmlSession",
    "Unmeasurable",
    "driver_version",
    "gpm_metrics",
    "gpu_count",
    "gpu_info",
    "gpu_preflight",
    "max_sm_clock_mhz",
    "open_session",
    "power_w",
    "read_clocks",
    "total_energy_mj",
    "visible_gpus",
]

MIB = 1024 * 1024

NVML_MODULE: Any = None
"""Seam: the ``pynvml``-compatible module (tests inject a fake); ``None`` imports ``pynvml``."""

CUDA_PROPERTIES: Callable[[int], Any] | None = None
"""Seam: CUDA device index -> ``torch.cuda.get_device_properties`` (``uuid``, PCI ids) or ``None``;
``None`` here asks torch when CUDA is available."""

_T = TypeVar("_T")


def _describe(exc: BaseException) -> str:
    return f"{exc} ({type(exc).__name__})"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _optional(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Call an NVML getter; ``None`` when this device does not support it."""
    try:
        return fn(*args)
    except (nv.NVMLError, AttributeError):
        # AttributeError: an older nvidia-ml-py without this getter.
        return None


def visible_gpus(cuda_visible_devices: str | None, device_count: int) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries: indices or UUIDs
    (``["0", "1"]``, ``["GPU-8f…", "MIG-…"]``), all ``device_count`` GPUs when the variable is unset
    (``None``). As CUDA does, entries after an invalid one (``-1``, an empty entry) are ignored."""
    if cuda_visible_devices is None:
        return [str(i) for i in range(max(device_count, 0))]
    out = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if not entry or re.fullmatch(r"-\d+", entry):
            break
        out.append(entry)
    return out


@dataclass(frozen=True, kw_only=True)
class NvmlGpu:
    """The NVML device behind one CUDA device (``CUDA_VISIBLE_DEVICES=2``: ``cuda:0`` is NVML GPU 2)."""

    cuda_index: int
    """The CUDA device index, as torch numbers it in this process."""
    nvml_index: int | None
    """NVML's index of the device; ``None`` for a MIG instance, which has none."""
    uuid: str | None
    """``GPU-…`` or ``MIG-…``, as NVML reports it."""
    name: str
    """Product name, e.g. ``NVIDIA H200``."""
    found_by: Literal["uuid", "pci_bus_id", "cuda_visible_devices"]
    """How the device was matched: torch's UUID or PCI address of the CUDA device, or (without
    CUDA in this process) the ``CUDA_VISIBLE_DEVICES`` entry at ``cuda_index``."""
    handle: Any = field(repr=False, compare=False)
    """The NVML handle; valid while its :class:`NvmlSession` is open."""

    @property
    def label(self) -> str:
        """``GPU 2 (cuda:0)``: NVML's number and CUDA's."""
        return _label(self.nvml_index, self.uuid, self.cuda_index)


def _label(nvml_index: int | None, uuid: str | None, cuda_index: int) -> str:
    # Messages name both numbers: "GPU 2" alone is wrong in a process that calls it cuda:0.
    nvml = f"GPU {nvml_index}" if nvml_index is not None else (uuid or "GPU ?")
    return f"{nvml} (cuda:{cuda_index})"


def _current_cuda_index() -> int:
    """torch's current CUDA device, without initialising CUDA just to ask (then it is 0)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except (ImportError, RuntimeError):
        pass
    return 0


def _cuda_properties(cuda_index: int) -> Any:
    """torch's properties of CUDA device ``cuda_index``; ``None`` without CUDA in this process."""
    try:
        if CUDA_PROPERTIES is not None:
            return CUDA_PROPERTIES(cuda_index)
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(cuda_index)
    except (ImportError, RuntimeError, AssertionError, ValueError):
        # No usable CUDA here, or no such index (torch asserts): CUDA_VISIBLE_DEVICES decides.
        return None


def _uuid_names(text: str) -> list[str]:
    # torch prints the bare 8-4-4-4-12 UUID; NVML names it GPU-… (or MIG-… for an instance).
    text = text.strip()
    if text.startswith(("GPU-", "MIG-")):
        return [text]
    return [f"GPU-{text}", f"MIG-{text}"]


def _pci_bus_id(props: Any) -> str | None:
    ids = [getattr(props, n, None) for n in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if not all(isinstance(v, int) for v in ids):
        return None  # older torch has no PCI fields
    domain, bus, device = ids
    # NVML's own spelling (nvmlPciInfo_t.busId); a GPU is always function 0.
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


class NvmlSession:
    """NVML initialised once for a group of reads (:func:`open_session`), closed by :meth:`close`;
    every method answers a value or :class:`Unmeasurable`, NVML errors never escape."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        """The ``pynvml``-compatible module, initialised."""
        self._open = True

    def close(self) -> None:
        """``nvmlShutdown`` (once)."""
        if self._open:
            self._open = False
            with suppress(self.nv.NVMLError):
                self.nv.nvmlShutdown()

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _guard(self, fn: Callable[[], _T]) -> _T | Unmeasurable:
        try:
            return fn()
        except self.nv.NVMLError as exc:
            return Unmeasurable(reason=f"NVML call failed: {_describe(exc)}")

    def gpu_count(self) -> int | Unmeasurable:
        """GPUs the driver reports on the whole machine (``CUDA_VISIBLE_DEVICES`` does not apply)."""
        return self._guard(lambda: int(self.nv.nvmlDeviceGetCount()))

    def driver_version(self) -> str | Unmeasurable:
        """The NVIDIA driver version, e.g. ``560.35.03``."""
        return self._guard(lambda: _text(self.nv.nvmlSystemGetDriverVersion()))

    def gpu(self, device_index: int | None = None) -> NvmlGpu | Unmeasurable:
        """The NVML device of CUDA device ``device_index`` (``None``: torch's current device), or
        :class:`Unmeasurable` saying why it has none; ``ValueError`` for a negative index.

        Matched by torch's UUID or PCI bus id of the device, else by the ``CUDA_VISIBLE_DEVICES``
        entry at that index (assuming PCI bus order, as ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` ensures).
        """
        cuda_index = _current_cuda_index() if device_index is None else device_index
        if cuda_index < 0:
            raise ValueError(f"device_index must be a CUDA device index >= 0, got {device_index!r}")
        props = _cuda_properties(cuda_index)
        if props is not None:
            uuid = getattr(props, "uuid", None)
            if uuid is not None and str(uuid).strip():
                for name in _uuid_names(str(uuid)):
                    h = self._lookup("nvmlDeviceGetHandleByUUID", name)
                    if h is not None:
                        return self._found(h, cuda_index, "uuid")
            bus_id = _pci_bus_id(props)
            if bus_id is not None:
                h = self._lookup("nvmlDeviceGetHandleByPciBusId", bus_id)
                if h is not None:
                    return self._found(h, cuda_index, "pci_bus_id")
        return self._guard(lambda: self._from_visible_devices(cuda_index))

    def _lookup(self, getter: str, key: str) -> Any:
        """A handle from an NVML lookup by key; ``None`` when not found (or no such getter)."""
        fn = getattr(self.nv, getter, None)
        return None if fn is None else _optional(self.nv, fn, key)

    def _from_visible_devices(self, cuda_index: int) -> NvmlGpu | Unmeasurable:
        nv = self.nv
        raw = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = int(nv.nvmlDeviceGetCount())
        entries = visible_gpus(raw, count)
        if cuda_index >= len(entries):
            why = (
                f"NVML reports {count} GPU(s) and CUDA_VISIBLE_DEVICES is unset"
                if raw is None
                else f"CUDA_VISIBLE_DEVICES={raw!r} leaves {len(entries)} of the {count} GPU(s) NVML reports"
            )
            return Unmeasurable(reason=f"CUDA device {cuda_index} is not visible: {why}")
        entry = entries[cuda_index]
        if entry.isdigit():
            if int(entry) >= count:
                return Unmeasurable(
                    reason=f"CUDA_VISIBLE_DEVICES entry {entry!r} names no GPU: NVML reports {count}"
                )
            return self._found(nv.nvmlDeviceGetHandleByIndex(int(entry)), cuda_index, "cuda_visible_devices")
        if entry.startswith("MIG-"):
            h = self._lookup("nvmlDeviceGetHandleByUUID", entry)
            if h is None:
                return Unmeasurable(reason=f"CUDA_VISIBLE_DEVICES entry {entry!r}: NVML knows no such MIG device")
            return self._found(h, cuda_index, "cuda_visible_devices")
        # CUDA accepts any unique prefix of a GPU UUID.
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        matches = [h for h in handles if _text(nv.nvmlDeviceGetUUID(h)).startswith(entry)]
        if len(matches) != 1:
            return Unmeasurable(
                reason=f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} of the {count} "
                "GPU UUIDs NVML reports (CUDA needs exactly one)"
            )
        return self._found(matches[0], cuda_index, "cuda_visible_devices")

    def _found(
        self, h: Any, cuda_index: int, found_by: Literal["uuid", "pci_bus_id", "cuda_visible_devices"]
    ) -> NvmlGpu:
        nv = self.nv
        index = _optional(nv, lambda: nv.nvmlDeviceGetIndex(h))
        uuid = _optional(nv, lambda: nv.nvmlDeviceGetUUID(h))
        return NvmlGpu(
            cuda_index=cuda_index,
            nvml_index=None if index is None else int(index),
            uuid=None if uuid is None else _text(uuid),
            name=_text(nv.nvmlDeviceGetName(h)),
            found_by=found_by,
            handle=h,
        )

    def info(self, gpu: NvmlGpu) -> GpuInfo | Unmeasurable:
        """VRAM, power, energy counter, clocks, clock reasons, processes and versions of ``gpu``."""
        return self._guard(lambda: _gpu_info(self.nv, gpu))

    def total_energy_mj(self, gpu: NvmlGpu) -> int | Unmeasurable:
        """``gpu``'s total energy counter in mJ since the driver loaded (Volta and later)."""
        return self._guard(lambda: int(self.nv.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)))

    def power_w(self, gpu: NvmlGpu, *, instant: bool = True) -> float | Unmeasurable:
        """Board power of ``gpu`` in watts (see :func:`power_w`)."""
        return self._guard(lambda: _power_w(self.nv, gpu.handle, instant))

    def gpm_metrics(
        self, gpu: NvmlGpu, run: Callable[[], Any] | None, metrics: Sequence[str]
    ) -> GpmMetrics | Unmeasurable:
        """GPM metrics of ``gpu`` around ``run()`` (see :func:`gpm_metrics`)."""
        return self._guard(lambda: _gpm(self.nv, gpu, run, metrics))


def open_session(module: Any = None) -> NvmlSession | Unmeasurable:
    """Initialise NVML (the one place perfbudget does) through ``module`` (default:
    :data:`NVML_MODULE` or ``pynvml``): an open :class:`NvmlSession` (close it, or use ``with``),
    or :class:`Unmeasurable` (nvidia-ml-py not installed, no driver)."""
    nv = module if module is not None else NVML_MODULE
    if nv is None:
        try:
            import pynvml
        except ImportError as exc:
            return Unmeasurable(reason=f"nvidia-ml-py is not installed ({exc})")
        nv = pynvml
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        return Unmeasurable(reason=f"NVML unavailable: {_describe(exc)}")
    return NvmlSession(nv)


def _in_session(module: Any, read: Callable[[NvmlSession], _T | Unmeasurable]) -> _T | Unmeasurable:
    """Open a session, ``read`` it, close."""
    opened = open_session(module)
    if isinstance(opened, Unmeasurable):
        return opened
    with opened as session:
        return read(session)


def _on_gpu(
    device_index: int | None, module: Any, read: Callable[[NvmlSession, NvmlGpu], _T | Unmeasurable]
) -> _T | Unmeasurable:
    """Open a session, find CUDA device ``device_index``'s GPU, ``read`` it, close."""

    def on_gpu(session: NvmlSession) -> _T | Unmeasurable:
        gpu = session.gpu(device_index)
        return gpu if isinstance(gpu, Unmeasurable) else read(session, gpu)

    return _in_session(module, on_gpu)


def gpu_count(*, module: Any = None) -> int | Unmeasurable:
    """GPUs the driver reports on the machine (never starts CUDA), or :class:`Unmeasurable`."""
    return _in_session(module, NvmlSession.gpu_count)


def driver_version(*, module: Any = None) -> str | Unmeasurable:
    """The NVIDIA driver version (``560.35.03``), or :class:`Unmeasurable` without a driver."""
    return _in_session(module, NvmlSession.driver_version)


def max_sm_clock_mhz(device_index: int | None = None, *, module: Any = None) -> int | Unmeasurable:
    """The maximum SM clock of CUDA device ``device_index`` (MHz): part of a GPU's identity,
    since one SKU name ships at several clock limits."""
    return _on_gpu(device_index, module, lambda s, gpu: s._guard(
        lambda: int(s.nv.nvmlDeviceGetMaxClockInfo(gpu.handle, s.nv.NVML_CLOCK_SM))))


@dataclass(frozen=True, kw_only=True)
class GpuProcess:
    """A process holding a context on the GPU."""

    pid: int
    used_mib: float | None
    """Device memory the process uses (``None`` where the driver does not say)."""
    kind: Literal["compute", "graphics"]


# Clock event ("throttle") reason bits and the name each gets here. Names in _THROTTLING
# lower clocks below what the workload asked for; the others are informational.
_REASON_BITS: tuple[tuple[str, str], ...] = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
)
_THROTTLING = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)


def _reason_names(nv: Any, mask: int) -> tuple[str, ...]:
    out = []
    for name, suffix in _REASON_BITS:
        bit = getattr(nv, f"nvmlClocksEventReason{suffix}", None)
        if bit is None:
            bit = getattr(nv, f"nvmlClocksThrottleReason{suffix}", None)
        if bit and mask & int(bit):
            out.append(name)
    return tuple(out)


def _clock_reasons_mask(nv: Any, handle: Any) -> int | None:
    # The "throttle" getter is deprecated in favour of the "event" one; older drivers only
    # have the former.
    for getter in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        fn = getattr(nv, getter, None)
        if fn is None:
            continue
        value = _optional(nv, fn, handle)
        if value is not None:
            return int(value)
    return None


def _processes(nv: Any, handle: Any) -> tuple[GpuProcess, ...] | None:
    """The processes on the GPU; ``None`` when NVML could not list the compute ones (then nobody can
    say the GPU is not shared). A GPU without graphics may not list graphics ones."""
    out: list[GpuProcess] = []
    kinds: tuple[tuple[str, Literal["compute", "graphics"]], ...] = (
        ("nvmlDeviceGetComputeRunningProcesses", "compute"),
        ("nvmlDeviceGetGraphicsRunningProcesses", "graphics"),
    )
    for getter, kind in kinds:
        fn = getattr(nv, getter, None)
        procs = None if fn is None else _optional(nv, fn, handle)
        if procs is None:
            if kind == "compute":
                return None
            continue
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(
                GpuProcess(pid=int(p.pid), used_mib=None if used is None else used / MIB, kind=kind)
            )
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """State of the GPU behind one CUDA device, as NVML reports it."""

    cuda_index: int
    """The CUDA device index (torch's numbering in this process)."""
    nvml_index: int | None
    """NVML's index of the same device (``None`` for a MIG instance)."""
    uuid: str | None
    name: str
    memory_total_mib: float
    memory_used_mib: float
    """Device-wide "used": includes CUDA contexts, caches and other processes. Never compare
    with ``torch.cuda.max_memory_allocated``."""
    power_w: float | None
    """Board power (averaged over ~1 s on GA100 and later)."""
    energy_mj: int | None
    """Total energy counter since the driver loaded, in mJ (Volta and later)."""
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    clock_reasons: tuple[str, ...] | None
    """Active clock event reasons (e.g. ``"sw_power_cap"``, ``"gpu_idle"``); ``None``: NVML did not say."""
    processes: tuple[GpuProcess, ...] | None
    """Processes using the GPU; ``None``: NVML could not list them."""
    driver_version: str | None
    cuda_driver_version: str | None
    """CUDA version the driver supports, e.g. ``"12.4"``."""
    compute_capability: tuple[int, int] | None

    @property
    def label(self) -> str:
        """``GPU 2 (cuda:0)``: NVML's number and CUDA's, for messages."""
        return _label(self.nvml_index, self.uuid, self.cuda_index)


def _gpu_info(nv: Any, gpu: NvmlGpu) -> GpuInfo:
    h = gpu.handle
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    power = _optional(nv, lambda: nv.nvmlDeviceGetPowerUsage(h))
    energy = _optional(nv, lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
    clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
    sm_clock = _optional(nv, lambda: nv.nvmlDeviceGetClockInfo(h, clock_sm))
    max_clock = _optional(nv, lambda: nv.nvmlDeviceGetMaxClockInfo(h, clock_sm))
    mask = _clock_reasons_mask(nv, h)
    cuda_v = _optional(nv, lambda: nv.nvmlSystemGetCudaDriverVersion())
    cc = _optional(nv, lambda: nv.nvmlDeviceGetCudaComputeCapability(h))
    return GpuInfo(
        cuda_index=gpu.cuda_index,
        nvml_index=gpu.nvml_index,
        uuid=gpu.uuid,
        name=gpu.name,
        memory_total_mib=mem.total / MIB,
        memory_used_mib=mem.used / MIB,
        power_w=None if power is None else power / 1000.0,
        energy_mj=None if energy is None else int(energy),
        sm_clock_mhz=None if sm_clock is None else int(sm_clock),
        max_sm_clock_mhz=None if max_clock is None else int(max_clock),
        clock_reasons=None if mask is None else _reason_names(nv, mask),
        processes=_processes(nv, h),
        driver_version=_optional(nv, lambda: _text(nv.nvmlSystemGetDriverVersion())),
        cuda_driver_version=None if cuda_v is None else f"{cuda_v // 1000}.{cuda_v % 1000 // 10}",
        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
    )


def gpu_info(device_index: int | None = None, *, module: Any = None) -> GpuInfo | Unmeasurable:
    """VRAM, power, energy counter, clocks, clock reasons, processes and versions of a CUDA device's GPU,
    or ``Unmeasurable`` with the reason (no driver, no such device...).

    Args:
        device_index: CUDA device index as torch numbers it (``None``: the current device), never
            NVML's (see :meth:`NvmlSession.gpu`).
        module: a ``pynvml``-compatible module (default: :data:`NVML_MODULE` or ``pynvml``).
    """
    return _on_gpu(device_index, module, lambda s, gpu: s.info(gpu))


def total_energy_mj(device_index: int | None = None, *, module: Any = None) -> int | Unmeasurable:
    """CUDA device ``device_index``'s (``None``: current) total energy counter in mJ since the driver
    loaded (refreshed each 10-100 ms), or ``Unmeasurable`` (no NVML, a GPU older than Volta)."""
    return _on_gpu(device_index, module, lambda s, gpu: s.total_energy_mj(gpu))


def _power_w(nv: Any, h: Any, instant: bool) -> float:
    field_id = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
    if instant and field_id is not None:
        vals = _optional(nv, lambda: nv.nvmlDeviceGetFieldValues(h, [field_id]))
        if vals is not None and int(getattr(vals[0], "nvmlReturn", 1)) == 0:
            return float(vals[0].value.uiVal) / 1000.0
    return float(nv.nvmlDeviceGetPowerUsage(h)) / 1000.0


def power_w(device_index: int | None = None, *, instant: bool = True, module: Any = None) -> float | Unmeasurable:
    """Board power in watts of CUDA device ``device_index``'s (``None``: current) GPU, or ``Unmeasurable``.

    ``instant`` reads ``NVML_FI_DEV_POWER_INSTANT`` where the driver has it;
    ``nvmlDeviceGetPowerUsage`` is a ~1 s average on GA100 and later.
    """
    return _on_gpu(device_index, module, lambda s, gpu: s.power_w(gpu, instant=instant))


@dataclass(frozen=True, kw_only=True)
class GpuPreflight:
    """Whether a CUDA device's GPU is in a state where timing budgets can be gated."""

    ok: bool
    problems: tuple[str, ...]
    """Why not, one sentence each (another process, throttled clocks)."""
    gpu: GpuInfo


def _holds_cuda_context() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def gpu_preflight(
    device_index: int | None = None,
    *,
    own_pids: Iterable[int] | None = None,
    holds_context: bool | None = None,
    module: Any = None,
) -> GpuPreflight | Unmeasurable:
    """Check that no other process uses the GPU and that its clocks are not throttled.

    Args:
        device_index: as in :func:`gpu_info`.
        own_pids: PIDs that belong to this run (default: this process; in a container, maybe host PIDs).
        holds_context: whether this process has a CUDA context on the GPU (default: asks torch); if
            so and its PID is not listed, one PID this ``/proc`` lacks (a host PID) is taken to be it.
        module: a ``pynvml``-compatible module.
    """
    info = gpu_info(device_index, module=module)
    if isinstance(info, Unmeasurable):
        return info
    mine = set(own_pids) if own_pids is not None else {os.getpid()}
    problems = []
    if info.processes is None:
        problems.append(f"cannot list the processes using {info.label} (NVML did not answer): another may share it")
    if info.clock_reasons is None:
        problems.append(f"cannot read whether {info.label}'s clocks are throttled (NVML did not answer)")
    processes = info.processes or ()
    others = [p for p in processes if p.pid not in mine]
    note = ""
    context = holds_context if holds_context is not None else _holds_cuda_context()
    if own_pids is None and others and len(others) == len(processes) and context:
        foreign = [p for p in others if not os.path.exists(f"/proc/{p.pid}")]
        if foreign:
            others.remove(foreign[0])
            note = f" (pid {foreign[0].pid}, not in this PID namespace, was taken to be this process)"
    if others:
        listed = ", ".join(
            f"pid {p.pid} ({p.kind}"
            + (f", {p.used_mib:.0f} MiB)" if p.used_mib is not None else ")")
            for p in others
        )
        problems.append(f"other processes use {info.label}: {listed}{note}")
    throttled = [r for r in info.clock_reasons or () if r in _THROTTLING]
    if throttled:
        problems.append(f"{info.label} clocks are throttled: {', '.join(throttled)}")
    return GpuPreflight(ok=not problems, problems=tuple(problems), gpu=info)


GPM_METRICS: dict[str, str] = {
    "sm_util": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_util": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_util": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
"""Names accepted by :func:`gpm_metrics` -> the pynvml constant of the metric ID."""

# NVML rejects two GPM samples taken too close together; 100 ms is comfortably above it.
_GPM_MIN_INTERVAL_S = 0.1


@dataclass(frozen=True, kw_only=True)
class GpmMetrics:
    """Device-wide GPM metrics (Hopper and later) between two samples, each 0-100 %."""

    values_pct: dict[str, float]
    """Metric name -> percent (``sm_occupancy``: active warps vs the theoretical maximum)."""
    window_s: float
    """Seconds between the two samples."""
    padded_s: float
    """Idle seconds added to reach NVML's minimum sample spacing (dilutes the averages)."""


def _gpm_window(
    nv: Any, h: Any, s1: Any, s2: Any, run: Callable[[], Any] | None, metrics: Sequence[str]
) -> tuple[dict[str, float], float, float]:
    nv.nvmlGpmSampleGet(h, s1)
    t0 = time.perf_counter()
    if run is not None:
        run()
    elapsed = time.perf_counter() - t0
    padded = max(0.0, _GPM_MIN_INTERVAL_S - elapsed)
    if padded:
        time.sleep(padded)
    nv.nvmlGpmSampleGet(h, s2)
    window = time.perf_counter() - t0
    req = nv.c_nvmlGpmMetricsGet_t()
    req.version = nv.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(metrics)
    req.sample1 = s1
    req.sample2 = s2
    for i, m in enumerate(metrics):
        req.metrics[i].metricId = int(getattr(nv, GPM_METRICS[m]))
    nv.nvmlGpmMetricsGet(req)
    ok = int(getattr(nv, "NVML_SUCCESS", 0))
    values = {
        m: float(req.metrics[i].value)
        for i, m in enumerate(metrics)
        if int(req.metrics[i].nvmlReturn) == ok
    }
    return values, window, padded


def _gpm(nv: Any, gpu: NvmlGpu, run: Callable[[], Any] | None, metrics: Sequence[str]) -> GpmMetrics | Unmeasurable:
    if not hasattr(nv, "nvmlGpmSampleAlloc"):
        return Unmeasurable(reason="this nvidia-ml-py has no GPM API")
    support = nv.nvmlGpmQueryDeviceSupport(gpu.handle)
    if not getattr(support, "isSupportedDevice", 0):
        return Unmeasurable(reason=f"GPM is not supported on {gpu.name} (needs Hopper or later)")
    s1 = nv.nvmlGpmSampleAlloc()
    try:
        s2 = nv.nvmlGpmSampleAlloc()
        try:
            values, window, padded = _gpm_window(nv, gpu.handle, s1, s2, run, metrics)
        finally:
            nv.nvmlGpmSampleFree(s2)
    finally:
        nv.nvmlGpmSampleFree(s1)
    if not values:
        return Unmeasurable(reason=f"GPM returned no value for {list(metrics)} on {gpu.label}")
    return GpmMetrics(values_pct=values, window_s=window, padded_s=padded)


def gpm_metrics(
    run: Callable[[], Any] | None = None,
    *,
    device_index: int | None = None,
    metrics: Sequence[str] = ("sm_occupancy", "sm_util", "tensor_util"),
    module: Any = None,
) -> GpmMetrics | Unmeasurable:
    """Whole-device GPM averages (:data:`GPM_METRICS` names) over ``run()``, or ``Unmeasurable``
    (no NVML, a GPU before Hopper, MIG...).

    ``run`` (``None``: 0.1 s of whatever the device does) should be alone on the GPU, last a second
    or more and synchronize before returning. ``device_index`` as in :func:`gpu_info`.
    """
    unknown = [m for m in metrics if m not in GPM_METRICS]
    if unknown:
        raise ValueError(f"unknown GPM metric(s) {unknown}; known: {', '.join(GPM_METRICS)}")
    return _on_gpu(device_index, module, lambda s, gpu: s.gpm_metrics(gpu, run, metrics))


#: The clock-event reason bit NVML sets while the GPU has no work (``nvmlClocksEventReasonGpuIdle``).
GPU_IDLE = 0x1


@dataclass(frozen=True, kw_only=True)
class ClockSample:
    """One reading of a GPU's clocks."""

    sm_mhz: float
    mem_mhz: float
    reasons: int | None
    """The clock-event reasons bitmask (:data:`GPU_IDLE` set: no work); ``None``: unread, so unknown."""


@dataclass(frozen=True, kw_only=True)
class GpuClocks:
    """Median and mean clocks over the busy samples of a window."""

    busy: int
    """Samples kept: the GPU had work (no :data:`GPU_IDLE` bit)."""
    idle: int = 0
    """Samples left out: the GPU was idle, so its clock says nothing of the work's."""
    unknown: int = 0
    """Samples left out: NVML could not read the clock-event reasons, so nobody knows whether the GPU worked."""
    sm_median_mhz: float | None = None
    sm_mean_mhz: float | None = None
    mem_median_mhz: float | None = None
    mem_mean_mhz: float | None = None

    @classmethod
    def of(cls, samples: Sequence[ClockSample]) -> GpuClocks:
        """The busy samples' median and mean SM and memory clocks (``None`` without a busy sample)."""
        busy = [s for s in samples if s.reasons is not None and not s.reasons & GPU_IDLE]
        unknown = sum(1 for s in samples if s.reasons is None)
        idle = len(samples) - len(busy) - unknown
        if not busy:
            return cls(busy=0, idle=idle, unknown=unknown)
        sm, mem = [s.sm_mhz for s in busy], [s.mem_mhz for s in busy]
        return cls(busy=len(busy), idle=idle, unknown=unknown, sm_median_mhz=statistics.median(sm),
                   sm_mean_mhz=statistics.fmean(sm), mem_median_mhz=statistics.median(mem),
                   mem_mean_mhz=statistics.fmean(mem))

    @property
    def text(self) -> str:
        """``SM median 1980 / mean 1975.2 MHz, memory 3201 MHz (412 busy samples)``."""
        unknown = f", {self.unknown} of unknown state" if self.unknown else ""
        if self.sm_median_mhz is None or self.sm_mean_mhz is None:
            return f"no busy sample ({self.idle} idle{unknown})"
        mem = f", memory {self.mem_median_mhz:g} MHz" if self.mem_median_mhz is not None else ""
        return f"SM median {self.sm_median_mhz:g} / mean {self.sm_mean_mhz:.1f} MHz{mem} ({self.busy} busy samples{unknown})"


def read_clocks(session: NvmlSession, gpu: NvmlGpu) -> ClockSample | Unmeasurable:
    """``gpu``'s SM and memory clocks and clock-event reasons now."""
    nv = session.nv

    def read() -> ClockSample:
        sm = nv.nvmlDeviceGetClockInfo(gpu.handle, getattr(nv, "NVML_CLOCK_SM", 1))
        mem = nv.nvmlDeviceGetClockInfo(gpu.handle, getattr(nv, "NVML_CLOCK_MEM", 2))
        return ClockSample(sm_mhz=float(sm), mem_mhz=float(mem), reasons=_clock_reasons_mask(nv, gpu.handle))

    return session._guard(read)


class ClockSampler:
    """Read CUDA device ``cuda_index``'s clocks every ``interval_s`` in a background thread, each
    sample filed under what ``label()`` says then (``None``: not kept), e.g. the A/B side running.

    The GPU is found through ``CUDA_VISIBLE_DEVICES``, without starting CUDA (its context would be
    one more process on the GPU). Without NVML or that GPU it samples nothing (:attr:`unavailable`).
    """

    def __init__(self, label: Callable[[], str | None], *, interval_s: float = 0.05, cuda_index: int = 0,
                 module: Any = None) -> None:
        self.label = label
        self.interval_s = interval_s
        self.cuda_index = cuda_index
        self.module = module
        self.unavailable = ""
        self.samples: dict[str, list[ClockSample]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ClockSampler:
        """Open NVML, find the GPU and start sampling; returns ``self``."""
        opened = open_session(self.module)
        gpu = opened if isinstance(opened, Unmeasurable) else \
            opened._guard(lambda: opened._from_visible_devices(self.cuda_index))
        if isinstance(gpu, Unmeasurable):
            self.unavailable = gpu.reason
            if isinstance(opened, NvmlSession):
                opened.close()
            return self
        assert isinstance(opened, NvmlSession)
        self._thread = threading.Thread(target=self._run, args=(opened, gpu), name="perfbudget-clocks", daemon=True)
        self._thread.start()
        return self

    def sample(self, session: NvmlSession, gpu: NvmlGpu) -> None:
        """Take one sample now, filed under the current label."""
        who = self.label()
        if who is None:
            return
        got = read_clocks(session, gpu)
        if isinstance(got, ClockSample):
            self.samples.setdefault(who, []).append(got)

    def _run(self, session: NvmlSession, gpu: NvmlGpu) -> None:
        with session:
            while not self._stop.wait(self.interval_s):
                self.sample(session, gpu)

    def stop(self) -> dict[str, GpuClocks]:
        """Stop sampling; the clocks per label (none without NVML)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return {who: GpuClocks.of(xs) for who, xs in self.samples.items()}
