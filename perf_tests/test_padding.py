"""Padding rate of each batching strategy on skewed query lengths (exact, deterministic)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from fixtures.data import LengthSample
from fixtures.plant import plant
from torchlevers import BatchPlan, plan_bucketed, plan_sorted, plan_static


def _plans(s: LengthSample) -> dict[str, BatchPlan]:
    static = plan_static(s.lengths, batch_size=s.batch_size, max_len=s.max_len)
    return {
        "static": static,
        "sorted": plan_sorted(s.lengths, batch_size=s.batch_size),
        "bucketed": static if plant().no_bucketing else plan_bucketed(s.lengths, s.buckets, batch_size=s.batch_size),
    }


def _by_width(plan: BatchPlan, s: LengthSample) -> dict[str, float]:
    """Padding rate per padded width (per bucket), for the report's plot."""
    real: dict[int, int] = defaultdict(int)
    total: dict[int, int] = defaultdict(int)
    for batch, width in zip(plan.batches, plan.padded_lens, strict=True):
        real[width] += int(s.lengths[list(batch)].sum())
        total[width] += len(batch) * width
    return {str(w): 1 - real[w] / total[w] for w in sorted(total)}


@pytest.mark.cpu
@pytest.mark.parametrize("strategy", ["static", "sorted", "bucketed"])
@pytest.mark.budget("padding-{strategy}")
def test_padding_rate(perf, length_sample: LengthSample, strategy: str) -> None:
    plans = _plans(length_sample)
    rate = plans[strategy].padding(length_sample.lengths).padding_rate
    perf.record("padding_rate", rate, extra={"padding_by_width": _by_width(plans[strategy], length_sample)})
    if strategy == "bucketed":
        lower_bound = plans["sorted"].padding(length_sample.lengths).padding_rate
        static = plans["static"].padding(length_sample.lengths).padding_rate
        perf.record("ratio[bucketed_vs_sorted_padding]", rate / lower_bound)
        perf.record("ratio[bucketed_vs_static_padding]", rate / static)
