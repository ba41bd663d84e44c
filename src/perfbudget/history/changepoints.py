"""Change points of a check's history: level shifts of absolute values, drifts of a chain of A/B log-ratios."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..measure.stats import normal_quantile, t_quantile

__all__ = [
    "Breakpoints",
    "ChangeConfig",
    "Drift",
    "MissingPackageError",
    "Shift",
    "chained_drifts",
    "level_shifts",
    "pelt_breakpoints",
    "robust_sd",
    "segment_sum",
]

Breakpoints = Callable[[Sequence[float], float], list[int]]
"""``(series, penalty) -> ends``: the end index (exclusive) of each segment, the last one ``len(series)``
(ruptures' convention)."""


@dataclass(frozen=True, kw_only=True)
class ChangeConfig:
    """How change points are found; the defaults are the ones measured in ``benchmarks/history-sim.md``."""

    level_penalty: float = 4.0
    """PELT penalty per change point on absolute series, in units of ``noise_sd^2 * ln(n)`` (BIC is ~2)."""
    min_change: float = 0.01
    """Level shifts and drifts smaller than this relative change (0.01: 1 %) are not reported."""
    chain_penalty: float = 4.0
    """PELT penalty on a chain's log-ratios, in units of ``median(se^2) * ln(n)``: low, as each proposed
    segment is then tested on its own (``chain_confidence``)."""
    chain_confidence: float = 0.995
    """Two-sided coverage of a drift's interval, reported when it excludes 1. Above 0.99 as the fit picks
    what looks most like a change: at 0.99, 3-5 % of simulated no-op histories had a drift
    (``benchmarks/history-sim.md``)."""
    min_points: int = 6
    """Shorter series have no change points (too few points to tell a level from noise)."""
    min_size: int = 2
    """Fewest runs of a level between two others: a shorter one the next runs undo is a blip (asv's ``min_size``)."""

    def __post_init__(self) -> None:
        for name in ("level_penalty", "chain_penalty", "min_change"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
        if not 0.5 <= self.chain_confidence < 1.0:
            raise ValueError(f"chain_confidence: expected a number in [0.5, 1), got {self.chain_confidence!r}")
        for name, least in (("min_points", 3), ("min_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Shift:
    """A change point of an absolute series: the level moved at point ``index``."""

    index: int
    """First point of the new level."""
    before: float
    """Level of the segment before (geometric mean), in the series' unit."""
    after: float
    """Level of the segment from ``index`` on."""

    @property
    def change(self) -> float:
        """Relative change of the level (0.05: +5 %); infinite from a level of 0 (see :attr:`label`)."""
        if self.before == 0:
            return 0.0 if self.after == 0 else math.copysign(math.inf, self.after)
        return self.after / self.before - 1.0

    @property
    def label(self) -> str:
        """``+9.9%``, or ``0 -> 2`` from a level of 0."""
        return f"{self.change:+.1%}" if math.isfinite(self.change) else f"{self.before:.3g} -> {self.after:.3g}"


@dataclass(frozen=True, kw_only=True)
class Drift:
    """Consecutive merges ``first..last`` (chain indices, inclusive) whose ratios multiply to a significant change."""

    first: int
    last: int
    ratio: float
    """Product of the merges' head/parent ratios."""
    ci: tuple[float, float]
    """Its interval (``ChangeConfig.chain_confidence``)."""

    @property
    def change(self) -> float:
        return self.ratio - 1.0


class MissingPackageError(ImportError):
    """A package that only change-point detection needs does not import here; the message says how to install it."""


def pelt_breakpoints(series: Sequence[float], penalty: float, weights: Sequence[float] | None = None) -> list[int]:
    """Segment ends of the exact least-squares piecewise-constant fit (PELT), ``penalty`` per change point;
    ``weights`` (relative, one per point) weigh each point's squared error."""
    import numpy as np

    try:
        import ruptures
    except ImportError as exc:
        # Installed with the package, but a machine set up without a registry (a GPU runner
        # installing with --no-deps) may lack it; only this function needs it.
        raise MissingPackageError(f"change points need the package ruptures, which does not import here ({exc}); "
                          "install it with: pip install 'ruptures>=1.1.9'") from exc

    if weights is not None and len(weights) and all(w == weights[0] for w in weights) and weights[0] > 0:
        # Equal weights scale every segment's cost alike: the unweighted fit at a penalty scaled back.
        penalty, weights = penalty / weights[0], None
    x = np.asarray(series, dtype=float).reshape(-1, 1)
    # KernelCPD's linear kernel is Pelt(model="l2")'s cost, from C (~1000x faster on 60 points).
    fit = ruptures.KernelCPD(kernel="linear", min_size=1) if weights is None else \
        ruptures.Pelt(custom_cost=_weighted_l2(ruptures.base.BaseCost, weights), min_size=1, jump=1)
    return [int(e) for e in fit.fit(x).predict(pen=max(penalty, 1e-12))]


def _weighted_l2(base: type, weights: Sequence[float]) -> Any:
    """A ruptures cost: ``sum w_i (x_i - m)^2`` over a segment, ``m`` its weighted mean, from prefix sums."""
    import numpy as np

    class WeightedL2(base):
        model = "weighted_l2"
        min_size = 1

        def fit(self, signal: Any) -> WeightedL2:
            self.signal = signal
            w = np.asarray(weights, dtype=float)
            x = signal[:, 0]
            self.sums = [np.concatenate([[0.0], np.cumsum(v)]) for v in (w, w * x, w * x * x)]
            return self

        def error(self, start: int, end: int) -> float:
            sw, swx, swxx = (c[end] - c[start] for c in self.sums)
            return float(swxx - swx * swx / sw)

    return WeightedL2()


def robust_sd(values: Sequence[float]) -> float:
    """Noise sd of a series with level shifts: the MAD of its first differences, scaled to an sd
    (a shift moves one difference, not the median)."""
    diffs = [b - a for a, b in itertools.pairwise(values)]
    if len(diffs) < 2:
        return 0.0
    mid = statistics.median(diffs)
    return 1.4826 * statistics.median(abs(d - mid) for d in diffs) / math.sqrt(2)


def level_shifts(values: Sequence[float], *, se: Sequence[float | None] | None = None,
                 config: ChangeConfig | None = None, breakpoints: Breakpoints | None = None) -> list[Shift]:
    """Change points of a series of absolute values (times, rates, counts), oldest first.

    A positive series is fitted on ln(value), so a shift is relative; one with zeros on the values.
    The penalty is ``level_penalty * sd^2 * ln(n)`` (sd from :func:`robust_sd`); where every run kept
    its ``se``, a point weighs ``median(se^2) / se^2``.

    Args:
        values: the series; negative or non-finite values are refused.
        se: each value's standard error of ln(value) (``Check.value_se``), ``None`` where unknown.
        config: penalties and thresholds.
        breakpoints: the segmentation (default: :func:`pelt_breakpoints`, weighted).

    Raises:
        ValueError: a value that is not a finite number >= 0.
    """
    config = config or ChangeConfig()
    bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"level_shifts needs finite values >= 0, got {bad[:3]}")
    n = len(values)
    if n < config.min_points:
        return []
    relative = all(v > 0 for v in values)
    fitted = [math.log(v) for v in values] if relative else [float(v) for v in values]
    sd = max(robust_sd(fitted), 1e-9)  # an exact metric: any change is one
    ses = [s for s in se or () if s is not None and math.isfinite(s) and s > 0]
    scale = statistics.median(s * s for s in ses) if relative and len(ses) == n else 0.0
    w = [scale / (s * s) for s in ses] if scale else [1.0] * n
    penalty = config.level_penalty * sd * sd * math.log(n)
    ends = (breakpoints or partial(pelt_breakpoints, weights=w if scale else None))(fitted, penalty)
    starts = [0, *ends[:-1]]
    sums = [(math.fsum(w[s:e]), math.fsum(wi * x for wi, x in zip(w[s:e], fitted[s:e], strict=True)))
            for s, e in zip(starts, ends, strict=True)]
    means = [sx / sw for sw, sx in sums]
    levels = [math.exp(m) for m in means] if relative else means
    kept = [True] * len(starts)  # the shift into segment i is reported
    for i in range(1, len(starts) - 1):
        (wb, _), (wa, _) = sums[i - 1], sums[i + 1]
        undone = wb * wa / (wb + wa) * (means[i - 1] - means[i + 1]) ** 2 < penalty
        if ends[i] - starts[i] < config.min_size and undone:
            kept[i] = kept[i + 1] = False
    shifts = []
    for i in range(1, len(starts)):
        shift = Shift(index=starts[i], before=levels[i - 1], after=levels[i])
        if kept[i] and abs(shift.change) >= config.min_change:
            shifts.append(shift)
    return shifts


def segment_sum(log_ratios: Sequence[float], log_se: Sequence[float], dfs: Sequence[float] | None,
                confidence: float, sources: Sequence[str] | None = None,
                shared_dfs: Sequence[float] | None = None) -> tuple[float, tuple[float, float]]:
    """Product of head/parent ratios and its interval: log-ratios and their variances add, and the t
    quantile takes the sum's Welch-Satterthwaite degrees of freedom (normal when ``dfs`` is unknown).

    Merges whose errors share one variance estimate name the same ``sources`` entry; ``shared_dfs``
    says how many of each merge's degrees of freedom are that estimate's (default: all). The shared
    parts add within their source, whose degrees of freedom count once; the rest is each merge's own.

    Returns:
        ``(ratio, (low, high))``.
    """
    total = math.fsum(log_ratios)
    var = math.fsum(s * s for s in log_se)
    se = math.sqrt(var)
    p = 0.5 + confidence / 2
    if dfs is not None and var > 0 and all(d > 0 for d in dfs):
        groups: dict[object, tuple[float, float]] = {}
        own = 0.0  # sum of (own variance)^2 / own df
        for i, (s, d) in enumerate(zip(log_se, dfs, strict=True)):
            key = sources[i] if sources is not None else i
            shared = d if shared_dfs is None else min(max(shared_dfs[i], 0.0), d)
            v, g = groups.get(key, (0.0, shared))
            groups[key] = (v + s * s * shared / d, min(g, shared))
            if shared < d:
                own += (s * s * (d - shared) / d) ** 2 / (d - shared)
        df = var * var / (own + math.fsum(v * v / g for v, g in groups.values() if g > 0))
        q = t_quantile(p, df)
    else:
        q = normal_quantile(p)
    return math.exp(total), (math.exp(total - q * se), math.exp(total + q * se))


def chained_drifts(log_ratios: Sequence[float], log_se: Sequence[float], dfs: Sequence[float] | None = None, *,
                   config: ChangeConfig | None = None, breakpoints: Breakpoints | None = None,
                   sources: Sequence[str] | None = None, shared_dfs: Sequence[float] | None = None) -> list[Drift]:
    """Runs of consecutive merges that changed the level, from each merge's ln(head/parent) and its se.

    The chain is segmented in its increments, not its sum, whose error is a random walk a constant-mean
    fit would read as change points everywhere. A weighted fit (as :func:`level_shifts`) proposes
    segments of one mean step, even of one merge; one is kept when its :func:`segment_sum` interval at
    ``chain_confidence`` excludes 1 and its change is at least ``min_change``.

    Raises:
        ValueError: lengths that differ, or a standard error that is not a positive number.
    """
    config = config or ChangeConfig()
    n = len(log_ratios)
    if len(log_se) != n or (dfs is not None and len(dfs) != n):
        raise ValueError(f"chained_drifts: {n} log-ratios but {len(log_se)} standard errors"
                         + (f" and {len(dfs)} degrees of freedom" if dfs is not None else ""))
    if any(not (math.isfinite(s) and s > 0) for s in log_se):
        raise ValueError(f"chained_drifts: standard errors must be positive numbers, got {list(log_se)[:3]}")
    if n == 0:
        return []
    scale = statistics.median(s * s for s in log_se)
    fit = breakpoints or partial(pelt_breakpoints, weights=[scale / (s * s) for s in log_se])
    ends = fit(list(log_ratios), config.chain_penalty * scale * math.log(max(n, 2))) if n > 1 else [1]
    drifts = []
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        ratio, (lo, hi) = segment_sum(log_ratios[start:end], log_se[start:end],
                                      None if dfs is None else dfs[start:end], config.chain_confidence,
                                      None if sources is None else sources[start:end],
                                      None if shared_dfs is None else shared_dfs[start:end])
        if (lo > 1.0 or hi < 1.0) and abs(ratio - 1.0) >= config.min_change:
            drifts.append(Drift(first=start, last=end - 1, ratio=ratio, ci=(lo, hi)))
    return drifts
