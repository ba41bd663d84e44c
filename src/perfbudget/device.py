"""What machine a measurement ran on, and how budget files select machines."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

__all__ = [
    "SELECTOR_FIELDS",
    "SELECTOR_INT_FIELDS",
    "SELECTOR_VERSION_FIELDS",
    "DeviceInfo",
    "DeviceType",
    "Selector",
    "cpu_model_name",
    "describe",
    "device_file_stem",
]

DeviceType = Literal["cpu", "cuda"]


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        """Short human label: ``cpu Intel Xeon (1 thread)`` or ``cuda NVIDIA H200``."""
        if self.type == "cpu":
            t = f" ({self.threads} thread{'s' if self.threads != 1 else ''})" if self.threads else ""
            return f"cpu {self.model}{t}"
        return f"cuda {self.model}"


#: Fields a budget file's ``device:`` block may name.
SELECTOR_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(DeviceInfo))
#: Selector fields compared as integers, exactly; every other field is a string.
SELECTOR_INT_FIELDS: tuple[str, ...] = ("count", "threads")
#: String fields compared as version prefixes (``torch: "2.13"`` selects 2.13.0+cpu); the
#: remaining string fields match case-insensitively as substrings.
SELECTOR_VERSION_FIELDS: tuple[str, ...] = ("torch", "triton", "cuda", "driver", "compute_capability")


def cpu_model_name() -> str:
    """The CPU model string from /proc/cpuinfo, falling back to ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _nvml_driver() -> str | None:
    from .measure import nvml

    got = nvml.driver_version()
    return got if isinstance(got, str) else None  # NVML absent or broken: the field stays unknown


def describe(type: DeviceType = "cpu", *, threads: int | None = 1) -> DeviceInfo:
    """Describe this machine's ``cpu`` or ``cuda`` device.

    Args:
        type: which device the measurements run on.
        threads: torch threads the timers pin (recorded for ``cpu``).

    Raises:
        RuntimeError: ``type="cuda"`` on a machine without CUDA.
    """
    import torch

    try:
        import triton

        triton_version: str | None = str(triton.__version__)
    except Exception:
        triton_version = None
    cpu = cpu_model_name()
    if type == "cpu":
        return DeviceInfo(
            type="cpu",
            model=cpu,
            count=os.cpu_count() or 1,
            torch=str(torch.__version__),
            triton=triton_version,
            cpu_model=cpu,
            threads=threads,
        )
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available on this machine")
    # The device the measurements run on: torch's current one (one per xdist worker, each
    # pinned with CUDA_VISIBLE_DEVICES), named by CUDA itself, so no NVML index is involved.
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return DeviceInfo(
        type="cuda",
        model=torch.cuda.get_device_name(index),
        count=torch.cuda.device_count(),
        compute_capability=f"{major}.{minor}",
        driver=_nvml_driver(),
        cuda=str(torch.version.cuda) if torch.version.cuda else None,
        torch=str(torch.__version__),
        triton=triton_version,
        cpu_model=cpu,
        threads=None,
    )


def device_file_stem(info: DeviceInfo) -> str:
    """File name (without .yaml) for a device's own budget file: ``nvidia-h200``, ``cpu-intel-xeon-processor``."""
    slug = re.sub(r"\(r\)|\(tm\)", "", info.model.lower())
    slug = re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "unknown"
    return slug if info.type == "cuda" else f"cpu-{slug}"


@dataclass(frozen=True)
class Selector:
    """The ``device:`` block of a budget file: which devices its budgets apply to.

    String fields match case-insensitively as substrings (``model: H200`` matches
    ``NVIDIA H200``); version fields match as prefixes (``torch: "2.13"``);
    numbers match exactly. Specificity is the number of fields named.
    """

    criteria: tuple[tuple[str, Any], ...]

    @property
    def specificity(self) -> int:
        return len(self.criteria)

    def matches(self, info: DeviceInfo) -> bool:
        for name, want in self.criteria:
            have = getattr(info, name)
            if have is None:
                return False
            if name in SELECTOR_VERSION_FIELDS:
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
