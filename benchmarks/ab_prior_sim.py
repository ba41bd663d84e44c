"""Simulated A/B runs: how often the verdict fails, passes or ends inconclusive, with the prior
always pooled (``prior_test=0``) and set aside when the pairs contradict it (the default).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/ab_prior_sim.py [--runs 10000]``.

Each run draws per-pair log-ratios from a normal law (true head/base ratio, per-pair sd) and
follows ``.ci/run``'s schedule: at least 2 pairs, at most 4, a check decided stops, a failure
needs one pair more than the minimum (``ab/merge.py``'s confirmation rule). It uses the
real :func:`perfbudget.verdict.ratio.judge_ratios`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import random
import sys

from perfbudget.ab.ratios import PRIOR_SD, Prior
from perfbudget.verdict.ratio import PRIOR_DF, can_decide, judge_ratios

MIN_PAIRS, MAX_PAIRS = 2, 4


def one_run(true_ratio: float, sd: float, prior_test: float, rng: random.Random, *,
            prior: Prior | None = None, confidence: float = 0.95, stop_beyond_reach: bool = False) -> str:
    """One run's outcome: the flat timing prior unless ``prior`` is given; with
    ``stop_beyond_reach``, a check the pairs left cannot decide stops inconclusive (``can_decide``)."""
    prior = prior or Prior(PRIOR_SD["timing"], PRIOR_DF, "flat")
    ratios: list[float] = []
    for n in range(1, MAX_PAIRS + 1):
        ratios.append(math.exp(rng.gauss(math.log(true_ratio), sd)))
        if n < MIN_PAIRS:
            continue
        final = n == MAX_PAIRS
        rv = judge_ratios(ratios, tolerance=0.05, direction="lower", prior_sd=prior.sd, prior_df=prior.df,
                          prior_test=prior_test, confidence=confidence, final=final)
        if rv.state == "pass":
            return "pass"
        if rv.state == "fail" and n > MIN_PAIRS:
            return "fail"
        if final or (stop_beyond_reach and rv.state == "undecided" and not can_decide(rv, MAX_PAIRS - n)):
            return "inconclusive"
    return "inconclusive"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=10000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"{args.runs} simulated runs per row, pairs {MIN_PAIRS}-{MAX_PAIRS}, tolerance +5 %, prior sd 2.5 %\n")
    print("| true head/base | per-pair sd | prior | fail | pass | inconclusive |")
    print("|---|---|---|---|---|---|")
    for true_ratio in (1.0, 1.10, 1.20):
        for sd in (0.025, 0.05, 0.10, 0.20):
            for prior_test, name in ((0.0, "always pooled"), (0.01, "set aside at 1 %")):
                counts = {"fail": 0, "pass": 0, "inconclusive": 0}
                for _ in range(args.runs):
                    counts[one_run(true_ratio, sd, prior_test, rng)] += 1
                print(f"| {true_ratio:.2f} | {sd:.1%} | {name} | {counts['fail'] / args.runs:.1%} "
                      f"| {counts['pass'] / args.runs:.1%} | {counts['inconclusive'] / args.runs:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
