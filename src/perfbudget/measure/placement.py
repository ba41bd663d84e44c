"""A fresh draw of physical memory placement for each process of a lockstep A/B run.

On these VMs a small step's speed depends on where its memory lands (page colours in the
physically indexed caches; backing the heap with transparent huge pages moved the tiny MLP's
step by 10-20 % with the order in which the two sides allocated). Without intervention, the
processes of consecutive pairs get their pages back from the kernel's free lists in much the
same order, so every pair of one run shares one placement: the pairs agree with each other,
their interval is narrow, and the whole run sits at an offset no pair can show (an A/A of the
tiny MLP read head/base 1.17, CI 1.12-1.23, on three pairs: benchmarks/ab-gate-small-cpu.md).

The remedy is Stabilizer's (Curtsinger & Berger, ASPLOS 2013): randomise the layout in every
process, so that placement is a fresh draw per pair, its effect becomes part of the pair-to-
pair spread the verdict sees, and the interval widens honestly instead of missing it. Here a
side holds a random number of freshly touched pages (0 to 16 MiB) before it builds anything,
which shifts every later allocation's physical pages.
"""

from __future__ import annotations

import mmap
import random

__all__ = ["MAX_SHIFT_MIB", "PAGE", "shift"]

PAGE = mmap.PAGESIZE
MAX_SHIFT_MIB = 16
"""Upper bound of the shift: above the last-level cache's colour span of 4 KiB pages."""

_held: list[mmap.mmap] = []  # the pages stay taken for the life of the process


def shift(*, max_mib: int = MAX_SHIFT_MIB, rng: random.Random | None = None) -> int:
    """Take and touch a random number of pages, kept until the process ends.

    Args:
        max_mib: the largest shift, in MiB.
        rng: the source of the draw (default: the operating system's entropy).

    Returns:
        The number of pages taken (0 is a possible draw).
    """
    pages = (rng or random.SystemRandom()).randrange(0, max_mib * (1 << 20) // PAGE + 1)
    if pages:
        buf = mmap.mmap(-1, pages * PAGE)
        for offset in range(0, pages * PAGE, PAGE):
            buf[offset] = 1  # touched: the kernel backs it with a physical page now
        _held.append(buf)
    return pages
