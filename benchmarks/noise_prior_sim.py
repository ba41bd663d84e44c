"""Simulated A/B runs judged with the flat prior and with a measured one (``perfbudget calibrate``).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/noise_prior_sim.py [--runs 4000]``.

Each run draws per-pair log-ratios from a normal law (true head/base ratio, true per-pair sd)
and follows ``.ci/run``'s schedule: at least 2 pairs, at most 4, a decided check stops, a
failure needs a third pair, a check beyond reach (``can_decide``) stops inconclusive. The
measured prior is the calibrated sd ``s_m`` worth 12 degrees of freedom (``NOISE_DF_MAX``);
the true sd is ``f * s_m``, so ``f != 1`` is a calibration the machine no longer matches.
Uses the real :func:`perfbudget.verdict.ratio.judge_ratios` and ``can_decide``; not a test.
"""

from __future__ import annotations

import argparse
import random
import sys

from ab_prior_sim import (
    one_run,  # this folder: the same schedule, with a prior and the beyond-reach stop
)

from perfbudget.ab.ratios import NOISE_DF_MAX, PRIOR_SD, Prior
from perfbudget.verdict.ratio import PRIOR_DF, PRIOR_TEST


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    flat = Prior(PRIOR_SD["timing"], PRIOR_DF, "flat")
    print("| measured sd | true sd / measured | confidence | true ratio | flat prior: pass / fail / inconcl. "
          "| measured prior: pass / fail / inconcl. |")
    print("|---|---|---|---|---|---|")
    for s_m in (0.012, 0.025, 0.05):
        measured = Prior(s_m, NOISE_DF_MAX, "measured")
        for f in (0.7, 1.0, 1.5, 2.0):
            for conf in (0.95, 0.996):
                for true_ratio in (1.0, 1.10):
                    cells = []
                    for prior in (flat, measured):
                        out = {"pass": 0, "fail": 0, "inconclusive": 0}
                        for _ in range(args.runs):
                            out[one_run(true_ratio, f * s_m, PRIOR_TEST, rng, prior=prior, confidence=conf,
                                            stop_beyond_reach=True)] += 1
                        cells.append(" / ".join(f"{100 * out[k] / args.runs:.1f} %"
                                                for k in ("pass", "fail", "inconclusive")))
                    print(f"| {s_m:.1%} | {f:g} | {conf:.1%} | {true_ratio:g} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
