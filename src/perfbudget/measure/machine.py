"""Describe the device measurements run on (a ``DeviceInfo``) from torch, /proc/cpuinfo and NVML."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import TextIO

from perfbudget.device import (
    DeviceInfo,
    DeviceType,
    cpu_id,
    cpu_isa,
    cpu_model_name,
    gpu_memory_gib,
    isa_class,
)
from perfbudget.measure import nvml

__all__ = ["describe", "trusted_identities"]


def _torch_isa() -> str | None:
    import torch

    try:
        caps = dict(torch.cpu.get_capabilities())
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an older torch, or a platform without cpuinfo: the ISA stays unknown
        return None
    return cpu_isa(caps, capability)


def _nvml_driver() -> str | None:
    got = nvml.driver_version()
    return got if isinstance(got, str) else None  # NVML absent or broken: the field stays unknown


def _nvml_max_sm_clock() -> int | None:
    got = nvml.max_sm_clock_mhz()
    return got if isinstance(got, int) else None  # NVML absent or broken: the field stays unknown


def describe(type: DeviceType = "cpu", *, threads: int | None = 1) -> DeviceInfo:
    """Describe this machine's ``cpu`` or ``cuda`` device (``threads``: those the timers pin, recorded
    for ``cpu``); ``RuntimeError`` for ``cuda`` on a machine without CUDA."""
    import torch

    try:
        import triton

        triton_version: str | None = str(triton.__version__)
    except Exception:
        triton_version = None
    cpu = cpu_model_name()
    ident = cpu_id()
    isa = _torch_isa()
    if type == "cpu":
        return DeviceInfo(
            type="cpu",
            model=cpu,
            count=os.cpu_count() or 1,
            torch=str(torch.__version__),
            triton=triton_version,
            cpu_model=cpu,
            threads=threads,
            vendor=ident.vendor,
            cpuid=ident.text,
            isa=isa,
            isa_class=isa_class(isa) if isa else None,
        )
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available on this machine")
    # The device the measurements run on: torch's current one (one per xdist worker, each
    # pinned with CUDA_VISIBLE_DEVICES), named by CUDA itself, so no NVML index is involved.
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    props = torch.cuda.get_device_properties(index)
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
        vendor="NVIDIA",
        cpuid=ident.text,
        isa=isa,
        isa_class=f"sm{major}{minor}",
        memory_gib=gpu_memory_gib(props.total_memory),
        sm_clock_mhz=_nvml_max_sm_clock(),
    )


def trusted_identities(claimed: Mapping[str, DeviceType], *, trust_claims: bool, out: TextIO) -> frozenset[str]:
    """Of the machine identities results claim (``identity -> device type``), those whose timing and noise
    may be written (``perfbudget accept``, ``calibrate``), each printed to ``out`` with its grounds: every
    claim under ``trust_claims`` (``--trust-identity``), else only this machine's own where claimed."""
    # A results file cannot prove where it ran; what this runner's own job produced carries its identity.
    if trust_claims:
        trusted, how = frozenset(claimed), "--trust-identity: the results' claim"
    else:
        own = set()
        for device_type in set(claimed.values()):
            with contextlib.suppress(RuntimeError):  # no such device here: none of its claims
                own.add(describe(device_type).identity)
        trusted, how = frozenset(set(claimed) & own), "this machine's own identity"
    for identity in sorted(trusted):
        out.write(f"trusted machine identity {identity} ({how})\n")
    return trusted
