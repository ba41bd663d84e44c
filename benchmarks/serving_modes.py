"""Do whole processes serve at different speeds, and does the garbage collector make them? The decoder, timed per process.

Each child process builds the tiny decoder (``torchlevers.workloads``), warms it on 8 requests,
then serves the same 32 requests in each of four windows and prints each window's median
end-to-end latency in ms (one torch thread, pinned to one CPU). Processes run one at a time. If
processes differ by more than windows inside one process do, the process's state decides its
speed (a per-process mode, what a lockstep A/B pair cannot average out within the pair).

Modes: as is; ``gc.freeze()`` after warm-up with the collector off while serving (no
collection can land inside a request, and the warm-up's objects are never scanned again).

Usage: ``python benchmarks/serving_modes.py [--processes 12] [--cpu 1]`` (a quiet machine).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import subprocess
import sys
import time

WINDOWS = 4


def child(freeze: bool) -> None:
    import torch

    from torchlevers.workloads import DecoderConfig, DecoderWorkload

    torch.set_num_threads(1)
    w = DecoderWorkload(DecoderConfig.for_size("tiny"))
    w.serve(w.requests()[:8])
    requests = w.requests()[:32]
    if freeze:
        gc.collect()
        gc.freeze()
        gc.disable()
    out = []
    for _ in range(WINDOWS):
        out.append(statistics.median(t.e2e_ms for t in w.serve(requests)))
    print(" ".join(f"{v:.4f}" for v in out))


def sd_log(xs: list[float]) -> float:
    return statistics.stdev(math.log(x) for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    ap.add_argument("--child", choices=("as-is", "freeze"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child == "freeze")
        return 0
    print("| mode | processes | process medians: min / median / max (ms) | sd between processes | "
          "sd between windows inside a process (median) |")
    print("|---|---|---|---|---|")
    t0 = time.monotonic()
    # Modes interleaved process by process, so a drift of the machine falls on both alike.
    rows: dict[str, list[list[float]]] = {"as-is": [], "freeze": []}
    for _ in range(args.processes):
        for mode in rows:
            got = subprocess.run(["taskset", "-c", str(args.cpu), sys.executable, __file__, "--child", mode],
                                 capture_output=True, text=True, check=True)
            rows[mode].append([float(v) for v in got.stdout.split()])
    for mode, windows in rows.items():
        per_process = [statistics.median(w) for w in windows]
        inside = statistics.median(sd_log(w) for w in windows)
        print(f"| {mode} | {len(windows)} | {min(per_process):.3f} / {statistics.median(per_process):.3f} / "
              f"{max(per_process):.3f} | {sd_log(per_process):.1%} | {inside:.1%} |")
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
