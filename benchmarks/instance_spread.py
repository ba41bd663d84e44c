"""Do identical model instances in one process run at different speeds? Memory placement, isolated from the machine's drift.

An A/A pair's two sides alternate in 0.4 s turns, yet inside one test all operators of one side
move together (``burst-length-cpu.md``: a segmentation pair read 1.06-1.23 on every operator,
the next 0.87-0.95), and the two tests of one pair disagree: an offset set per *test*, as if by
where that test's tensors landed. Here one process builds K instances of the same workload (same
seed, same data: only their memory differs) and times them round-robin, a few steps each, for
many rounds, so the machine's drift falls on all instances alike. If the instances' medians
differ by more than the rounds' sampling noise allows (the split-half check: instance medians of
odd rounds against even rounds), the placement of a model's tensors sets its speed.

Modes: ``as-is``; ``thp`` (the heap and torch's large buffers on transparent huge pages:
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, ``THP_MEM_ALLOC_ENABLE=1``).

Usage: ``python benchmarks/instance_spread.py [--processes 3] [--instances 6] [--cpu 1]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

MODES = {"as-is": {}, "thp": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "THP_MEM_ALLOC_ENABLE": "1"}}
ROUNDS = 24
STEPS = 4


def child(workload: str, instances: int) -> None:
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    torch.set_num_threads(1)
    steps = []
    for _ in range(instances):
        if workload == "encoder":
            from fixtures.workloads import build_encoder

            w = build_encoder("cpu")
            batch = w.make_batch()
            steps.append(lambda w=w, b=batch: w.step(b))
        else:
            from torchlevers.workloads import SegConfig, SegWorkload

            w = SegWorkload(SegConfig.for_size("tiny"))
            batch = w.make_batch()
            steps.append(lambda w=w, b=batch: w.step(b))
        for _ in range(3):
            steps[-1]()
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(ROUNDS):
        for i, step in enumerate(steps):
            step()  # re-warm after the other instances
            for _ in range(STEPS):
                t0 = time.perf_counter()
                step()
                times[i].append((time.perf_counter() - t0) * 1e3)
    print(json.dumps(times))


def spread(times: list[list[float]]) -> tuple[float, float]:
    """sd of ln(instance median) between instances, and the same from split halves' differences."""
    med = [math.log(statistics.median(t)) for t in times]
    halves = []
    for t in times:
        odd = [x for k, x in enumerate(t) if (k // STEPS) % 2]
        even = [x for k, x in enumerate(t) if not (k // STEPS) % 2]
        halves.append(math.log(statistics.median(odd)) - math.log(statistics.median(even)))
    # A half's median has twice the variance of the whole's; their difference four times.
    noise = math.sqrt(statistics.fmean(h * h for h in halves)) / 2
    return statistics.stdev(med), noise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--instances", type=int, default=6)
    ap.add_argument("--workloads", default="encoder,segmentation")
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    ap.add_argument("--json", help="also write every step time here")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    t0 = time.monotonic()
    out: dict[str, dict[str, list]] = {}
    print("| workload | mode | process | instance medians, ms (min / max) | sd between instances | "
          "sd expected from sampling | ratio |")
    print("|---|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        for p in range(args.processes):
            for mode, env in MODES.items():
                got = subprocess.run(["taskset", "-c", str(args.cpu), sys.executable, __file__, "--child", workload,
                                      str(args.instances)], capture_output=True, text=True, check=True,
                                     env={**os.environ, **env})
                times = json.loads(got.stdout.splitlines()[-1])
                out.setdefault(workload, {}).setdefault(mode, []).append(times)
                between, noise = spread(times)
                meds = [statistics.median(t) for t in times]
                print(f"| {workload} | {mode} | {p + 1} | {min(meds):.2f} / {max(meds):.2f} | {between:.1%} | "
                      f"{noise:.1%} | {between / noise:.1f} |", flush=True)
    print(f"\n{time.monotonic() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
