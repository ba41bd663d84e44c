"""GPU work in profiler traces: the occupancy calculator, duration-weighted occupancy of kernel events from their launch parameters, device busy time per profiled step, Triton kernels."""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ARCHS",
    "OCCUPANCY_KEYS",
    "AchievedOccupancy",
    "GpuArch",
    "KernelRecord",
    "StepDeviceTime",
    "TheoreticalOccupancy",
    "TraceDevice",
    "TritonKernelResources",
    "achieved_occupancy",
    "arch_for_capability",
    "kernel_records",
    "load_trace",
    "step_device_times",
    "theoretical_occupancy",
    "trace_devices",
    "triton_kernel_resources",
    "triton_occupancy",
]


@dataclass(frozen=True, kw_only=True)
class GpuArch:
    """Per-SM limits of a compute capability (CUDA C Programming Guide, "Compute Capabilities")."""

    name: str
    """``"sm_90"`` etc."""
    max_warps_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm_bytes: int
    """Largest shared-memory carve-out per SM."""
    max_smem_per_block_bytes: int
    """Largest (opt-in) dynamic + static shared memory of one block."""
    registers_per_sm: int = 65536
    max_registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    register_alloc_unit: int = 256
    """Registers are allocated per warp in units of this many."""
    smem_alloc_unit_bytes: int = 128
    smem_reserved_per_block_bytes: int = 1024
    """Shared memory the system reserves for every resident block (sm_80 and later)."""
    max_threads_per_block: int = 1024
    warp_size: int = 32
    sub_partitions: int = 4
    """Warp schedulers per SM, each with its share of the registers (4 from sm_70 on)."""


ARCHS: Mapping[str, GpuArch] = {
    # A100
    "sm_80": GpuArch(
        name="sm_80",
        max_warps_per_sm=64,
        max_blocks_per_sm=32,
        smem_per_sm_bytes=164 * 1024,
        max_smem_per_block_bytes=163 * 1024,
    ),
    # RTX 30xx, A10, A40
    "sm_86": GpuArch(
        name="sm_86",
        max_warps_per_sm=48,
        max_blocks_per_sm=16,
        smem_per_sm_bytes=100 * 1024,
        max_smem_per_block_bytes=99 * 1024,
    ),
    # L4, L40, RTX 40xx
    "sm_89": GpuArch(
        name="sm_89",
        max_warps_per_sm=48,
        max_blocks_per_sm=24,
        smem_per_sm_bytes=100 * 1024,
        max_smem_per_block_bytes=99 * 1024,
    ),
    # H100, H200
    "sm_90": GpuArch(
        name="sm_90",
        max_warps_per_sm=64,
        max_blocks_per_sm=32,
        smem_per_sm_bytes=228 * 1024,
        max_smem_per_block_bytes=227 * 1024,
    ),
}


def arch_for_capability(major: int, minor: int = 0) -> GpuArch:
    """The :data:`ARCHS` entry of compute capability ``major.minor`` (``KeyError`` if unknown)."""
    key = f"sm_{major}{minor}"
    if key not in ARCHS:
        raise KeyError(f"no occupancy limits for {key}; known: {', '.join(ARCHS)}")
    return ARCHS[key]


def _resolve_arch(arch: GpuArch | str) -> GpuArch:
    if isinstance(arch, GpuArch):
        return arch
    key = re.sub(r"^sm_?", "sm_", arch.strip().lower())
    if key not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    return ARCHS[key]


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


Limiter = Literal["warps", "registers", "shared_memory", "blocks", "grid"]


@dataclass(frozen=True, kw_only=True)
class TheoreticalOccupancy:
    """Occupancy one SM can reach for a launch configuration, from the calculator's formulas."""

    occupancy: float
    """Resident warps / max warps per SM, 0-1; with a grid, averaged over all the GPU's SMs
    (``mean_blocks_per_sm * warps_per_block / max_warps_per_sm``)."""
    active_blocks_per_sm: int
    """Blocks resident on one SM; with a grid, on the busiest SM."""
    active_warps_per_sm: int
    """``active_blocks_per_sm * warps_per_block``."""
    warps_per_block: int
    limiter: Limiter
    """The resource with the lowest block cap (ties: warps, registers, shared_memory, blocks), or
    ``"grid"`` when the grid has fewer blocks than the resources allow on all SMs together."""
    blocks_limit: Mapping[str, int]
    """Resident-block cap imposed by each resource (and ``"grid"``: ``ceil(grid / SMs)``)."""
    arch: str
    mean_blocks_per_sm: float
    """Resident blocks averaged over all SMs: ``min(resource cap, grid / SMs)``; without a grid,
    ``active_blocks_per_sm``."""


def _check_launch(a: GpuArch, threads_per_block: int, registers_per_thread: int, shared_mem_per_block_bytes: int,
                  grid_blocks: int | None, num_sms: int | None) -> None:
    """Refuse a configuration that cannot launch on ``a``, naming the value and its bounds."""
    if grid_blocks is not None and (num_sms is None or num_sms < 1 or grid_blocks < 1):
        raise ValueError(
            f"grid_blocks needs num_sms, both >= 1; got grid_blocks={grid_blocks}, num_sms={num_sms}"
        )
    if not 1 <= threads_per_block <= a.max_threads_per_block:
        raise ValueError(
            f"threads_per_block must be in [1, {a.max_threads_per_block}], got {threads_per_block}"
        )
    if not 0 <= registers_per_thread <= a.max_registers_per_thread:
        raise ValueError(
            f"registers_per_thread must be in [0, {a.max_registers_per_thread}], got {registers_per_thread}"
        )
    if not 0 <= shared_mem_per_block_bytes <= a.max_smem_per_block_bytes:
        raise ValueError(
            f"shared_mem_per_block_bytes must be in [0, {a.max_smem_per_block_bytes}] on {a.name}, "
            f"got {shared_mem_per_block_bytes}"
        )


def _blocks_by_registers(a: GpuArch, registers_per_thread: int, warps_per_block: int) -> int:
    """Blocks per SM the register file allows (no cap from registers when they are not known: 0)."""
    if registers_per_thread > 0:
        regs_per_warp = _round_up(registers_per_thread * a.warp_size, a.register_alloc_unit)
        # The hardware checks a block's registers as if its warps filled every sub-partition alike
        # (cuda_occupancy.h, cudaOccMaxBlocksPerSMRegsLimit).
        regs_per_block = regs_per_warp * _round_up(warps_per_block, a.sub_partitions)
        if regs_per_block > a.max_registers_per_block:
            raise ValueError(
                f"{regs_per_block} registers per block exceed {a.max_registers_per_block} on {a.name}: "
                f"the launch would fail"
            )
        # Registers are allocated within each sub-partition: whole warps per sub-partition, then blocks.
        warps_by_regs = (a.registers_per_sm // a.sub_partitions) // regs_per_warp * a.sub_partitions
        return warps_by_regs // warps_per_block
    return a.max_blocks_per_sm


def theoretical_occupancy(
    *,
    threads_per_block: int,
    registers_per_thread: int,
    shared_mem_per_block_bytes: int = 0,
    arch: GpuArch | str = "sm_90",
    smem_per_sm_bytes: int | None = None,
    grid_blocks: int | None = None,
    num_sms: int | None = None,
) -> TheoreticalOccupancy:
    """Theoretical occupancy of a kernel launch, like NVIDIA's occupancy calculator.

    Per SM, the resident blocks are the least of the warp, register, shared-memory and block caps.
    With ``grid_blocks`` and ``num_sms`` the grid caps them too, and ``occupancy`` is the mean over
    all SMs, as kineto and NVML GPM count it: a grid shrinking from 132 blocks to 1 on 132 SMs reads
    132 times lower. The tail of a grid of several waves is not modelled: 1.5 waves read as full.

    Args:
        threads_per_block: threads of one block (``num_warps * 32`` for Triton).
        registers_per_thread: registers per thread (``n_regs``); 0 if unknown-to-be-irrelevant.
        shared_mem_per_block_bytes: static + dynamic shared memory per block.
        arch: a :class:`GpuArch` or a key of :data:`ARCHS` (``"sm_80"``, ``"sm_90"``...).
        smem_per_sm_bytes: shared-memory carve-out per SM; default the arch's largest.
        grid_blocks: blocks of the launch's grid (x * y * z); ``None``: a grid large enough.
        num_sms: SMs of the GPU; required with ``grid_blocks``.

    Raises:
        ValueError: the configuration cannot launch (too many threads, registers or shared
            memory per block), or ``grid_blocks`` comes without ``num_sms``.
    """
    a = _resolve_arch(arch)
    _check_launch(a, threads_per_block, registers_per_thread, shared_mem_per_block_bytes, grid_blocks, num_sms)
    smem_sm = a.smem_per_sm_bytes if smem_per_sm_bytes is None else smem_per_sm_bytes
    warps_per_block = -(-threads_per_block // a.warp_size)

    by_warps = a.max_warps_per_sm // warps_per_block
    by_regs = _blocks_by_registers(a, registers_per_thread, warps_per_block)
    smem_block = _round_up(shared_mem_per_block_bytes, a.smem_alloc_unit_bytes)
    smem_block += a.smem_reserved_per_block_bytes
    by_smem = smem_sm // smem_block
    ordered: list[tuple[Limiter, int]] = [("warps", by_warps), ("registers", by_regs), ("shared_memory", by_smem),
                                          ("blocks", a.max_blocks_per_sm)]
    resource_blocks = min(v for _, v in ordered)
    limiter: Limiter = next(k for k, v in ordered if v == resource_blocks)
    mean_blocks: float = resource_blocks
    if grid_blocks is not None and num_sms is not None:
        ordered.append(("grid", -(-grid_blocks // num_sms)))
        if grid_blocks < resource_blocks * num_sms:
            # Some SM holds fewer blocks than its resources allow: the grid, not a resource,
            # is what keeps the mean down (even where the busiest SM is full).
            mean_blocks = grid_blocks / num_sms
            limiter = "grid"
    limits: dict[str, int] = dict(ordered)
    blocks = min(limits.values())
    return TheoreticalOccupancy(
        occupancy=mean_blocks * warps_per_block / a.max_warps_per_sm,
        active_blocks_per_sm=blocks,
        active_warps_per_sm=blocks * warps_per_block,
        warps_per_block=warps_per_block,
        limiter=limiter,
        blocks_limit=limits,
        arch=a.name,
        mean_blocks_per_sm=float(mean_blocks),
    )


# Kineto renamed "theoretical occupancy %" to "est. achieved occupancy %" (kineto PR #210);
# third-party writers drop the "%". Newest spelling first.
OCCUPANCY_KEYS: tuple[str, ...] = (
    "est. achieved occupancy %",
    "est. achieved occupancy",
    "achieved occupancy %",
    "theoretical occupancy %",
    "theoretical occupancy",
)


@dataclass(frozen=True, kw_only=True)
class KernelRecord:
    """One GPU kernel launch from a profiler trace (kineto's kernel-event args)."""

    name: str
    duration_us: float
    occupancy_raw: float | None
    """The trace's own occupancy estimate as written (scale not yet normalised; kineto writes
    -100 where its calculation failed)."""
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    """Static + dynamic shared memory per block: kineto's "shared memory" is their sum."""
    block: tuple[int, ...] | None = None
    grid: tuple[int, ...] | None = None
    device: int | None = None
    """The trace's device id (the ``id`` of a ``deviceProperties`` entry)."""


def load_trace(trace: str | os.PathLike[str] | Mapping[str, Any] | Any) -> Mapping[str, Any]:
    """A chrome trace as a dict, from a path (``.json[.gz]``), a dict or a profiler object."""
    if isinstance(trace, Mapping):
        return trace
    if hasattr(trace, "export_chrome_trace"):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            trace.export_chrome_trace(path)
            return _read_json(Path(path))
    return _read_json(Path(os.fspath(trace)))


def _read_json(path: Path) -> Mapping[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    if isinstance(data, list):  # the bare-array form of the trace-event format
        return {"traceEvents": data}
    return data


def _dims(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) for x in v):
        return tuple(int(x) for x in v)
    return None


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def kernel_records(trace: str | os.PathLike[str] | Mapping[str, Any] | Any) -> list[KernelRecord]:
    """One ``KernelRecord`` per kernel launch of a chrome trace (``cat`` "kernel", any case; complete
    events), in trace order; ``trace`` as :func:`load_trace` takes it."""
    data = load_trace(trace)
    out = []
    for ev in data.get("traceEvents", []):
        if str(ev.get("cat", "")).lower() != "kernel" or ev.get("ph", "X") != "X":
            continue
        args = ev.get("args", {}) or {}
        occ = None
        for key in OCCUPANCY_KEYS:
            if key in args and args[key] is not None:
                try:
                    occ = float(args[key])
                except (TypeError, ValueError):
                    occ = None  # a non-number is no estimate; it must not stop the parse
                break
        out.append(
            KernelRecord(
                name=str(ev.get("name", "")),
                duration_us=float(ev.get("dur", 0.0)),
                occupancy_raw=occ,
                registers_per_thread=_int_or_none(args.get("registers per thread")),
                shared_memory_bytes=_int_or_none(args.get("shared memory")),
                block=_dims(args.get("block")),
                grid=_dims(args.get("grid")),
                device=_int_or_none(args.get("device")),
            )
        )
    return out


# deviceProperties key -> GpuArch field, as kineto writes them from cudaDeviceProp. Not
# "sharedMemPerBlock": the 48 KB a block gets without opting in, which makes kineto's own estimate
# read 0 for kernels that opt into more.
_DEVICE_FIELDS: Mapping[str, str] = {
    "regsPerMultiprocessor": "registers_per_sm",
    "regsPerBlock": "max_registers_per_block",
    "sharedMemPerMultiprocessor": "smem_per_sm_bytes",
    "sharedMemPerBlockOptin": "max_smem_per_block_bytes",
    "maxThreadsPerBlock": "max_threads_per_block",
    "warpSize": "warp_size",
}


@dataclass(frozen=True, kw_only=True)
class TraceDevice:
    """One GPU of a trace: its :data:`ARCHS` limits, overridden by ``deviceProperties``."""

    device_id: int
    name: str
    arch: GpuArch | None
    """``None`` when no limits are known for the device (see ``unknown_reason``)."""
    num_sms: int | None
    """``numSms``; ``None`` when the trace lacks it."""
    unknown_reason: str | None = None
    """Why ``arch`` is ``None``."""


def _positive_int(entry: Mapping[str, Any], key: str, device: Any) -> int | None:
    if key not in entry or entry[key] is None:
        return None
    v = entry[key]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(
            f"deviceProperties of device {device!r}: {key} must be a positive integer, got {v!r}"
        )
    return v


def trace_devices(
    trace: str | os.PathLike[str] | Mapping[str, Any] | Any,
) -> dict[int, TraceDevice]:
    """The trace's GPUs by device id (empty without ``deviceProperties``), with the limits occupancy
    is computed against; ``trace`` as :func:`load_trace` takes it.

    Raises:
        ValueError: a device property is not a positive integer.
    """
    data = load_trace(trace)
    out: dict[int, TraceDevice] = {}
    for i, entry in enumerate(data.get("deviceProperties", None) or []):
        if not isinstance(entry, Mapping):
            raise ValueError(f"deviceProperties[{i}] must be an object, got {entry!r}")
        dev = _int_or_none(entry.get("id", i))
        if dev is None:
            raise ValueError(
                f"deviceProperties[{i}]: id must be an integer, got {entry.get('id')!r}"
            )
        name = str(entry.get("name", ""))
        num_sms = _positive_int(entry, "numSms", dev)
        major = _int_or_none(entry.get("computeMajor"))
        minor = _int_or_none(entry.get("computeMinor"))
        base: GpuArch | str
        if "maxSharedMemoryPerMultiProcessor" in entry:
            # kineto writes this key for ROCm devices only; an MI200 reports "compute capability"
            # 9.0 (gfx90a) and must not be judged with H100 limits.
            base = f"device {dev} ({name!r}) is not a CUDA GPU"
        elif major is None or minor is None:
            base = f"device {dev} ({name!r}) has no compute capability in the trace"
        else:
            key = f"sm_{major}{minor}"
            base = ARCHS.get(key) or f"no occupancy limits for {key} (device {dev}, {name!r})"
        if isinstance(base, str):
            out[dev] = TraceDevice(device_id=dev, name=name, arch=None, num_sms=num_sms,
                                   unknown_reason=base)
            continue
        given = {field: _positive_int(entry, key, dev) for key, field in _DEVICE_FIELDS.items()}
        overrides: dict[str, Any] = {f: v for f, v in given.items() if v is not None}
        threads_per_sm = _positive_int(entry, "maxThreadsPerMultiprocessor", dev)
        if threads_per_sm is not None:
            overrides["max_warps_per_sm"] = threads_per_sm // overrides.get(
                "warp_size", base.warp_size
            )
        out[dev] = TraceDevice(
            device_id=dev, name=name, arch=replace(base, **overrides), num_sms=num_sms
        )
    return out


@dataclass(frozen=True, kw_only=True)
class AchievedOccupancy:
    """Duration-weighted SM occupancy of a trace's kernels from their launch resources (not a
    hardware-counter measurement)."""

    occupancy: float | None
    """Weighted mean, 0-1 (``sm_occupancy``); ``None`` when no kernel time could be computed."""
    kernels: int
    """Kernel events in the trace."""
    kernels_computed: int
    """Kernels whose occupancy was computed (zero-duration ones included)."""
    kernel_time_us: float
    """Summed duration of all kernels."""
    computed_time_us: float
    """Summed duration of the computed kernels (the weights)."""
    left_out_time_us: float
    """Summed duration of the kernels left out of the mean."""
    left_out: Mapping[str, tuple[int, float]]
    """Why kernels were left out -> (kernels, summed duration in us)."""
    kineto_occupancy: float | None
    """Cross-check only, never the metric: the duration-weighted mean, 0-1, of the trace's own
    valid (0-100) estimates."""
    kineto_time_us: float
    """Summed duration of the kernels in ``kineto_occupancy``."""
    kineto_scale: Literal["percent", "fraction"]
    """How the trace wrote its estimates."""
    by_kernel: Mapping[str, tuple[float, float]]
    """Kernel name -> (summed computed duration in us, weighted occupancy 0-1), longest first."""

    @property
    def left_out_fraction(self) -> float | None:
        """Share of kernel time left out, 0-1; ``None`` without kernel time."""
        return self.left_out_time_us / self.kernel_time_us if self.kernel_time_us > 0 else None

    def left_out_line(self) -> str | None:
        """One line saying how much kernel time the mean leaves out and why; ``None`` if none."""
        if not self.left_out:
            return None
        share = self.left_out_fraction
        reasons = "; ".join(
            f"{why}: {n} kernel{'' if n == 1 else 's'}, {t:.1f} us"
            for why, (n, t) in self.left_out.items()
        )
        pct = f"{share * 100:.1f} % of kernel time" if share is not None else "kernels"
        return f"sm_occupancy leaves out {pct} ({reasons})"


# Reasons a kernel is left out, as they appear in AchievedOccupancy.left_out.
_NO_REGISTERS = "no registers per thread in the trace"
_NO_SMEM = "no shared memory size in the trace"
_NO_BLOCK = "no block size in the trace"
_NO_GRID = "no grid size in the trace"
_NO_DEVICE = "no device limits (no deviceProperties for the kernel's device; pass arch and num_sms)"
_NO_SMS = "SM count unknown (no numSms), so the grid's cap cannot be applied"
_UNLAUNCHABLE = "launch outside the device limits"


def _kernel_occupancy(
    k: KernelRecord, arch: GpuArch, num_sms: int | None
) -> TheoreticalOccupancy | str:
    """The kernel's occupancy from its launch resources, or why it cannot be computed."""
    if k.registers_per_thread is None:
        return _NO_REGISTERS
    if k.shared_memory_bytes is None:
        return _NO_SMEM
    if k.block is None:
        return _NO_BLOCK
    if k.grid is None:
        return _NO_GRID
    if num_sms is None:
        return _NO_SMS
    try:
        return theoretical_occupancy(
            threads_per_block=math.prod(k.block),
            registers_per_thread=k.registers_per_thread,
            shared_mem_per_block_bytes=k.shared_memory_bytes,
            arch=arch,
            grid_blocks=math.prod(k.grid),
            num_sms=num_sms,
        )
    except ValueError:
        # The kernel ran, so the limits or the record are wrong; counting it as left out keeps
        # one odd event from hiding the rest of the trace.
        return _UNLAUNCHABLE


def _each_kernel(records: Sequence[KernelRecord], devices: Mapping[int, TraceDevice], fallback: GpuArch | None,
                 num_sms: int | None) -> tuple[list[tuple[KernelRecord, float]], dict[str, list[float]]]:
    """Each kernel's occupancy on the device it ran on (else ``fallback``), or why it has none: the
    kernels left out, as ``{why: [count, microseconds]}``."""
    computed: list[tuple[KernelRecord, float]] = []
    left_out: dict[str, list[float]] = {}
    for k in records:
        dev = devices.get(k.device) if k.device is not None else None
        if dev is None and k.device is None and len(devices) == 1:
            dev = next(iter(devices.values()))
        got: TheoreticalOccupancy | str
        if dev is not None and dev.arch is not None:
            got = _kernel_occupancy(k, dev.arch, dev.num_sms)
        elif dev is not None:
            got = dev.unknown_reason or _NO_DEVICE
        elif fallback is not None:
            got = _kernel_occupancy(k, fallback, num_sms)
        else:
            got = _NO_DEVICE
        if isinstance(got, str):
            acc = left_out.setdefault(got, [0, 0.0])
            acc[0] += 1
            acc[1] += k.duration_us
        else:
            computed.append((k, got.occupancy))
    return computed, left_out


def achieved_occupancy(
    trace: str | os.PathLike[str] | Mapping[str, Any] | Any | Sequence[KernelRecord],
    *,
    arch: GpuArch | str | None = None,
    num_sms: int | None = None,
) -> AchievedOccupancy:
    """Duration-weighted SM occupancy of a profiler trace's kernels, from launch parameters.

    Each kernel's is :func:`theoretical_occupancy` on the GPU it ran on (:func:`trace_devices`);
    those lacking a resource are counted in ``left_out``. Kineto's own estimate is only a cross-check:
    it assumes a 48 KB shared-memory limit, so kernels that opt into more (cuBLAS GEMMs) read 0.

    Args:
        trace: path, dict, profiler object, or already-parsed ``KernelRecord``s.
        arch: limits for kernels whose device the trace does not describe (a ``GpuArch`` or
            a key of :data:`ARCHS`); always needed for ``KernelRecord`` input.
        num_sms: the GPU's SM count for those kernels (the grid's cap needs it).
    """
    if (
        isinstance(trace, Sequence)
        and not isinstance(trace, (str, bytes))
        and all(isinstance(k, KernelRecord) for k in trace)
    ):
        records = list(trace)
        devices: dict[int, TraceDevice] = {}
    else:
        data = load_trace(trace)
        records = kernel_records(data)
        devices = trace_devices(data)
    fallback = _resolve_arch(arch) if arch is not None else None
    if num_sms is not None and num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")

    computed, left_out = _each_kernel(records, devices, fallback, num_sms)
    computed_time = math.fsum(k.duration_us for k, _ in computed if k.duration_us > 0)
    weighted = (
        math.fsum(k.duration_us * occ for k, occ in computed if k.duration_us > 0) / computed_time
        if computed_time > 0
        else None
    )
    per: dict[str, list[float]] = {}
    for k, occ in computed:
        if k.duration_us > 0:
            acc_k = per.setdefault(k.name, [0.0, 0.0])
            acc_k[0] += k.duration_us
            acc_k[1] += k.duration_us * occ
    by_kernel = {n: (t, w / t) for n, (t, w) in sorted(per.items(), key=lambda kv: -kv[1][0])}

    kineto, kineto_time, scale = _kineto_estimate(records)
    return AchievedOccupancy(
        occupancy=weighted,
        kernels=len(records),
        kernels_computed=len(computed),
        kernel_time_us=math.fsum(k.duration_us for k in records),
        computed_time_us=computed_time,
        left_out_time_us=math.fsum(t for _, t in left_out.values()),
        left_out={why: (int(n), t) for why, (n, t) in left_out.items()},
        kineto_occupancy=kineto,
        kineto_time_us=kineto_time,
        kineto_scale=scale,
        by_kernel=by_kernel,
    )


def _kineto_estimate(
    records: Sequence[KernelRecord],
) -> tuple[float | None, float, Literal["percent", "fraction"]]:
    """(duration-weighted mean 0-1, weighted time in us, scale) of the trace's own estimates.

    Only 0-100 counts (kineto writes -100 on failure); valid values all <= 1 with a fractional one
    are fractions, as some third-party writers produce (kineto writes integer percent)."""
    valid = [
        k
        for k in records
        if k.occupancy_raw is not None
        and math.isfinite(k.occupancy_raw)
        and 0.0 <= k.occupancy_raw <= 100.0
        and k.duration_us > 0
    ]
    raw = [k.occupancy_raw for k in valid if k.occupancy_raw is not None]
    fraction = bool(raw) and max(raw) <= 1.0 and any(not float(v).is_integer() for v in raw)
    scale: Literal["percent", "fraction"] = "fraction" if fraction else "percent"
    div = 1.0 if fraction else 100.0
    time_us = math.fsum(k.duration_us for k in valid)
    if time_us <= 0:
        return None, 0.0, scale
    mean = math.fsum(k.duration_us * (k.occupancy_raw or 0.0) / div for k in valid) / time_us
    return mean, time_us, scale


#: Device activity that is work, by kineto's category (``libkineto/src/ActivityType.cpp``; older
#: traces wrote "Kernel", "Memcpy", "Memset"). ``gpu_user_annotation`` spans are ranges drawn on the
#: device timeline (a ``ProfilerStep#N`` among them), not work.
_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
#: Host calls that launch device work and carry its correlation id: the runtime API
#: (``cudaLaunchKernel``, ``cudaMemcpyAsync``) and the driver API (Triton's ``cuLaunchKernelEx``).
_LAUNCHES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})


@dataclass(frozen=True, kw_only=True)
class StepDeviceTime:
    """Device busy time of a profiled step (``ProfilerStep#N``), as Holistic Trace Analysis counts it:
    kernels, copies and fills on every stream are work, device-side annotations are not."""

    step: str
    """The profiler's step name (``ProfilerStep#3``)."""
    busy_ms: float
    """Union of the step's device intervals across streams, ms (the metric ``step_device_ms``)."""
    summed_ms: float
    """Summed duration of the step's device events, ms (overlaps counted each time)."""
    kernels: int
    copies: int
    """memcpy and memset events."""


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, start, end = 0.0, 0.0, -math.inf
    for s, e in sorted(intervals):
        if s > end:
            total += max(end - start, 0.0)
            start, end = s, e
        else:
            end = max(end, e)
    return total + max(end - start, 0.0)


def step_device_times(trace: str | os.PathLike[str] | Mapping[str, Any] | Any) -> list[StepDeviceTime]:
    """One :class:`StepDeviceTime` per ``ProfilerStep#N`` range of a chrome trace, in time order.

    A device event belongs to the step whose range holds the host call that launched it (by
    correlation id; device work lags its launch), else its own start; others are dropped.
    ``trace`` as :func:`load_trace` takes it.
    """
    events = [ev for ev in load_trace(trace).get("traceEvents", []) if ev.get("ph", "X") == "X"]
    steps: dict[str, tuple[float, float]] = {}
    launched: dict[Any, float] = {}
    work: list[Mapping[str, Any]] = []
    for ev in events:
        cat, name = str(ev.get("cat", "")).lower(), str(ev.get("name", ""))
        if cat in _DEVICE_WORK:
            work.append(ev)
        elif cat in _LAUNCHES and (corr := (ev.get("args") or {}).get("correlation")) is not None:
            launched[corr] = float(ev.get("ts", 0.0))
        elif name.startswith("ProfilerStep#") and cat in ("user_annotation", "cpu_op") and name not in steps:
            ts = float(ev.get("ts", 0.0))
            steps[name] = (ts, ts + float(ev.get("dur", 0.0)))
    order = sorted(steps.items(), key=lambda kv: kv[1][0])
    starts = [start for _, (start, _) in order]
    per: list[list[Mapping[str, Any]]] = [[] for _ in order]
    for ev in work:
        start = float(ev.get("ts", 0.0))
        at = launched.get((ev.get("args") or {}).get("correlation"), start)
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at < order[i][1][1]:
            per[i].append(ev)
    out = []
    for (name, _), evs in zip(order, per, strict=True):
        spans = [(float(ev.get("ts", 0.0)), float(ev.get("ts", 0.0)) + float(ev.get("dur", 0.0))) for ev in evs]
        kernels = sum(1 for ev in evs if str(ev.get("cat", "")).lower() == "kernel")
        out.append(StepDeviceTime(step=name, busy_ms=_union_us(spans) / 1e3,
                                  summed_ms=math.fsum(e - s for s, e in spans) / 1e3,
                                  kernels=kernels, copies=len(evs) - kernels))
    return out


@dataclass(frozen=True, kw_only=True)
class TritonKernelResources:
    """Launch resources of one compiled Triton kernel."""

    name: str
    num_warps: int
    shared_bytes: int
    """Dynamic shared memory per block (``metadata.shared``)."""
    registers_per_thread: int | None
    """``n_regs`` from the driver, else read from the cubin with ``cuobjdump``; ``None`` if neither."""
    local_bytes: int | None
    """Per-thread local memory (register spills and local arrays) from the cubin."""
    arch: str | None
    """``"sm_90"`` etc. from the compile target."""
    registers_source: Literal["driver", "cuobjdump", "unavailable"]


_RESOURCE_RE = re.compile(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)")


def _cuobjdump_path() -> str | None:
    try:
        import triton

        tool = getattr(getattr(getattr(triton, "knobs", None), "nvidia", None), "cuobjdump", None)
        path = getattr(tool, "path", None)
        if path and os.path.exists(path):
            return str(path)
    except Exception:
        # Any failure here only means "no bundled tool": fall back to PATH.
        pass
    return shutil.which("cuobjdump")


def _cubin_resources(cubin: bytes, kernel_name: str) -> tuple[int, int] | None:
    """(registers, local bytes) of ``kernel_name`` in a cubin, via ``cuobjdump --dump-resource-usage``."""
    tool = _cuobjdump_path()
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        Path(path).write_bytes(cubin)
        try:
            out = subprocess.run(
                [tool, "--dump-resource-usage", path],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    return _parse_resource_usage(out, kernel_name)


def _parse_resource_usage(text: str, kernel_name: str) -> tuple[int, int] | None:
    """Parse ``cuobjdump --dump-resource-usage`` output for one function."""
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Function "):
            current = stripped[len("Function ") :].rstrip(":")
            continue
        m = _RESOURCE_RE.search(stripped)
        if m and current == kernel_name:
            return int(m.group(1)), int(m.group(3))
    return None


def triton_kernel_resources(kernel: Any) -> TritonKernelResources:
    """Registers, shared memory and warps of a ``triton.compiler.CompiledKernel``.

    On a GPU the kernel carries ``n_regs``; without one (an explicit ``GPUTarget``) registers are
    read from the cubin with Triton's bundled ``cuobjdump``.
    """
    md = kernel.metadata
    name = str(getattr(kernel, "name", getattr(md, "name", "")))
    target = getattr(md, "target", None)
    arch_num = getattr(target, "arch", None)
    arch = f"sm_{arch_num}" if isinstance(arch_num, int) else None
    regs = getattr(kernel, "n_regs", None)
    local = None
    source: Literal["driver", "cuobjdump", "unavailable"] = "unavailable"
    if isinstance(regs, int) and regs > 0:
        source = "driver"
    else:
        regs = None
        try:
            cubin = kernel.asm["cubin"]
        except (KeyError, TypeError, AttributeError):
            cubin = None
        if isinstance(cubin, (bytes, bytearray)):
            found = _cubin_resources(bytes(cubin), name)
            if found is not None:
                regs, local = found
                source = "cuobjdump"
    return TritonKernelResources(
        name=name,
        num_warps=int(md.num_warps),
        shared_bytes=int(getattr(md, "shared", 0) or 0),
        registers_per_thread=regs,
        local_bytes=local,
        arch=arch,
        registers_source=source,
    )


def triton_occupancy(
    kernel: Any | TritonKernelResources, *, arch: GpuArch | str | None = None
) -> TheoreticalOccupancy | None:
    """Theoretical occupancy of a ``CompiledKernel`` (or its :class:`TritonKernelResources`) under
    ``arch`` (default its compile target); ``None`` when the register count is unavailable."""
    res = kernel if isinstance(kernel, TritonKernelResources) else triton_kernel_resources(kernel)
    if res.registers_per_thread is None:
        return None
    use = arch if arch is not None else (res.arch or "sm_90")
    return theoretical_occupancy(
        threads_per_block=res.num_warps * 32,
        registers_per_thread=res.registers_per_thread,
        shared_mem_per_block_bytes=res.shared_bytes,
        arch=use,
    )
