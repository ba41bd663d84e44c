"""A fresh draw of physical memory placement for each process of a lockstep A/B run."""

from __future__ import annotations

import mmap
import random

__all__ = ["MAX_SHIFT_MIB", "PAGE", "shift"]

PAGE = mmap.PAGESIZE
MAX_SHIFT_MIB = 16
"""Upper bound of the shift: above the last-level cache's colour span of 4 KiB pages."""

# A small step's speed follows where its memory lands (page colours); consecutive processes get their pages
# in much the same order, so every pair of a run would share one placement (benchmarks/ab-gate-small-cpu.md).
# As Stabilizer (ASPLOS 2013) does, each process draws its own, and the pairs' spread shows it.
_held: list[mmap.mmap] = []  # the pages stay taken for the life of the process


def shift(*, max_mib: int = MAX_SHIFT_MIB, rng: random.Random | None = None) -> int:
    """Take and touch a random number of pages (up to ``max_mib`` MiB, drawn from ``rng``, default the
    OS's entropy), kept until the process ends; returns how many (0 is a possible draw)."""
    pages = (rng or random.SystemRandom()).randrange(0, max_mib * (1 << 20) // PAGE + 1)
    if pages:
        buf = mmap.mmap(-1, pages * PAGE)
        for offset in range(0, pages * PAGE, PAGE):
            buf[offset] = 1  # touched: the kernel backs it with a physical page now
        _held.append(buf)
    return pages
