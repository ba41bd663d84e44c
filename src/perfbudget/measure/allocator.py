"""The process's allocator, settled before timing: glibc keeps large blocks on its heap, torch aligns them."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from perfbudget.settings import ALLOCATOR_MODES

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "environment", "settle"]

# With glibc's defaults a large block is fresh pages or reused heap by accident of the process's history,
# and one call ran at two speeds up to 3x apart (docs/measuring.md, benchmarks/large-tensors-cpu.md).

#: glibc's largest mmap threshold (``HEAP_MAX_SIZE / 2`` on 64 bits): larger values are ignored.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
_THP_SIZE, _PAGE = 2 << 20, 4096  # torch's threshold for the variable's alignment, and that alignment
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
        "THP_MEM_ALLOC_ENABLE": "1"}


def _check(mode: str) -> str:
    if mode not in ALLOCATOR_MODES:
        raise ValueError(f"allocator: expected one of {', '.join(ALLOCATOR_MODES)}, got {mode!r}")
    return mode


def environment(mode: str) -> dict[str, str]:
    """The variables a child process needs to start settled (empty for ``as-is``)."""
    return dict(_ENV) if _check(mode) == "settled" else {}


def settle(mode: str) -> str:
    """Settle this process's allocator (``mode="settled"``) and say what is in effect, read back
    where possible: ``as-is``, ``settled``, or ``settled`` followed by what could not be settled
    (``settled; glibc: not glibc``), recorded so two sides that differ are not compared."""
    if _check(mode) == "as-is":
        return "as-is"
    missing: list[str] = []
    libc = _glibc()
    if libc is None:
        missing.append("glibc: not glibc")
    elif not (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        missing.append("glibc: mallopt refused the thresholds")
    if "torch" not in sys.modules:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    elif "torch" in sys.modules and not _torch_aligns():
        missing.append("torch: large blocks unaligned (torch allocated before THP_MEM_ALLOC_ENABLE was set)")
    return "; ".join(["settled", *missing])


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (musl has mallopt as a stub and no such function)
    except (OSError, AttributeError):
        return None
    return libc


def _torch_aligns() -> bool:
    import torch

    block = torch.empty(_THP_SIZE + 64, dtype=torch.uint8)  # a heap block's offset is the heap's: 16 B steps
    return block.data_ptr() % _PAGE == 0
