"""Pure statistics over raw samples: median, quantiles, spread and a distribution-free CI of the median."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Summary",
    "cv",
    "iqr",
    "median",
    "median_ci",
    "quantile",
    "quantile_ci",
    "summarize",
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
    """``[P(X <= k) for k in 0..n]`` for ``X ~ Binomial(n, p)``, in O(n).

    The pmf is built in log space (``lgamma``) so that large ``n`` neither underflows
    (0.5**1100 is 0.0 in floats) nor costs big-integer arithmetic.
    """
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
    """Distribution-free confidence interval of the ``q`` quantile from order statistics.

    The interval [x_(l), x_(u)] (1-based ranks) covers the true quantile with
    probability ``P(l <= B < u)`` where ``B ~ Binomial(n, q)``; ranks are chosen
    symmetrically in probability so that coverage is at least ``confidence``.

    Returns:
        ``(low, high, coverage)``. With too few samples to reach ``confidence``
        the full range is returned with the coverage it actually has.
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
