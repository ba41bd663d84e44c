"""The trend of one machine's absolute values since a ref: a line through ln(value) over the commits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..measure.stats import t_quantile
from ..metrics import STATISTICAL_KINDS
from ..verdict.rule import Limits, classify

__all__ = ["MIN_TREND_POINTS", "TREND_KINDS", "Trend", "level_trend"]

TREND_KINDS = STATISTICAL_KINDS
"""Kinds of check whose values have noise (:data:`perfbudget.metrics.STATISTICAL_KINDS`): the ones
with a trend. An exact value (a count, FLOPs, bytes) changes where it changes: a change point."""

MIN_TREND_POINTS = 4
"""Fewer runs of one machine give no trend: with 3, one degree of freedom leaves t(0.975) = 12.7."""


@dataclass(frozen=True, kw_only=True)
class Trend:
    """The line through ln(value) of ``n`` runs, and the move it makes over them."""

    n: int
    slope: float
    """Change of ln(value) per commit."""
    slope_se: float
    df: int
    span: float
    """Commits from the first run to the last (``x_last - x_first``)."""
    tau: float
    """Between-run sd of ln(value) beyond the runs' own errors (0 when it is not estimated)."""
    confidence: float

    @property
    def half_width(self) -> float:
        """Half-width of the move's interval in ln units."""
        return t_quantile(0.5 + self.confidence / 2, self.df) * self.slope_se * self.span

    @property
    def ratio(self) -> float:
        """Last run's fitted level / first run's."""
        return math.exp(self.slope * self.span)

    @property
    def ci(self) -> tuple[float, float]:
        """The move's interval, as a ratio."""
        move, half = self.slope * self.span, self.half_width
        return math.exp(move - half), math.exp(move + half)

    @property
    def change(self) -> float:
        return self.ratio - 1.0

    def beyond(self, tolerance: float, direction: str) -> bool:
        """Whether the interval lies entirely beyond ``1 + tolerance`` (``1 - tolerance`` for a rate,
        ``direction == "higher"``): the A/B verdict's rule."""
        return classify(*self.ci, Limits.around(1.0, tolerance, "higher" if direction == "higher" else "lower")) == "fail"


def _wls(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]) -> tuple[float, float, float, float]:
    """Weighted least squares of ``y = a + b x``: ``(b, xbar, sum w (x - xbar)^2, sum w r^2)``."""
    sw = math.fsum(ws)
    xbar = math.fsum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    ybar = math.fsum(w * y for w, y in zip(ws, ys, strict=True)) / sw
    sxx = math.fsum(w * (x - xbar) ** 2 for w, x in zip(ws, xs, strict=True))
    sxy = math.fsum(w * (x - xbar) * (y - ybar) for w, x, y in zip(ws, xs, ys, strict=True))
    b = sxy / sxx
    a = ybar - b * xbar
    rss = math.fsum(w * (y - a - b * x) ** 2 for w, x, y in zip(ws, xs, ys, strict=True))
    return b, xbar, sxx, rss


def level_trend(xs: Sequence[float], log_values: Sequence[float], log_se: Sequence[float] | None = None, *,
                confidence: float = 0.95) -> Trend:
    """The trend of ``log_values`` (ln of each run's value) over commit positions ``xs``.

    Args:
        xs: each run's commit position (0, 1, 2, ...; gaps where other commits were not measured here).
        log_values: ln(value) of each run.
        log_se: each run's standard error of ln(value); ``None`` for plain least squares.
        confidence: two-sided coverage of the move's interval.

    Raises:
        ValueError: fewer than 3 runs, unequal lengths, one position, a non-finite value or se <= 0.
    """
    n = len(xs)
    if len(log_values) != n or (log_se is not None and len(log_se) != n):
        raise ValueError(f"level_trend: {n} positions but {len(log_values)} values"
                         + (f" and {len(log_se)} standard errors" if log_se is not None else ""))
    if n < 3:
        raise ValueError(f"level_trend needs at least 3 runs, got {n}")
    if not all(math.isfinite(v) for v in (*xs, *log_values)):
        raise ValueError("level_trend needs finite positions and values")
    if max(xs) == min(xs):
        raise ValueError("level_trend needs runs at two positions at least")
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence: expected a number in [0.5, 1), got {confidence!r}")
    df = n - 2
    span = float(max(xs) - min(xs))
    if log_se is None:
        b, _, sxx, rss = _wls(xs, log_values, [1.0] * n)
        return Trend(n=n, slope=b, slope_se=math.sqrt(rss / df / sxx), df=df, span=span, tau=0.0,
                     confidence=confidence)
    if not all(math.isfinite(s) and s > 0 for s in log_se):
        raise ValueError(f"level_trend: standard errors must be positive numbers, got {list(log_se)[:3]}")
    # DerSimonian-Laird: tau^2 from the fixed-effect fit's Q against its expectation n - 2.
    w = [1.0 / (s * s) for s in log_se]
    _, xbar, sxx, q_fixed = _wls(xs, log_values, w)
    sw = math.fsum(w)
    # trace of (X'WX)^-1 X'W^2 X for the columns (1, x), centred at the weighted mean
    trace = (math.fsum(wi * wi for wi in w) / sw
             + math.fsum(wi * wi * (x - xbar) ** 2 for wi, x in zip(w, xs, strict=True)) / sxx)
    tau2 = max(0.0, (q_fixed - df) / (sw - trace))
    ws = [1.0 / (s * s + tau2) for s in log_se]
    b, _, sxx_re, rss_re = _wls(xs, log_values, ws)
    scale = max(1.0, rss_re / df)  # Knapp-Hartung, never narrower than the runs' own errors
    return Trend(n=n, slope=b, slope_se=math.sqrt(scale / sxx_re), df=df, span=span, tau=math.sqrt(tau2),
                 confidence=confidence)
