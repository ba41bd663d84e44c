"""The pure statistics on literal numbers: t, chi^2 and normal quantiles, the prior-pooled sd."""

from __future__ import annotations

import math

import pytest

from perfbudget.ab import ratios
from perfbudget.measure.stats import chi2_sf, normal_quantile, pooled_sd, t_quantile


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.975, 1, 12.7062047), (0.975, 2, 4.3026527), (0.975, 4, 2.7764451), (0.975, 5, 2.5705818),
    (0.975, 10, 2.2281389), (0.975, 30, 2.0422725), (0.95, 5, 2.0150484), (0.025, 5, -2.5705818),
    (0.5, 3, 0.0),
])
def test_t_quantile_matches_the_table(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-6)


def test_t_quantile_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="p must be in"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df must be > 0"):
        t_quantile(0.9, 0)


@pytest.mark.parametrize(("x", "df", "expected"), [
    (3.841459, 1, 0.05), (6.634897, 1, 0.01), (11.344867, 3, 0.01), (2.0, 3, 0.5724067), (20.0, 5, 0.00124973),
    (0.0, 2, 1.0), (50.0, 4, 3.61087e-10),
])
def test_chi2_survival_matches_the_table(x: float, df: float, expected: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(expected, rel=1e-5)


def test_normal_quantile_matches_the_table() -> None:
    assert normal_quantile(0.975) == pytest.approx(1.9599640, abs=1e-6)
    assert normal_quantile(0.5) == 0.0
    assert normal_quantile(0.05) == pytest.approx(-1.6448536, abs=1e-6)


def test_pooled_sd_weighs_the_prior_by_its_degrees_of_freedom() -> None:
    # 3 values with ss = 0.002 and a prior 0.025 worth 3 df: (3 * 0.025^2 + 0.002) / 5.
    sd, df, aside = pooled_sd(0.002, 3, prior_sd=0.025, prior_df=3.0, prior_test=0.01)
    assert (sd, df, aside) == (pytest.approx(math.sqrt((3 * 0.025**2 + 0.002) / 5)), 5.0, False)


def test_pooled_sd_sets_aside_a_prior_the_spread_refutes() -> None:
    # ss / prior^2 = 0.08 / 0.000625 = 128 on 2 df: far beyond chi^2(2)'s 0.99 quantile 9.21.
    sd, df, aside = pooled_sd(0.08, 3, prior_sd=0.025, prior_df=3.0, prior_test=0.01)
    assert (sd, df, aside) == (pytest.approx(0.2), 2, True)


def test_pooled_sd_of_one_value_needs_a_prior() -> None:
    assert pooled_sd(0.0, 1, prior_sd=0.025, prior_df=3.0, prior_test=0.01) == (pytest.approx(0.025), 3.0, False)
    with pytest.raises(ValueError, match="one pair needs a prior"):
        pooled_sd(0.0, 1, prior_sd=0.025, prior_df=0.0, prior_test=0.01)


def test_the_ab_ratios_still_export_the_quantiles() -> None:
    assert ratios.t_quantile is t_quantile
    assert ratios.chi2_sf is chi2_sf
