"""What one profiled round costs and how much its self times vary, by steps per round (one process).

``perf.operators`` takes one sample per profiled round. A round profiles a warm-up step and
``steps`` steps, then reads the profiler's events. This times rounds of 1, 2, 4 and 8 steps of
the suite's CPU encoder and segmentation steps (1 thread) and prints, per setting, the wall time
of a round and the sd of ln(self time) across rounds for the heaviest operators: whether a
round's variation shrinks with more steps (independent per step) or not (the round varies as a
whole), and what a step costs under the profiler.

Usage::

    taskset -c 1 python benchmarks/op_round_cost.py [--rounds 10] [--steps 1,2,4,8]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", default="1,2,4,8")
    args = ap.parse_args()
    import torch

    from fixtures.workloads import SIZES, SegConfig, SegWorkload, build_encoder, segmentation_clip
    from perfbudget.measure.operators.profiling import profile_rounds

    torch.set_num_threads(1)

    def segmentation():
        w = SegWorkload(SegConfig.for_size(SIZES["cpu"], device="cpu"), clip=segmentation_clip())
        batch = w.make_batch()
        return lambda: w.step(batch)

    def encoder():
        w = build_encoder("cpu")
        batch = w.make_batch()
        return lambda: w.step(batch)

    print("| workload | step, unprofiled | steps per round | wall per round | sd of ln(self time) across rounds, top operators |")
    print("|---|---|---|---|---|")
    for name, make in (("segmentation", segmentation), ("encoder", encoder)):
        step = make()
        for _ in range(3):
            step()
        t = time.perf_counter()
        step()
        step_ms = (time.perf_counter() - t) * 1e3
        for steps in (int(x) for x in args.steps.split(",")):
            t = time.perf_counter()
            rounds = profile_rounds(step, rounds=args.rounds, steps=steps)
            per_ms = (time.perf_counter() - t) / args.rounds * 1e3
            sds = [statistics.stdev([math.log(x) for x in rounds.self_ms(op)]) for op in rounds.top(0.05)[:5]]
            print(f"| {name} | {step_ms:.0f} ms | {steps} | {per_ms:.0f} ms | {', '.join(f'{s:.1%}' for s in sds)} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
