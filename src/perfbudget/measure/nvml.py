"""NVIDIA device state through NVML: VRAM, energy counter, power, GPM metrics, other processes, clock throttling."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "GPM_METRICS",
    "NVML_MODULE",
    "DeviceInfo",
    "GpmMetrics",
    "GpuProcess",
    "Preflight",
    "Unavailable",
    "device_info",
    "gpm_metrics",
    "power_w",
    "preflight",
    "total_energy_mj",
]

MIB = 1024 * 1024

NVML_MODULE: Any = None
"""Seam: the ``pynvml``-compatible module to use. ``None`` imports ``pynvml`` (nvidia-ml-py).
Tests set this, or pass ``module=`` to a function, to inject a fake NVML."""


@dataclass(frozen=True, kw_only=True)
class Unavailable:
    """NVML (or one of its features) cannot be used here; ``reason`` says why."""

    reason: str

    def __bool__(self) -> bool:
        return False


class _Unavailable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _module(module: Any) -> Any:
    if module is not None:
        return module
    if NVML_MODULE is not None:
        return NVML_MODULE
    try:
        import pynvml
    except ImportError as exc:
        raise _Unavailable(f"nvidia-ml-py is not installed ({exc})") from exc
    return pynvml


def _describe(exc: BaseException) -> str:
    return f"{exc} ({type(exc).__name__})"


@contextmanager
def _session(module: Any) -> Iterator[Any]:
    """``nvmlInit`` ... ``nvmlShutdown``; any NVML error becomes ``_Unavailable``."""
    nv = _module(module)
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise _Unavailable(f"NVML unavailable: {_describe(exc)}") from exc
    try:
        yield nv
    except nv.NVMLError as exc:
        raise _Unavailable(f"NVML call failed: {_describe(exc)}") from exc
    finally:
        with suppress(nv.NVMLError):
            nv.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _optional(nv: Any, fn: Callable[[], Any]) -> Any:
    """Call an NVML getter; ``None`` when this device does not support it."""
    try:
        return fn()
    except (nv.NVMLError, AttributeError):
        # AttributeError: an older nvidia-ml-py without this getter.
        return None


def _call_optional(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    return _optional(nv, lambda: fn(*args))


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
        value = _call_optional(nv, fn, handle)
        if value is not None:
            return int(value)
    return None


def _processes(nv: Any, handle: Any) -> tuple[GpuProcess, ...]:
    out: list[GpuProcess] = []
    kinds: tuple[tuple[str, Literal["compute", "graphics"]], ...] = (
        ("nvmlDeviceGetComputeRunningProcesses", "compute"),
        ("nvmlDeviceGetGraphicsRunningProcesses", "graphics"),
    )
    for getter, kind in kinds:
        fn = getattr(nv, getter, None)
        if fn is None:
            continue
        procs = _call_optional(nv, fn, handle) or []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(
                GpuProcess(pid=int(p.pid), used_mib=None if used is None else used / MIB, kind=kind)
            )
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    """State of one GPU as NVML reports it."""

    index: int
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
    clock_reasons: tuple[str, ...]
    """Active clock event reasons (e.g. ``"sw_power_cap"``, ``"gpu_idle"``)."""
    processes: tuple[GpuProcess, ...]
    driver_version: str | None
    cuda_driver_version: str | None
    """CUDA version the driver supports, e.g. ``"12.4"``."""
    compute_capability: tuple[int, int] | None


def _device_info(nv: Any, index: int) -> DeviceInfo:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    power = _optional(nv, lambda: nv.nvmlDeviceGetPowerUsage(h))
    energy = _optional(nv, lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
    clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
    sm_clock = _optional(nv, lambda: nv.nvmlDeviceGetClockInfo(h, clock_sm))
    max_clock = _optional(nv, lambda: nv.nvmlDeviceGetMaxClockInfo(h, clock_sm))
    mask = _clock_reasons_mask(nv, h)
    cuda_v = _optional(nv, lambda: nv.nvmlSystemGetCudaDriverVersion())
    cc = _optional(nv, lambda: nv.nvmlDeviceGetCudaComputeCapability(h))
    return DeviceInfo(
        index=index,
        name=_text(nv.nvmlDeviceGetName(h)),
        memory_total_mib=mem.total / MIB,
        memory_used_mib=mem.used / MIB,
        power_w=None if power is None else power / 1000.0,
        energy_mj=None if energy is None else int(energy),
        sm_clock_mhz=None if sm_clock is None else int(sm_clock),
        max_sm_clock_mhz=None if max_clock is None else int(max_clock),
        clock_reasons=() if mask is None else _reason_names(nv, mask),
        processes=_processes(nv, h),
        driver_version=_optional(nv, lambda: _text(nv.nvmlSystemGetDriverVersion())),
        cuda_driver_version=None if cuda_v is None else f"{cuda_v // 1000}.{cuda_v % 1000 // 10}",
        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
    )


def device_info(index: int = 0, *, module: Any = None) -> DeviceInfo | Unavailable:
    """VRAM, power, energy counter, clocks, clock reasons, processes and versions of GPU ``index``.

    Args:
        index: NVML device index.
        module: a ``pynvml``-compatible module (default: :data:`NVML_MODULE` or ``pynvml``).

    Returns:
        ``DeviceInfo``, or ``Unavailable`` with the reason (no driver, no such device...).
    """
    try:
        with _session(module) as nv:
            return _device_info(nv, index)
    except _Unavailable as exc:
        return Unavailable(reason=exc.reason)


def total_energy_mj(index: int = 0, *, module: Any = None) -> int | Unavailable:
    """GPU ``index``'s total energy counter in mJ since the driver loaded.

    The counter refreshes every ~10-100 ms: integrate over windows of >= 1 s (see
    ``measure.energy``).

    Returns:
        The counter, or ``Unavailable`` (no NVML, or a GPU older than Volta).
    """
    try:
        with _session(module) as nv:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            return int(nv.nvmlDeviceGetTotalEnergyConsumption(h))
    except _Unavailable as exc:
        return Unavailable(reason=exc.reason)


def power_w(index: int = 0, *, instant: bool = True, module: Any = None) -> float | Unavailable:
    """Board power of GPU ``index`` in watts.

    Args:
        instant: read the instantaneous field (``NVML_FI_DEV_POWER_INSTANT``) where the
            driver has it; ``nvmlDeviceGetPowerUsage`` is a ~1 s average on GA100 and later.

    Returns:
        Watts, or ``Unavailable``.
    """
    try:
        with _session(module) as nv:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            field = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
            if instant and field is not None:
                vals = _optional(nv, lambda: nv.nvmlDeviceGetFieldValues(h, [field]))
                if vals is not None and int(getattr(vals[0], "nvmlReturn", 1)) == 0:
                    return float(vals[0].value.uiVal) / 1000.0
            return float(nv.nvmlDeviceGetPowerUsage(h)) / 1000.0
    except _Unavailable as exc:
        return Unavailable(reason=exc.reason)


@dataclass(frozen=True, kw_only=True)
class Preflight:
    """Whether GPU ``index`` is in a state where timing budgets can be gated."""

    ok: bool
    problems: tuple[str, ...]
    """Why not, one sentence each (another process, throttled clocks)."""
    device: DeviceInfo


def preflight(
    index: int = 0, *, own_pids: Iterable[int] | None = None, module: Any = None
) -> Preflight | Unavailable:
    """Check that no other process uses the GPU and that its clocks are not throttled.

    Args:
        index: NVML device index.
        own_pids: PIDs that belong to this run (default: this process). Inside a container,
            NVML may report host PIDs: add them here if the run's own process is listed.
        module: a ``pynvml``-compatible module.

    Returns:
        ``Preflight`` (``ok`` False with the problems), or ``Unavailable``.
    """
    info = device_info(index, module=module)
    if isinstance(info, Unavailable):
        return info
    mine = set(own_pids) if own_pids is not None else {os.getpid()}
    problems = []
    others = [p for p in info.processes if p.pid not in mine]
    if others:
        listed = ", ".join(
            f"pid {p.pid} ({p.kind}"
            + (f", {p.used_mib:.0f} MiB)" if p.used_mib is not None else ")")
            for p in others
        )
        problems.append(f"other processes use GPU {index}: {listed}")
    throttled = [r for r in info.clock_reasons if r in _THROTTLING]
    if throttled:
        problems.append(f"GPU {index} clocks are throttled: {', '.join(throttled)}")
    return Preflight(ok=not problems, problems=tuple(problems), device=info)


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


def gpm_metrics(
    run: Callable[[], Any] | None = None,
    *,
    index: int = 0,
    metrics: Sequence[str] = ("sm_occupancy", "sm_util", "tensor_util"),
    module: Any = None,
) -> GpmMetrics | Unavailable:
    """Sample GPM metrics around ``run()``: SM occupancy, SM utilisation, tensor utilisation.

    Values are whole-device averages over the window, so the workload should be the only
    one on the GPU and run long enough (a second or more) to dominate the window; ``run``
    must synchronize before returning.

    Args:
        run: the workload; ``None`` samples whatever the device does for 0.1 s.
        index: NVML device index.
        metrics: names from :data:`GPM_METRICS`.
        module: a ``pynvml``-compatible module.

    Returns:
        ``GpmMetrics``, or ``Unavailable`` (no NVML, a GPU before Hopper, MIG...).
    """
    unknown = [m for m in metrics if m not in GPM_METRICS]
    if unknown:
        raise ValueError(f"unknown GPM metric(s) {unknown}; known: {', '.join(GPM_METRICS)}")
    try:
        with _session(module) as nv:
            if not hasattr(nv, "nvmlGpmSampleAlloc"):
                return Unavailable(reason="this nvidia-ml-py has no GPM API")
            h = nv.nvmlDeviceGetHandleByIndex(index)
            support = nv.nvmlGpmQueryDeviceSupport(h)
            if not getattr(support, "isSupportedDevice", 0):
                name = _text(nv.nvmlDeviceGetName(h))
                return Unavailable(reason=f"GPM is not supported on {name} (needs Hopper or later)")
            s1 = nv.nvmlGpmSampleAlloc()
            try:
                s2 = nv.nvmlGpmSampleAlloc()
                try:
                    values, window, padded = _gpm_window(nv, h, s1, s2, run, metrics)
                finally:
                    nv.nvmlGpmSampleFree(s2)
            finally:
                nv.nvmlGpmSampleFree(s1)
            if not values:
                return Unavailable(reason=f"GPM returned no value for {list(metrics)}")
            return GpmMetrics(values_pct=values, window_s=window, padded_s=padded)
    except _Unavailable as exc:
        return Unavailable(reason=exc.reason)
