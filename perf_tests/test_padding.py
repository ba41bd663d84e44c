"""Padding rate of each batching strategy on skewed query lengths (exact, deterministic)."""

from __future__ import annotations

import pytest

from fixtures.data import LengthSample
from fixtures.plant import plant
from perfbudget.extras import PaddingByWidth
from perfbudget.measure.padding import padding_rate
from torchlevers import BatchPlan, plan_bucketed, plan_sorted, plan_static


def _plans(s: LengthSample) -> dict[str, BatchPlan]:
    static = plan_static(s.lengths, batch_size=s.batch_size, max_len=s.max_len)
    return {
        "static": static,
        "sorted": plan_sorted(s.lengths, batch_size=s.batch_size),
        "bucketed": static if plant().no_bucketing else plan_bucketed(s.lengths, s.buckets, batch_size=s.batch_size),
    }


def _rate(plan: BatchPlan) -> float:
    return padding_rate(plan.real_lens, plan.padded_lens)


@pytest.mark.cpu
@pytest.mark.parametrize("strategy", ["static", "sorted", "bucketed"])
@pytest.mark.budget("padding-{strategy}")
def test_padding_rate(perf, length_sample: LengthSample, strategy: str) -> None:
    plans = _plans(length_sample)
    plan = plans[strategy]
    rate = _rate(plan)
    # Padding per padded width (per bucket), for the report's plot.
    by_width = PaddingByWidth.from_batches(plan.real_lens, plan.padded_lens, sorted_rate=_rate(plans["sorted"]))
    perf.record("padding_rate", rate, extra=by_width.to_extra())
    if strategy == "bucketed":
        perf.record("ratio[bucketed_vs_sorted_padding]", rate / _rate(plans["sorted"]))
        perf.record("ratio[bucketed_vs_static_padding]", rate / _rate(plans["static"]))
