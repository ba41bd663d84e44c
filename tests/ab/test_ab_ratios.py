"""The A/B verdict on literal numbers: pooled CIs over process pairs, three-way decisions (the t and chi^2
quantiles: tests/measure/test_stats.py)."""

from __future__ import annotations

import math

import pytest

from perfbudget.ab.ratios import (
    PRIOR_SD,
    ABPolicy,
    describe_change,
)
from perfbudget.metrics import Direction
from perfbudget.verdict.ratio import (
    PRIOR_DF,
    RatioVerdict,
    detectable_effect,
    judge_ratios,
    pair_ratio,
)
from perfbudget.verdict.rule import family_confidence


def test_defaults_are_the_documented_constants() -> None:
    assert dict(PRIOR_SD) == {"timing": 0.025, "rate": 0.025, "energy": 0.05} and PRIOR_DF == 3.0
    policy = ABPolicy()
    assert policy.confidence == 0.95 and policy.sd_for("timing") == 0.025 and policy.sd_for("other") == 0.05


def judge(rs: list[float], *, tol: float = 0.05, direction: Direction = "lower", final: bool = False) -> RatioVerdict:
    return judge_ratios(rs, tolerance=tol, direction=direction, prior_sd=0.025, final=final)


def test_lockstep_aa_of_the_encoder_passes() -> None:
    # The five lockstep A/A pairs measured for the encoder step (gate-measurements §3).
    v = judge([0.994, 0.998, 1.003, 1.031, 0.987])
    assert v.state == "pass" and not v.improved
    assert v.ratio == pytest.approx(1.00249, abs=1e-5) and v.df == 7.0
    assert v.ci == pytest.approx((0.98079, 1.02466), abs=1e-5) and v.sd == pytest.approx(0.02069, abs=1e-5)
    assert "within the tolerance +5 %" in v.reason and "5 pairs" in v.reason


def test_a_ten_percent_plant_fails_at_three_pairs_and_is_undecided_at_two() -> None:
    # The +10 % encoder plant as measured: 1.125, 1.069, 1.114.
    two = judge([1.125, 1.069])
    assert two.state == "undecided" and two.ci == pytest.approx((1.0376, 1.15904), abs=1e-5)
    three = judge([1.125, 1.069, 1.114])
    assert three.state == "fail" and three.ratio == pytest.approx(1.1024, abs=1e-4)
    assert three.ci == pytest.approx((1.06089, 1.14553), abs=1e-5) and three.limit == pytest.approx(1.05)
    assert "entirely beyond the tolerance +5 %" in three.reason


def test_two_clean_pairs_suffice_for_an_aa_but_one_does_not() -> None:
    assert judge([1.0, 1.0]).state == "pass"
    assert judge([1.01, 0.99]).ci == pytest.approx((0.95622, 1.04568), abs=1e-5)
    assert judge([1.02]).state == "undecided"  # one pair: the prior alone gives t(3)
    with pytest.raises(ValueError, match="one pair needs a prior"):
        judge_ratios([1.02], tolerance=0.05, direction="lower", prior_sd=0.025, prior_df=0)


def test_straddling_at_the_last_pair_is_inconclusive_whatever_the_estimate() -> None:
    # The +5 % plant as measured (1.015, 1.037, 1.061): mean +3.7 % against a 5 % tolerance.
    assert judge([1.015, 1.037, 1.061]).state == "undecided"
    within = judge([1.015, 1.037, 1.061], final=True)
    beyond = judge([1.03, 1.09, 1.05], final=True)  # the estimate is beyond the tolerance: still no guess
    for last in (within, beyond):
        assert last.state == "inconclusive" and "inconclusive, not decided on the estimate" in last.reason
        assert f"this run could resolve changes beyond +{last.mde * 100:.3g} %" in last.reason
    # s_p = 0.023907 on 5 df: h = 2.5706 * 0.023907 / sqrt(3) = 0.035482.
    assert within.sd == pytest.approx(0.023907, abs=1e-6)
    assert within.mde == pytest.approx(1.05 * math.exp(0.035482) - 1, abs=1e-5)
    assert within.mde == pytest.approx(0.08792, abs=1e-5)


def test_every_verdict_carries_its_minimum_detectable_effect() -> None:
    # Two clean pairs: s_p^2 = 3 * 0.025^2 / 4, t(0.975, 4) = 2.7764: h = 2.7764 * 0.021651 / sqrt(2).
    v = judge([1.0, 1.0])
    h = 2.7764451 * math.sqrt(3 * 0.025**2 / 4) / math.sqrt(2)
    assert v.state == "pass" and v.mde == pytest.approx(1.05 * math.exp(h) - 1, rel=1e-6)
    assert v.mde == pytest.approx(0.09559, abs=1e-5) and "could resolve changes beyond +9.56 %" in v.reason
    # The mde is the boundary: a ratio just past it fails, just under it does not.
    assert judge([1.0 + v.mde + 1e-6] * 2).state == "fail"
    assert judge([1.0 + v.mde - 1e-4] * 2).state == "undecided"
    # Rates: the smallest drop that fails; mirrored.
    r = judge([1.0, 1.0], direction="higher")
    assert r.mde == pytest.approx(1 - 0.95 * math.exp(-h), rel=1e-6) and "beyond -" in r.reason
    assert judge([1.0 - r.mde - 1e-6] * 2, direction="higher").state == "fail"
    assert judge([1.0 - r.mde + 1e-4] * 2, direction="higher").state == "undecided"
    assert detectable_effect(0.0, tolerance=0.05, direction="lower") == pytest.approx(0.05)


def test_a_per_operator_family_widens_the_confidence() -> None:
    op = "op_self_ms[aten::mm]"
    assert family_confidence(op, 0.95, 0.05, 0) == family_confidence(op, 0.95, 0.05, 1) == 0.95
    assert family_confidence(op, 0.95, 0.05, 2) == 0.975 and family_confidence(op, 0.95, 0.05, 10) == pytest.approx(0.995)
    assert family_confidence(op, 0.999, 0.05, 10) == 0.999 and family_confidence("step_ms", 0.95, 0.05, 10) == 0.95
    wide = judge_ratios([1.02, 1.03], tolerance=0.05, direction="lower", prior_sd=0.025, confidence=0.995)
    narrow = judge_ratios([1.02, 1.03], tolerance=0.05, direction="lower", prior_sd=0.025)
    assert wide.ci[1] > narrow.ci[1] and wide.mde > narrow.mde and wide.confidence == 0.995
    assert "99.5 % CI" in wide.reason and "95 % CI" in narrow.reason
    with pytest.raises(ValueError, match="family_alpha must be in"):
        ABPolicy(family_alpha=0.0)


def test_observed_spread_widens_the_interval_of_a_noisy_check() -> None:
    # Segmentation A/A pairs (sd 4.4 %): the pooled sd rises above the 2.5 % prior.
    v = judge([1.046, 0.964, 1.000, 1.063])
    assert v.state == "undecided" and v.sd == pytest.approx(0.03599, abs=1e-5)
    assert judge([1.046, 0.964, 1.000, 1.063, 1.02, 0.99], final=True).state == "pass"


def test_pairs_far_noisier_than_the_prior_set_it_aside() -> None:
    # The tiny MLP step in a CI run whose two sides had the same code (documentation changed):
    # four pairs all above 1, per-pair sd 11.3 %. Pooled with the 2.5 % prior the sd read 8.2 %
    # and the CI 1.06-1.29 failed the check; the prior does not describe such a check.
    pairs = [1.3205992638871502, 1.080048476926746, 1.0494494664694065, 1.2576288732307184]
    pooled = judge_ratios(pairs, tolerance=0.05, direction="lower", prior_sd=0.025, prior_test=0.0, final=True)
    assert pooled.state == "fail" and pooled.sd == pytest.approx(0.0816, abs=1e-4) and not pooled.prior_set_aside
    v = judge(pairs, final=True)
    assert v.state == "inconclusive" and v.prior_set_aside and v.df == 3.0
    assert v.sd == pytest.approx(0.1127, abs=1e-4) and v.ci == pytest.approx((0.979, 1.401), abs=1e-3)
    assert "far above the prior 2.5%, which is set aside" in v.reason
    # A spread the prior explains keeps it: the segmentation pairs above, and two quiet pairs.
    assert not judge([1.046, 0.964, 1.000, 1.063]).prior_set_aside
    assert not judge([1.01, 0.99]).prior_set_aside and judge([1.01, 0.99]).state == "pass"
    # A large change with a large spread still fails on its own spread.
    assert judge([1.6, 1.3, 1.45, 1.75], final=True).state == "fail"
    with pytest.raises(ValueError, match="prior_test must be in"):
        ABPolicy(prior_test=1.0)


def test_rates_are_judged_higher_is_better() -> None:
    slower = judge([0.88, 0.90, 0.89], direction="higher")
    assert slower.state == "fail" and slower.limit == pytest.approx(0.95) and "tolerance -5 %" in slower.reason
    faster = judge([1.12, 1.10, 1.11], direction="higher")
    assert faster.state == "pass" and faster.improved and "better than the base by more than 5 %" in faster.reason


def test_a_faster_head_passes_and_says_so() -> None:
    v = judge([0.85, 0.86, 0.84])
    assert v.state == "pass" and v.improved


def test_the_tolerance_moves_the_verdict() -> None:
    assert judge([1.125, 1.069, 1.114], tol=0.2).state == "pass"
    assert judge([1.3, 1.32], tol=0.2).state == "fail"


@pytest.mark.parametrize(("ratios", "message"), [
    ([], "at least one pair ratio"), ([1.0, -1.0], "positive finite"), ([1.0, math.nan], "positive finite"),
])
def test_bad_ratios_are_refused(ratios: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        judge(ratios)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="direction must be"):
        judge([1.0], direction="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tolerance must be"):
        judge([1.0], tol=-0.1)
    with pytest.raises(ValueError, match="confidence must be"):
        ABPolicy(confidence=1.0)
    with pytest.raises(ValueError, match="prior_sd: expected positive numbers"):
        ABPolicy(prior_sd={"timing": 0.0})


def test_pair_ratio_is_the_ratio_of_the_sides_quantiles() -> None:
    assert pair_ratio([2.0, 2.2, 2.4], [2.0, 2.0, 2.0]) == pytest.approx(1.1)
    head = [float(x) for x in range(1, 11)]
    base = [x / 2 for x in head]
    assert pair_ratio(head, base, quantile=0.9) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="samples on both sides"):
        pair_ratio([], [1.0])
    with pytest.raises(ValueError, match="positive statistics"):
        pair_ratio([1.0], [0.0])


def test_describe_change_shows_any_change_of_an_exact_value() -> None:
    assert describe_change(12, 12) == "same as the base (12)"
    assert describe_change(14, 12) == "base 12 -> head 14 (+16.7 %)"
    assert describe_change(3, 0) == "base 0 -> head 3"
    assert describe_change(101.5, 100.0, unit="MiB") == "base 100 MiB -> head 101.5 MiB (+1.5 %)"


def test_paired_pair_ratio_takes_each_request_as_its_own_control() -> None:
    import random
    import statistics

    # Requests of many lengths; each request's latency carries 10 % jitter of its own on each
    # side; the code is the same (A/A). The median of per-request ratios cancels the lengths.
    rng = random.Random(7)
    lengths = [rng.lognormvariate(3, 0.8) for _ in range(64)]

    def side(scale: float = 1.0) -> list[float]:
        return [x * scale * rng.lognormvariate(0, 0.1) for x in lengths]

    unpaired, paired, unpaired90, paired90 = [], [], [], []
    for _ in range(300):
        head, base = side(), side()
        unpaired.append(pair_ratio(head, base))
        paired.append(pair_ratio(head, base, paired=True))
        unpaired90.append(pair_ratio(head, base, quantile=0.9))
        paired90.append(pair_ratio(head, base, quantile=0.9, paired=True))
    assert statistics.pstdev(paired) < 0.5 * statistics.pstdev(unpaired)
    assert statistics.pstdev(paired90) < 0.7 * statistics.pstdev(unpaired90)
    # Choosing the tail does not bias an A/A (ranking by the base alone would read low).
    assert statistics.mean(paired90) == pytest.approx(1.0, abs=0.01)
    # A real +10 % on every request reads as +10 %, however the lengths mix.
    base = side()
    assert pair_ratio([x * 1.1 for x in base], base, paired=True) == pytest.approx(1.1)
    assert pair_ratio([x * 1.1 for x in base], base, quantile=0.9, paired=True) == pytest.approx(1.1)
    # A side that sampled two rounds is paired on the round both have; counts that do not
    # line up are compared unpaired.
    head = [x * 1.2 for x in base]
    assert pair_ratio(head + head, base, paired=True) == pytest.approx(1.2)
    assert pair_ratio(head[:-1], base, paired=True) == pytest.approx(pair_ratio(head[:-1], base))
