"""Does a process's speed depend on its memory layout or hash seed? A pure-Python step, timed per process.

Each process times ``spin(6000)`` (the fake side's step in ``tests/ab``) for 90 ms windows, five
windows in a row, pinned to one CPU, and prints each window's median in ms. Modes: as is,
``PYTHONHASHSEED=0``, ASLR off (``setarch -R``), both. If whole processes differed by their
layout or seed, fixing them would shrink the spread between processes; if the machine's speed
moves on its own, windows inside one process differ as much as processes do.

Usage: ``python benchmarks/process_modes.py [--processes 16] [--cpu 1]`` (a quiet machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

WINDOWS = 5


def spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def child() -> None:
    out = []
    for _ in range(WINDOWS):
        samples = []
        end = time.monotonic() + 0.09
        while time.monotonic() < end:
            t = time.perf_counter()
            spin(6000)
            samples.append((time.perf_counter() - t) * 1e3)
        out.append(statistics.median(samples))
    print(" ".join(f"{v:.4f}" for v in out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=16)
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    modes = {"as is": ([], {}), "PYTHONHASHSEED=0": ([], {"PYTHONHASHSEED": "0"}),
             "ASLR off": (["setarch", "-R"], {}), "both": (["setarch", "-R"], {"PYTHONHASHSEED": "0"})}
    print("| mode | processes | first window: min / median / max (ms) | sd between processes | "
          "sd between windows inside a process (median) |")
    print("|---|---|---|---|---|")
    for name, (prefix, extra) in modes.items():
        rows = []
        for _ in range(args.processes):
            cmd = [*prefix, "taskset", "-c", str(args.cpu), sys.executable, __file__, "--child"]
            got = subprocess.run(cmd, env={**os.environ, **extra}, capture_output=True, text=True, check=True)
            rows.append([float(v) for v in got.stdout.split()])
        firsts = [r[0] for r in rows]
        med = statistics.median(firsts)
        within = statistics.median(statistics.stdev(r) / statistics.median(r) for r in rows)
        print(f"| {name} | {len(rows)} | {min(firsts):.4f} / {med:.4f} / {max(firsts):.4f} | "
              f"{statistics.stdev(firsts) / med:.1%} | {within:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
