"""Verdicts against literal numbers: exact, bytes and the three-way statistical decision."""

from __future__ import annotations

import pytest

from perfbudget.budgets import Budget
from perfbudget.measure.stats import median_ci, quantile_ci
from perfbudget.verdict.judge import VerdictPolicy, decide


def budget(metric: str, value: float, tolerance: float) -> Budget:
    return Budget(key="k", metric=metric, value=value, tolerance=tolerance, source="budgets/x.yaml")


def test_median_ci_uses_order_statistics() -> None:
    # n=30, 95 %: ranks 10 and 21 (binomial table), coverage 0.9572.
    lo, hi, cov = quantile_ci(list(range(1, 31)), 0.5)
    assert (lo, hi) == (10, 21) and cov == pytest.approx(0.957226, abs=1e-6)
    # n=5 cannot reach 95 %: the full range is returned.
    assert median_ci([5, 1, 4, 2, 3]) == (1, 5)


@pytest.mark.parametrize(
    ("value", "outcome"),
    [(100, "pass"), (101, "fail"), (99, "stale")],
)
def test_exact_counts(value: float, outcome: str) -> None:
    assert decide("k", "op_count[aten::mm]", value, budget("op_count[aten::mm]", 100, 0.0)).outcome == outcome


def test_bytes_within_two_percent() -> None:
    b = budget("peak_allocated_mib[forward]", 100.0, 0.02)
    assert decide("k", "peak_allocated_mib[forward]", 102.0, b).outcome == "pass"
    assert decide("k", "peak_allocated_mib[forward]", 102.1, b).outcome == "fail"
    assert decide("k", "peak_allocated_mib[forward]", 97.9, b).outcome == "stale"


def test_a_bytes_budget_of_zero_allows_a_few_kib_not_no_byte_at_all() -> None:
    # A phase that ran and held nothing beyond the step's start measures 0 MiB; 2 % of 0 would
    # fail the first scalar (512 B on CUDA) the phase starts to keep.
    zero = budget("peak_allocated_mib[optimizer]", 0.0, 0.02)
    kib = 1 / 1024
    assert decide("k", "peak_allocated_mib[optimizer]", 0.0, zero).outcome == "pass"
    one_block = decide("k", "peak_allocated_mib[optimizer]", 512 / 2**20, zero)
    assert one_block.outcome == "pass" and one_block.limit == pytest.approx(4 * kib)
    assert decide("k", "peak_allocated_mib[optimizer]", 4 * kib, zero).outcome == "pass"
    assert decide("k", "peak_allocated_mib[optimizer]", 5 * kib, zero).outcome == "fail"
    # Small budgets get the same floor; a real activation (a 32 KiB move of a 34 KiB phase) fails.
    small = budget("peak_allocated_mib[forward]", 34 * kib, 0.02)
    assert decide("k", "peak_allocated_mib[forward]", 38 * kib, small).outcome == "pass"
    assert decide("k", "peak_allocated_mib[forward]", 66 * kib, small).outcome == "fail"
    # From 200 KiB up the relative tolerance is the wider one, as before.
    b = budget("peak_allocated_mib[forward]", 4.828, 0.02)
    assert decide("k", "peak_allocated_mib[forward]", 4.828, b).limit == pytest.approx(4.828 * 1.02)
    # The floor is in MiB: every bytes metric must be.
    from perfbudget.metrics import METRICS

    assert {m.unit for m in METRICS.values() if m.kind == "bytes"} == {"MiB"}


def test_higher_is_better_exact() -> None:
    b = budget("theoretical_occupancy[k]", 0.5, 0.0)
    assert decide("k", "theoretical_occupancy[k]", 0.25, b).outcome == "fail"
    assert decide("k", "theoretical_occupancy[k]", 0.75, b).outcome == "stale"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), [1.0, float("-inf")], []])
def test_non_finite_or_empty_measurements_are_errors(bad: object) -> None:
    v = decide("k", "step_ms", bad, budget("step_ms", 10, 0.05))  # type: ignore[arg-type]
    assert v.outcome == "error"


def test_unbudgeted_keeps_the_measurement() -> None:
    v = decide("k", "step_ms", [10.0] * 30, None)
    assert v.outcome == "unbudgeted" and v.value == 10.0 and v.n == 30


SAMPLES = [10.0 + 0.01 * i for i in range(30)]  # median 10.145, CI [10.09, 10.20]


def test_statistical_pass_when_ci_inside_limit() -> None:
    v = decide("k", "step_ms", SAMPLES, budget("step_ms", 10.0, 0.05))
    assert v.outcome == "pass" and v.ci == (10.09, 10.2) and v.limit == pytest.approx(10.5)


def test_statistical_fail_requires_confirmation() -> None:
    b = budget("step_ms", 9.0, 0.05)  # limit 9.45: the CI is entirely beyond it
    calls: list[int] = []

    def regressed() -> list[float]:
        calls.append(1)
        return SAMPLES

    v = decide("k", "step_ms", SAMPLES, b, more=regressed)
    assert v.outcome == "fail" and v.confirmed is True and len(calls) == 1 and v.n == 60

    v = decide("k", "step_ms", SAMPLES, b, more=lambda: [9.0] * 30)
    assert v.outcome == "pass" and v.confirmed is False and "confirmation" in v.reason

    v = decide("k", "step_ms", SAMPLES, b)  # no way to confirm: fail on the first measurement
    assert v.outcome == "fail" and v.confirmed is None


def test_straddling_ci_measures_more_then_decides_on_point_estimate() -> None:
    b = budget("step_ms", 10.0, 0.015)  # limit 10.15 inside the CI [10.09, 10.20]
    rounds: list[int] = []

    def more() -> list[float]:
        rounds.append(1)
        return SAMPLES

    v = decide("k", "step_ms", SAMPLES, b, more=more, policy=VerdictPolicy(max_extra_rounds=2))
    assert len(rounds) == 2 and v.rounds == 3 and v.n == 90
    assert v.outcome == "pass" and v.value == pytest.approx(10.145)
    b2 = budget("step_ms", 10.0, 0.0144)  # limit 10.144 < median 10.145
    assert decide("k", "step_ms", SAMPLES, b2, more=more).outcome == "fail"


def test_stale_when_ci_entirely_better_than_tolerance() -> None:
    v = decide("k", "step_ms", SAMPLES, budget("step_ms", 11.0, 0.05))  # stale below 10.45
    assert v.outcome == "stale"
    v = decide("k", "step_ms", SAMPLES, budget("step_ms", 10.5, 0.05))  # 9.975: CI not below
    assert v.outcome == "pass"


def test_rate_metrics_fail_when_lower() -> None:
    b = budget("throughput_samples_per_s", 1000.0, 0.05)
    v = decide("k", "throughput_samples_per_s", [900.0 + i for i in range(30)], b)
    assert v.outcome == "fail"
    v = decide("k", "throughput_samples_per_s", [1000.0 + i for i in range(30)], b)
    assert v.outcome == "pass"


def test_p90_metrics_judge_the_90th_percentile() -> None:
    xs = [float(i) for i in range(1, 101)]  # p90 = 90.1, CI ranks 84..96 at 95 %
    v = decide("k", "e2e_ms_p90", xs, budget("e2e_ms_p90", 90.0, 0.05))
    assert v.value == pytest.approx(90.1) and v.ci == (84.0, 96.0) and v.outcome == "pass"
    v = decide("k", "e2e_ms_p90", xs, budget("e2e_ms_p90", 70.0, 0.05))  # limit 73.5 < 84
    assert v.outcome == "fail"


def test_a_tail_quantile_of_too_few_samples_is_measured_more_before_it_passes() -> None:
    """Ten samples all under a p90 limit happen 35 % of the time when the true p90 is over it: their
    [min, max] holds p90 with 65 % coverage, no 95 % interval. More samples are taken, then the point
    estimate decides, and the reason says why; a failure (all ten over the limit) needs no more."""
    few = [10.0 + i * 0.1 for i in range(10)]
    calls: list[int] = []

    def more() -> list[float]:
        calls.append(1)
        return [10.0 + i * 0.1 for i in range(10)]

    b = budget("e2e_ms_p90", 11.0, 0.05)  # limit 11.55; p90 of the samples ~10.8
    v = decide("k", "e2e_ms_p90", few, b, more=more)
    assert calls and v.outcome == "pass" and v.n > len(few)
    alone = decide("k", "e2e_ms_p90", few, b)
    assert alone.outcome == "pass" and "10 samples give the interval of the 0.9 quantile only 65% coverage" in alone.reason
    assert decide("k", "e2e_ms_p90", [x + 10 for x in few], b).outcome == "fail"
    # The median of the same ten has a 95 % interval: decided at once.
    calls.clear()
    assert decide("k", "step_ms", few, budget("step_ms", 10.5, 0.05), more=more).outcome == "pass" and not calls
