"""What makes whole processes serve at different speeds? Candidate causes, one mode each, timed per process.

Each child process builds the tiny decoder (``torchlevers.workloads``), warms it, then serves the
same 32 requests in each of four windows; before each window it times a fixed reference (a small
matmul chain, allocation-free after its first call) so that the machine's own speed at that moment
is seen beside the workload's. It prints, per window, the median end-to-end latency and the
reference, plus what the kernel says about the process (CPU steal over the windows, the time it
waited runnable, involuntary switches, the anonymous memory on huge pages). Processes run one at
a time, the modes interleaved process by process so a drift of the machine falls on all alike.

Modes (issue 25, item 1; the collector, the hash seed and ASLR are measured in
``serving-modes-cpu.md`` and ``process-modes-cpu.md``):

- ``as-is``
- ``thp``: the heap and torch's large buffers on transparent huge pages
  (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, ``THP_MEM_ALLOC_ENABLE=1``): 2 MiB pages cover every
  cache colour in order, so where a buffer lands physically would stop mattering.
- ``heap-fixed``: the allocator's state made the same in every process (nothing returned to the
  kernel, nothing served by mmap below 32 MiB, the heap grown by 256 MiB up front).
- ``warm-long``: 64 warm-up requests instead of 8 (the adaptive interpreter's specialisations and
  torch's dispatcher and autograd caches settled before the first window).

Usage: ``python benchmarks/process_causes.py [--processes 10] [--cpu 1] [--modes as-is,thp]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

WINDOWS = 4
MODES: dict[str, dict[str, str]] = {
    "as-is": {},
    "thp": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "THP_MEM_ALLOC_ENABLE": "1"},
    "heap-fixed": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
                   "MALLOC_TOP_PAD_": str(256 << 20)},
    "warm-long": {},
}
WARMUP = {"warm-long": 64}


def _steal_ticks() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def _run_delay_ns() -> int:
    with open("/proc/self/schedstat") as f:
        return int(f.read().split()[1])


def _anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def child(mode: str) -> None:
    import torch

    from torchlevers.workloads import DecoderConfig, DecoderWorkload

    torch.set_num_threads(1)
    w = DecoderWorkload(DecoderConfig.for_size("tiny"))
    w.serve(w.requests(WARMUP.get(mode, 8), seed=1))
    requests = w.requests(32)
    a = torch.randn(96, 96)
    out = torch.empty(96, 96)

    def reference() -> float:
        t0 = time.perf_counter()
        for _ in range(400):
            torch.mm(a, a, out=out)
        return (time.perf_counter() - t0) * 1e3

    reference()
    steal0, delay0, ru0 = _steal_ticks(), _run_delay_ns(), resource.getrusage(resource.RUSAGE_SELF)
    windows, refs = [], []
    for _ in range(WINDOWS):
        refs.append(reference())
        windows.append(statistics.median(t.e2e_ms for t in w.serve(requests)))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "e2e_ms": windows, "ref_ms": refs,
        "steal_ticks": _steal_ticks() - steal0, "run_delay_ms": (_run_delay_ns() - delay0) / 1e6,
        "nivcsw": ru.ru_nivcsw - ru0.ru_nivcsw, "minflt": ru.ru_minflt - ru0.ru_minflt,
        "anon_huge_mib": _anon_huge_kib() / 1024,
    }))


def sd_log(xs: list[float]) -> float:
    return statistics.stdev(math.log(x) for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", help="also write every process's numbers here")
    ap.add_argument("--child", choices=tuple(MODES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    modes = args.modes.split(",")
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    t0 = time.monotonic()
    for _ in range(args.processes):
        for mode in modes:
            env = {**os.environ, **MODES[mode]}
            got = subprocess.run(["taskset", "-c", str(args.cpu), sys.executable, __file__, "--child", mode],
                                 capture_output=True, text=True, check=True, env=env)
            rows[mode].append(json.loads(got.stdout.splitlines()[-1]))
    print("| mode | processes | process medians: min / median / max (ms) | sd between processes | "
          "sd inside a process (median) | sd of e2e/reference between processes | corr(e2e, reference) | "
          "steal ticks (max) | waited runnable, ms (median) | minor faults (median) | huge pages, MiB (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, procs in rows.items():
        e2e = [statistics.median(p["e2e_ms"]) for p in procs]
        ref = [statistics.median(p["ref_ms"]) for p in procs]
        rel = [e / r for e, r in zip(e2e, ref, strict=True)]
        corr = statistics.correlation([math.log(x) for x in e2e], [math.log(x) for x in ref])
        inside = statistics.median(sd_log(p["e2e_ms"]) for p in procs)
        print(f"| {mode} | {len(procs)} | {min(e2e):.3f} / {statistics.median(e2e):.3f} / {max(e2e):.3f} | "
              f"{sd_log(e2e):.1%} | {inside:.1%} | {sd_log(rel):.1%} | {corr:+.2f} | "
              f"{max(p['steal_ticks'] for p in procs)} | {statistics.median(p['run_delay_ms'] for p in procs):.1f} | "
              f"{statistics.median(p['minflt'] for p in procs):.0f} | "
              f"{statistics.median(p['anon_huge_mib'] for p in procs):.0f} |")
    print(f"\n{time.monotonic() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"modes": {m: MODES[m] for m in modes}, "processes": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
