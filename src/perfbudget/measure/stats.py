"""Pure statistics over raw samples: quantiles, spread, CIs of the median, t/chi^2/normal quantiles."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Summary",
    "chi2_sf",
    "cv",
    "iqr",
    "median",
    "median_ci",
    "normal_quantile",
    "pooled_sd",
    "quantile",
    "quantile_ci",
    "summarize",
    "t_quantile",
]


def _sorted_finite(samples: Sequence[float]) -> list[float]:
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("no samples")
    bad = [x for x in xs if not math.isfinite(x)]
    if bad:
        raise ValueError(f"non-finite sample(s): {bad[:3]}")
    return xs


def quantile(samples: Sequence[float], q: float) -> float:
    """Quantile ``q`` in [0, 1] with linear interpolation (numpy's default, "type 7")."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
    xs = _sorted_finite(samples)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(samples: Sequence[float]) -> float:
    """Median of the samples."""
    return quantile(samples, 0.5)


def iqr(samples: Sequence[float]) -> float:
    """Interquartile range (p75 - p25)."""
    return quantile(samples, 0.75) - quantile(samples, 0.25)


def cv(samples: Sequence[float]) -> float:
    """Coefficient of variation: sample standard deviation / mean (0 for fewer than 2 samples)."""
    xs = _sorted_finite(samples)
    if len(xs) < 2:
        return 0.0
    mean = math.fsum(xs) / len(xs)
    if mean == 0:
        return 0.0
    var = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return math.sqrt(var) / abs(mean)


def _binom_cdfs(n: int, p: float) -> list[float]:
    """``[P(X <= k) for k in 0..n]`` for ``X ~ Binomial(n, p)``, in O(n)."""
    # In log space: large n neither underflows (0.5**1100 is 0.0) nor costs big-integer arithmetic.
    if p <= 0.0 or p >= 1.0:
        return [1.0] * (n + 1) if p <= 0.0 else [0.0] * n + [1.0]
    lp, lq = math.log(p), math.log1p(-p)
    lgn = math.lgamma(n + 1)
    out = []
    acc = 0.0
    for k in range(n + 1):
        acc += math.exp(lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq)
        out.append(min(acc, 1.0))
    return out


def quantile_ci(
    samples: Sequence[float], q: float, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Distribution-free confidence interval ``(low, high, coverage)`` of the ``q`` quantile.

    Order statistics [x_(l), x_(u)] cover it with probability ``P(l <= B < u)``, ``B ~ Binomial(n, q)``,
    ranks chosen symmetrically for at least ``confidence``; too few samples give the full range.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile q must be in (0, 1), got {q!r}")
    xs = _sorted_finite(samples)
    n = len(xs)
    alpha = 1.0 - confidence
    cdf = _binom_cdfs(n, q)  # cdf[k] = P(B <= k)
    # l: largest rank with P(B <= l-1) <= alpha/2; u: smallest rank with P(B >= u) <= alpha/2.
    lo_rank = 0
    for r in range(1, n + 1):
        if cdf[r - 1] <= alpha / 2:
            lo_rank = r
        else:
            break
    hi_rank = n + 1
    for r in range(n, 0, -1):
        if 1.0 - cdf[r - 1] <= alpha / 2:
            hi_rank = r
        else:
            break
    if lo_rank < 1 or hi_rank > n or lo_rank >= hi_rank:
        # Full range [x_(1), x_(n)]: covers unless all samples fall on one side.
        coverage = 1.0 - (1 - q) ** n - q**n
        return xs[0], xs[-1], coverage
    coverage = cdf[hi_rank - 1] - cdf[lo_rank - 1]
    return xs[lo_rank - 1], xs[hi_rank - 1], coverage


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval ``(low, high)`` of the median."""
    lo, hi, _ = quantile_ci(samples, 0.5, confidence)
    return lo, hi


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Summary of one sample set; units are those of the samples."""

    n: int
    median: float
    ci_low: float
    ci_high: float
    iqr: float
    cv: float
    min: float
    max: float


def summarize(samples: Sequence[float], confidence: float = 0.95) -> Summary:
    """Median, CI of the median, IQR, CV, min and max in one pass over the samples."""
    xs = _sorted_finite(samples)
    lo, hi = median_ci(xs, confidence)
    return Summary(
        n=len(xs),
        median=median(xs),
        ci_low=lo,
        ci_high=hi,
        iqr=iqr(xs),
        cv=cv(xs),
        min=xs[0],
        max=xs[-1],
    )


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with real ``df`` > 0 degrees of freedom, by bisection on
    the CDF ``1 - I_x(df/2, 1/2) / 2`` with ``x = df / (df + t^2)``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0

    def cdf(t: float) -> float:
        return 1.0 - 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def chi2_sf(x: float, df: float) -> float:
    """``P(X > x)`` for ``X`` chi^2 with ``df`` degrees of freedom: ``Q(df/2, x/2)``."""
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    return 1.0 if x <= 0.0 else 1.0 - _gammainc(df / 2.0, x / 2.0)


def _gammainc(a: float, x: float) -> float:
    """Regularised lower incomplete gamma ``P(a, x)`` (series below ``a + 1``, else the
    continued fraction: Numerical Recipes 6.2)."""
    ln_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(ln_front)
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return 1.0 - math.exp(ln_front) * h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)`` (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def normal_quantile(p: float) -> float:
    """The ``p`` quantile of the standard normal distribution (``p`` in (0, 1))."""
    return statistics.NormalDist().inv_cdf(p)


def pooled_sd(ss: float, n: int, *, prior_sd: float, prior_df: float, prior_test: float) -> tuple[float, float, bool]:
    """``(sd, df, prior_set_aside)`` of ``n`` values (``ss``: sum of squared deviations) pooled with a
    prior sd worth ``prior_df`` degrees of freedom (scaled inverse-chi^2 posterior).

    The prior is set aside, for the plain sd, when the values' spread is less likely than
    ``prior_test`` under it; ``ValueError`` for one value and no prior.
    """
    df = prior_df + n - 1
    if df <= 0:
        raise ValueError(f"one pair needs a prior (prior_df > 0), got prior_df={prior_df!r}")
    sd = math.sqrt((prior_df * prior_sd**2 + ss) / df)
    set_aside = n >= 2 and prior_df > 0 and chi2_sf(ss / prior_sd**2, n - 1) < prior_test
    if set_aside:
        df = n - 1
        sd = math.sqrt(ss / df)
    return sd, df, set_aside
