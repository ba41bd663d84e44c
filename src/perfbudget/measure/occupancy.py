"""SM occupancy: duration-weighted estimate from profiler kernel events, theoretical calculator, Triton kernels."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ARCHS",
    "OCCUPANCY_KEYS",
    "AchievedOccupancy",
    "GpuArch",
    "KernelRecord",
    "TheoreticalOccupancy",
    "TritonKernelResources",
    "achieved_occupancy",
    "arch_for_capability",
    "kernel_records",
    "load_trace",
    "theoretical_occupancy",
    "triton_kernel_resources",
    "triton_occupancy",
]

# --------------------------------------------------------------------------------------------
# Architecture limits (CUDA C Programming Guide, "Compute Capabilities" table)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GpuArch:
    """Per-SM resource limits of one compute capability, as the CUDA occupancy calculator uses them."""

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


Limiter = Literal["warps", "registers", "shared_memory", "blocks"]


@dataclass(frozen=True, kw_only=True)
class TheoreticalOccupancy:
    """Occupancy one SM can reach for a launch configuration, from the calculator's formulas."""

    occupancy: float
    """Active warps / max warps per SM, 0-1."""
    active_blocks_per_sm: int
    active_warps_per_sm: int
    warps_per_block: int
    limiter: Limiter
    """The resource that caps the resident blocks (first in this order on ties)."""
    blocks_limit: Mapping[str, int]
    """Resident-block cap imposed by each resource."""
    arch: str


def theoretical_occupancy(
    *,
    threads_per_block: int,
    registers_per_thread: int,
    shared_mem_per_block_bytes: int = 0,
    arch: GpuArch | str = "sm_90",
    smem_per_sm_bytes: int | None = None,
) -> TheoreticalOccupancy:
    """Theoretical occupancy of a kernel launch, like NVIDIA's occupancy calculator.

    Per SM, the resident blocks are the minimum of four caps:

    - warps: ``max_warps_per_sm // ceil(threads / 32)``;
    - registers: ``registers_per_sm // (round_up(regs * 32, 256) * warps_per_block)``
      (registers are allocated per warp in 256-register units);
    - shared memory: ``smem_per_sm // (round_up(smem, 128) + 1 KB reserved per block)``;
    - the block cap (32 on sm_80/sm_90).

    Args:
        threads_per_block: threads of one block (``num_warps * 32`` for Triton).
        registers_per_thread: registers per thread (``n_regs``); 0 if unknown-to-be-irrelevant.
        shared_mem_per_block_bytes: static + dynamic shared memory per block.
        arch: a :class:`GpuArch` or a key of :data:`ARCHS` (``"sm_80"``, ``"sm_90"``...).
        smem_per_sm_bytes: shared-memory carve-out per SM; default the arch's largest.

    Returns:
        ``TheoreticalOccupancy``.

    Raises:
        ValueError: the configuration cannot launch (too many threads, registers or shared
            memory per block).
    """
    a = _resolve_arch(arch)
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
    smem_sm = a.smem_per_sm_bytes if smem_per_sm_bytes is None else smem_per_sm_bytes
    warps_per_block = -(-threads_per_block // a.warp_size)

    by_warps = a.max_warps_per_sm // warps_per_block
    if registers_per_thread > 0:
        regs_per_warp = _round_up(registers_per_thread * a.warp_size, a.register_alloc_unit)
        regs_per_block = regs_per_warp * warps_per_block
        if regs_per_block > a.max_registers_per_block:
            raise ValueError(
                f"{regs_per_block} registers per block exceed {a.max_registers_per_block} on {a.name}: "
                f"the launch would fail"
            )
        by_regs = a.registers_per_sm // regs_per_block
    else:
        by_regs = a.max_blocks_per_sm
    smem_block = _round_up(shared_mem_per_block_bytes, a.smem_alloc_unit_bytes)
    smem_block += a.smem_reserved_per_block_bytes
    by_smem = smem_sm // smem_block
    ordered: list[tuple[Limiter, int]] = [
        ("warps", by_warps),
        ("registers", by_regs),
        ("shared_memory", by_smem),
        ("blocks", a.max_blocks_per_sm),
    ]
    limits: dict[str, int] = dict(ordered)
    blocks = min(limits.values())
    limiter = next(k for k, v in ordered if v == blocks)
    active_warps = blocks * warps_per_block
    return TheoreticalOccupancy(
        occupancy=active_warps / a.max_warps_per_sm,
        active_blocks_per_sm=blocks,
        active_warps_per_sm=active_warps,
        warps_per_block=warps_per_block,
        limiter=limiter,
        blocks_limit=limits,
        arch=a.name,
    )


# --------------------------------------------------------------------------------------------
# Profiler kernel events
# --------------------------------------------------------------------------------------------

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
    """One GPU kernel launch from a profiler trace."""

    name: str
    duration_us: float
    occupancy_raw: float | None
    """The trace's occupancy value as written (scale not yet normalised)."""
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    block: tuple[int, ...] | None = None
    grid: tuple[int, ...] | None = None


def load_trace(trace: str | os.PathLike[str] | Mapping[str, Any] | Any) -> Mapping[str, Any]:
    """A chrome trace as a dict, from a path (``.json`` or ``.json.gz``), a dict, or a
    ``torch.profiler.profile`` object (exported to a temporary file)."""
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
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
        return tuple(int(x) for x in v)
    return None


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def kernel_records(trace: str | os.PathLike[str] | Mapping[str, Any] | Any) -> list[KernelRecord]:
    """GPU kernel launches of a chrome trace (``cat`` "kernel", any case; complete events).

    Args:
        trace: path, dict or profiler object (see :func:`load_trace`).

    Returns:
        One ``KernelRecord`` per kernel event, in trace order.
    """
    data = load_trace(trace)
    out = []
    for ev in data.get("traceEvents", []):
        if str(ev.get("cat", "")).lower() != "kernel" or ev.get("ph", "X") != "X":
            continue
        args = ev.get("args", {}) or {}
        occ = None
        for key in OCCUPANCY_KEYS:
            if key in args and args[key] is not None:
                occ = float(args[key])
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
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class AchievedOccupancy:
    """Duration-weighted estimated achieved occupancy over a trace's kernels."""

    occupancy: float | None
    """Weighted mean, 0-1; ``None`` when no kernel carries an estimate."""
    kernels: int
    kernels_with_estimate: int
    kernel_time_us: float
    """Summed duration of all kernels."""
    covered_time_us: float
    """Summed duration of the kernels with an estimate (the weights)."""
    scale: Literal["percent", "fraction"]
    """How the trace wrote the values."""
    by_kernel: Mapping[str, tuple[float, float]]
    """Kernel name -> (summed duration in us, weighted occupancy 0-1)."""

    @property
    def occupancy_pct(self) -> float | None:
        """``occupancy`` in percent."""
        return None if self.occupancy is None else self.occupancy * 100.0


def achieved_occupancy(
    trace: str | os.PathLike[str] | Mapping[str, Any] | Any | Sequence[KernelRecord],
) -> AchievedOccupancy:
    """Duration-weighted mean of the kernels' "est. achieved occupancy" of a profiler trace.

    Kineto estimates each kernel's occupancy from its launch configuration (registers,
    shared memory, block and grid size), not from hardware counters; weighting by duration
    makes the mean reflect where GPU time goes. Both key spellings are read (see
    :data:`OCCUPANCY_KEYS`). Values are percent (0-100) in kineto's output; a trace whose
    values are all <= 1 is read as fractions (0-1): as a percentage that would mean under
    one warp per SM (1/64 = 1.6 %) for every kernel, which cannot occur.

    Args:
        trace: path, dict, profiler object, or already-parsed ``KernelRecord``s.

    Returns:
        ``AchievedOccupancy``.
    """
    if (
        isinstance(trace, Sequence)
        and not isinstance(trace, (str, bytes))
        and all(isinstance(k, KernelRecord) for k in trace)
    ):
        records = list(trace)
    else:
        records = kernel_records(trace)
    with_est = [k for k in records if k.occupancy_raw is not None and k.duration_us > 0]
    raw = [k.occupancy_raw for k in with_est if k.occupancy_raw is not None]
    scale: Literal["percent", "fraction"] = "fraction" if raw and max(raw) <= 1.0 else "percent"
    div = 1.0 if scale == "fraction" else 100.0
    covered = math.fsum(k.duration_us for k in with_est)
    weighted = (
        math.fsum(k.duration_us * (k.occupancy_raw or 0.0) / div for k in with_est) / covered
        if covered > 0
        else None
    )
    per: dict[str, list[float]] = {}
    for k in with_est:
        acc = per.setdefault(k.name, [0.0, 0.0])
        acc[0] += k.duration_us
        acc[1] += k.duration_us * (k.occupancy_raw or 0.0) / div
    by_kernel = {n: (t, w / t) for n, (t, w) in sorted(per.items(), key=lambda kv: -kv[1][0])}
    return AchievedOccupancy(
        occupancy=weighted,
        kernels=len(records),
        kernels_with_estimate=len(with_est),
        kernel_time_us=math.fsum(k.duration_us for k in records),
        covered_time_us=covered,
        scale=scale,
        by_kernel=by_kernel,
    )


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


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
    """Registers, shared memory and warps of a compiled Triton kernel.

    Works without a GPU for a kernel compiled for an explicit target
    (``triton.compile(src, target=GPUTarget("cuda", 90, 32))``): registers are then read from
    the cubin with the ``cuobjdump`` bundled with Triton. On a GPU, a kernel whose handles were
    initialised carries ``n_regs`` directly.

    Args:
        kernel: a ``triton.compiler.CompiledKernel`` (e.g. ``jit_fn.warmup(...)`` or
            ``triton.compile(...)``).

    Returns:
        ``TritonKernelResources``.
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
        cubin = None
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
    """Theoretical occupancy of a compiled Triton kernel from its metadata.

    Args:
        kernel: a ``CompiledKernel`` or its :class:`TritonKernelResources`.
        arch: limits to use; default the kernel's compile target.

    Returns:
        ``TheoreticalOccupancy``, or ``None`` when the register count is unavailable.
    """
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
