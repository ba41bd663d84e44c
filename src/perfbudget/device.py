"""What machine a measurement ran on, and how budget files select machines (data and parsing)."""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

__all__ = [
    "ISA_FEATURES",
    "SELECTOR_EXACT_FIELDS",
    "SELECTOR_FIELDS",
    "SELECTOR_INT_FIELDS",
    "SELECTOR_VERSION_FIELDS",
    "CpuId",
    "DeviceInfo",
    "DeviceType",
    "Selector",
    "cpu_id",
    "cpu_isa",
    "cpu_model_name",
    "device_file_stem",
    "gpu_memory_gib",
    "isa_class",
]

DeviceType = Literal["cpu", "cuda"]

#: The CPU features torch's kernels dispatch on (``torch.cpu.get_capabilities()`` names): vector width,
#: then the bf16/fp16 and matrix-engine paths that change speed and low-precision rounding.
ISA_FEATURES: tuple[str, ...] = (
    "avx2", "avx512_f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
    "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",
)


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    """One measured device and the software that drove it.

    Attributes:
        type: ``cpu`` or ``cuda``.
        model: CPU model name or GPU name (``NVIDIA H200``).
        count: visible GPUs, or logical CPUs for ``cpu``.
        compute_capability: ``"9.0"`` on GPUs, ``None`` on CPU.
        driver: NVIDIA driver version when NVML answers.
        cuda: CUDA version torch was built with.
        torch: torch version.
        triton: triton version, when installed.
        cpu_model: host CPU model (also recorded for GPU runs).
        threads: torch intra-op threads used for timing.
        vendor: CPU vendor (``GenuineIntel``, ``AuthenticAMD``) or GPU vendor (``NVIDIA``).
        cpuid: CPU ``family/model/stepping`` (``6/207/2``), unlike the model name one per generation.
        isa: :func:`cpu_isa` (``AVX512,avx512_bf16,amx_bf16``).
        isa_class: :func:`isa_class` (``amx``, ``avx2``, ...); on GPUs the SM architecture (``sm90``).
        memory_gib: GPU memory in whole GiB (:func:`gpu_memory_gib`), ``None`` on CPU.
        sm_clock_mhz: GPU maximum SM clock, when NVML answers.
    """

    type: DeviceType
    model: str
    count: int
    compute_capability: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None
    cpu_model: str = ""
    threads: int | None = None
    vendor: str | None = None
    cpuid: str | None = None
    isa: str | None = None
    isa_class: str | None = None
    memory_gib: int | None = None
    sm_clock_mhz: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        """Short human label: ``cpu Intel Xeon (1 thread)`` or ``cuda NVIDIA H200``."""
        if self.type == "cpu":
            t = f" ({self.threads} thread{'s' if self.threads != 1 else ''})" if self.threads else ""
            return f"cpu {self.model}{t}"
        return f"cuda {self.model}"

    @property
    def identity(self) -> str | None:
        """What makes two machines the same kind for timing, as one slug (``cpu-intel-xeon-processor-6-207-2-amx``,
        ``nvidia-h200-sm90-141gib-1980mhz``); ``None`` when unknown."""
        if self.type == "cpu":
            if not self.cpuid or not self.isa_class:
                return None
            parts = [self.model, self.cpuid.replace("/", "-"), self.isa_class]
        else:
            if not self.isa_class:
                return None
            parts = [self.model, self.isa_class]
            if self.memory_gib:
                parts.append(f"{self.memory_gib}gib")
            if self.sm_clock_mhz:
                parts.append(f"{self.sm_clock_mhz}mhz")
        stem = _slug(" ".join(parts))
        return stem if self.type == "cuda" else f"cpu-{stem}"

    def describe_identity(self) -> list[str]:
        """Readable lines of the identity, for ``perfbudget show``."""
        lines = [f"identity: {self.identity or 'unknown (recorded before machine identity)'}",
                 f"model: {self.model}"]
        if self.type == "cpu":
            lines += [f"vendor: {self.vendor or '?'}", f"family/model/stepping: {self.cpuid or '?'}",
                      f"ISA (torch): {self.isa or '?'}", f"ISA class: {self.isa_class or '?'}",
                      f"threads: {self.threads}"]
        else:
            lines += [f"compute capability: {self.compute_capability}", f"memory: {self.memory_gib} GiB",
                      f"max SM clock: {self.sm_clock_mhz} MHz", f"driver: {self.driver}", f"CUDA: {self.cuda}",
                      f"host CPU: {self.cpu_model}"]
        lines.append(f"torch: {self.torch}, triton: {self.triton}")
        return lines


def gpu_memory_gib(total_memory_bytes: int) -> int:
    """A GPU's memory for its identity: the total CUDA reports, in GiB, rounded up.

    Reported totals sit below a whole GiB (H200 143,771 MiB = 140.4 -> 141; H100 79.6 -> 80): rounded to the
    nearest they would sit 100-150 MiB from the .5 boundary, rounded up 0.35-0.6 GiB from either side.
    """
    gib = 2**30
    return -(-int(total_memory_bytes) // gib)


def _slug(text: str) -> str:
    slug = re.sub(r"\(r\)|\(tm\)", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "unknown"


#: Fields a budget file's ``device:`` block may name: :class:`DeviceInfo`'s and the derived ``identity``.
SELECTOR_FIELDS: tuple[str, ...] = (*(f.name for f in fields(DeviceInfo)), "identity")
#: Selector fields compared as integers, exactly; every other field is a string.
SELECTOR_INT_FIELDS: tuple[str, ...] = ("count", "threads", "memory_gib", "sm_clock_mhz")
#: String fields compared as version prefixes (``torch: "2.13"`` selects 2.13.0+cpu); the
#: remaining string fields match case-insensitively as substrings.
SELECTOR_VERSION_FIELDS: tuple[str, ...] = ("torch", "triton", "cuda", "driver", "compute_capability")
#: String fields compared whole (case-insensitively): a substring of an identity or a cpuid
#: would select other machine kinds (``6/20`` is in ``6/207``).
SELECTOR_EXACT_FIELDS: tuple[str, ...] = ("identity", "cpuid", "isa_class")


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def cpu_model_name() -> str:
    """The CPU model string from /proc/cpuinfo, falling back to ``platform.processor()``."""
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


@dataclass(frozen=True, kw_only=True)
class CpuId:
    """What /proc/cpuinfo says of the CPU beyond its marketing name."""

    vendor: str | None
    family: int | None
    model: int | None
    stepping: int | None

    @property
    def text(self) -> str | None:
        if self.family is None or self.model is None:
            return None
        return f"{self.family}/{self.model}/{self.stepping if self.stepping is not None else '?'}"


def cpu_id(cpuinfo: str | None = None) -> CpuId:
    """Vendor and family/model/stepping of the first CPU in ``/proc/cpuinfo`` (or the text given)."""
    got: dict[str, str] = {}
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if not line.strip():
            if got:
                break  # the first processor's block is enough
            continue
        name, _, value = line.partition(":")
        got.setdefault(name.strip(), value.strip())

    def number(key: str) -> int | None:
        raw = got.get(key, "")
        return int(raw) if raw.isdigit() else None

    vendor = got.get("vendor_id") or got.get("CPU implementer") or None
    return CpuId(vendor=vendor, family=number("cpu family"), model=number("model"), stepping=number("stepping"))


def cpu_isa(capabilities: dict[str, Any], capability: str) -> str:
    """``AVX512,avx512_bf16,amx_bf16``: torch's capability, then the :data:`ISA_FEATURES` present."""
    present = [f for f in ISA_FEATURES if capabilities.get(f) is True and f != capability.lower()]
    return ",".join([capability, *present])


def isa_class(isa: str) -> str:
    """The kernel-path class of an ISA string from :func:`cpu_isa`: each rounds bf16 differently."""
    feats = {f.lower() for f in isa.split(",")}
    if "amx_bf16" in feats or "amx_tile" in feats:
        return "amx"
    if "avx512_bf16" in feats:
        return "avx512_bf16"
    if "avx512" in feats or "avx512_f" in feats:
        return "avx512"
    if "avx2" in feats:
        return "avx2"
    return "default"


def device_file_stem(info: DeviceInfo) -> str:
    """File stem of a device's own budget file: its identity, else its model name."""
    if info.identity:
        return info.identity
    slug = _slug(info.model)
    return slug if info.type == "cuda" else f"cpu-{slug}"


@dataclass(frozen=True)
class Selector:
    """The ``device:`` block of a budget file: which devices its budgets apply to (see the ``SELECTOR_*`` fields)."""

    criteria: tuple[tuple[str, Any], ...]

    @property
    def specificity(self) -> int:
        return len(self.criteria)

    def matches(self, info: DeviceInfo) -> bool:
        for name, want in self.criteria:
            have = getattr(info, name)
            if have is None:
                return False
            if name in SELECTOR_EXACT_FIELDS:
                if str(want).lower() != str(have).lower():
                    return False
            elif name in SELECTOR_VERSION_FIELDS:
                if not str(have).startswith(str(want)):
                    return False
            elif isinstance(want, str):
                if want.lower() not in str(have).lower():
                    return False
            elif have != want:
                return False
        return True

    def as_dict(self) -> dict[str, Any]:
        return dict(self.criteria)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.criteria)
