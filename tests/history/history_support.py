"""Results files of a made-up main branch, stored mode and A/B, for the history tests."""

from __future__ import annotations

import math
from collections.abc import Sequence

from perfbudget.device import DeviceInfo
from perfbudget.results import ABPolicyInfo, ABRunInfo, BaseSide, Record, Results, RunInfo
from perfbudget.vocabulary import RunMode

DEVICE = DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1, cpuid="6/207/2", isa_class="avx2")
"""A machine with an identity (``cpu-test-cpu-6-207-2-avx2``)."""
NODE = "perf_tests/test_encoder.py::test_step_latency[cpu]"


def sha(i: int) -> str:
    """A made-up full SHA for commit number ``i``."""
    return f"{i:04x}".ljust(40, "a")


def date(i: int) -> str:
    """Commit ``i``'s date: one an hour from 2026-12-01T00:00Z."""
    return f"2026-12-01T{i // 60:02d}:{i % 60:02d}:00Z"


def stored_results(step_ms: float, *, flops: float = 1e9) -> Results:
    """A stored-mode run: one timing check and one exact check."""
    return Results(meta=RunInfo(), records=[
        Record(nodeid=NODE, key="encoder-train", metric="step_ms", outcome="pass", value=step_ms,
               ci=(step_ms * 0.99, step_ms * 1.01), n=30, unit="ms", kind="timing", direction="lower", device=DEVICE),
        Record(nodeid=NODE, key="encoder-train", metric="flops", outcome="pass", value=flops, unit="flop",
               kind="exact", direction="lower", device=DEVICE),
    ])


def ab_results(head: str, base: str, pair_ratios: Sequence[float], *, step_ms: float = 40.0,
               sd: float = 0.02, df: float | None = None) -> Results:
    """An A/B run of ``head`` against ``base``: ``step_ms`` with the given per-pair head/base ratios,
    judged at per-pair sd ``sd`` on ``df`` degrees of freedom (default: the pairs' and a 3-df prior's)."""
    n = len(pair_ratios)
    mean = sum(math.log(r) for r in pair_ratios) / n
    half = 2.0 * sd / math.sqrt(n)
    base_side = BaseSide(value=step_ms / math.exp(mean), ratio=math.exp(mean),
                         ratio_ci=(math.exp(mean - half), math.exp(mean + half)), pairs=n,
                         pair_ratios=tuple(pair_ratios), tolerance=0.05, tolerance_from="default for timing", sd=sd,
                         df=3.0 + n - 1 if df is None else df, confidence=0.95)
    return Results(meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=head, base_commit=base,
                                                                policy=ABPolicyInfo(prior_df=3.0))), records=[
        Record(nodeid=NODE, key="encoder-train", metric="step_ms", outcome="pass", value=step_ms, unit="ms",
               kind="timing", direction="lower", device=DEVICE, base=base_side),
    ])
