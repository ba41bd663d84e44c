"""The A/B verdict of one statistical check: each process pair's head/base ratio, and the ratios against the rule."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..measure import stats
from ..measure.stats import pooled_sd, t_quantile
from ..metrics import Direction
from .rule import Limits, classify, settle

__all__ = ["PAIRED_TAIL_MIN", "PRIOR_DF", "PRIOR_TEST", "RatioVerdict", "State", "can_decide", "detectable_effect",
           "judge_ratios", "pair_ratio"]

State = Literal["pass", "fail", "undecided", "inconclusive"]

#: Degrees of freedom the prior is worth: from 5 pairs on, the observed spread weighs more.
PRIOR_DF = 3.0
#: The prior is set aside when the pairs' spread is less likely than this under it.
PRIOR_TEST = 0.01

@dataclass(frozen=True, kw_only=True)
class RatioVerdict:
    """The A/B judgement of one statistical check.

    Attributes:
        state: pass, fail, undecided (wants another pair), or inconclusive (straddles at the last pair).
        ratio: head/base, the geometric mean over pairs.
        ci: CI of ``ratio``.
        pairs: process pairs behind it.
        sd: per-pair sd of ln(head/base), pooled with the prior unless it was set aside.
        df: degrees of freedom of the t interval.
        limit: the ratio beyond which the check fails (1 ± tolerance on the bad side).
        mde: the smallest regression (a fraction, 0.08: 8 %) these pairs would have decided ``fail``.
        confidence: two-sided coverage of ``ci``.
        improved: the CI lies entirely better than the tolerance on the good side.
        prior_set_aside: the pairs' spread was too large for the prior, which was not used.
        reason: one readable sentence.
    """

    state: State
    ratio: float
    ci: tuple[float, float]
    pairs: int
    sd: float
    df: float
    limit: float
    mde: float
    confidence: float
    improved: bool = False
    prior_set_aside: bool = False
    reason: str = ""


PAIRED_TAIL_MIN = 16
"""Fewest requests a paired upper-quantile ratio rests on (measured: the p90 ratio of 64
requests with 10 % jitter each read sd 6.2 % per pair on its top 7, 3.7 % on 16)."""


def pair_ratio(
    head: Sequence[float], base: Sequence[float], *, quantile: float = 0.5, paired: bool = False
) -> float:
    """head/base of one process pair: the ratio of the sides' ``quantile``, or with ``paired`` (samples
    are requests or rounds both sides took in the same order) the median of per-sample ratios, over
    the largest requests for an upper quantile. Counts that do not line up fall back to unpaired.

    Raises:
        ValueError: a side has no samples, or the base's statistic is not positive.
    """
    if not head or not base:
        raise ValueError(f"pair_ratio needs samples on both sides, got {len(head)} head and {len(base)} base")
    n = min(len(head), len(base))
    if paired and max(len(head), len(base)) % n == 0:
        head, base = head[:n], base[:n]
    if paired and len(head) == len(base) and all(x > 0 for x in head) and all(x > 0 for x in base):
        # Round i of one side ran beside round i of the other: the machine's drift over a pair
        # cancels in their ratio, not in a ratio of medians (benchmarks/op-pairing-cpu.md).
        per_request = [h / b for h, b in zip(head, base, strict=True)]
        if quantile > 0.5:
            # The tail ranked by the smaller latency: by the base alone, its noisy-high requests bias the
            # ratio low; by the sum, the requests one side was stopped in win (an A/A read 0.36).
            keep = max(math.ceil((1 - quantile) * len(base)), min(len(base), PAIRED_TAIL_MIN))
            by_size = sorted(range(len(base)), key=lambda i: min(head[i], base[i]))
            per_request = [per_request[i] for i in by_size[-keep:]]
        return stats.median(per_request)
    h, b = stats.quantile(head, quantile), stats.quantile(base, quantile)
    if not (h > 0 and b > 0):
        raise ValueError(f"pair_ratio needs positive statistics, got head {h!r} and base {b!r}")
    return h / b


def judge_ratios(
    pair_ratios: Sequence[float],
    *,
    tolerance: float,
    direction: Direction,
    prior_sd: float,
    prior_df: float = PRIOR_DF,
    prior_test: float = PRIOR_TEST,
    confidence: float = 0.95,
    final: bool = False,
) -> RatioVerdict:
    """Three-way verdict on head/base from one ratio per process pair.

    Args:
        pair_ratios: head/base of each pair (see :func:`pair_ratio`).
        tolerance: relative change accepted in the bad direction (0.05: 5 %).
        direction: ``lower`` (times: a ratio above 1 is worse) or ``higher`` (rates).
        prior_sd: prior per-pair sd of ln(head/base) (0.025: 2.5 %).
        prior_df: degrees of freedom the prior is worth (0: plain t interval, needs 2 pairs).
        prior_test: set the prior aside when the pairs' spread is less likely than this under it (0: never).
        confidence: two-sided coverage of the CI.
        final: no more pairs will come: a straddling CI is ``inconclusive``, not decided on the estimate.

    Raises:
        ValueError: no ratios, a ratio that is not a positive finite number, or bad settings.
    """
    rs = [float(r) for r in pair_ratios]
    if not rs:
        raise ValueError("judge_ratios needs at least one pair ratio, got none")
    if bad := [r for r in rs if not (math.isfinite(r) and r > 0)]:
        raise ValueError(f"pair ratios must be positive finite numbers, got {bad[:3]}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance!r}")
    if direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', got {direction!r}")
    if not (prior_sd > 0 and prior_df >= 0):
        raise ValueError(f"prior_sd must be > 0 and prior_df >= 0, got {prior_sd!r}, {prior_df!r}")
    n = len(rs)
    ys = [math.log(r) for r in rs]
    ybar = sum(ys) / n
    ss = sum((y - ybar) ** 2 for y in ys)  # (n - 1) * s^2
    sd, df, set_aside = pooled_sd(ss, n, prior_sd=prior_sd, prior_df=prior_df, prior_test=prior_test)
    half = t_quantile(0.5 + confidence / 2.0, df) * sd / math.sqrt(n)
    ratio = math.exp(ybar)
    lo, hi = math.exp(ybar - half), math.exp(ybar + half)
    sign = "+" if direction == "lower" else "-"
    limits = Limits.around(1.0, tolerance, direction)
    state = settle(lo, hi, limits, evidence="pairs") if final else classify(lo, hi, limits, final=False)
    improved = state == "stale"

    mde = detectable_effect(half, tolerance=tolerance, direction=direction)
    change = f"{(ratio - 1) * 100:+.1f} %"
    what = (f"head/base {ratio:.4g} ({change}; {confidence * 100:.3g} % CI {lo:.4g}-{hi:.4g}, "
            f"{n} pair{'s' if n != 1 else ''}, sd {sd:.1%} per pair"
            + (f", far above the prior {prior_sd:.1%}, which is set aside" if set_aside else "") + ")")
    bound = f"{sign}{tolerance * 100:.3g} %"
    resolves = f"could resolve changes beyond {sign}{mde * 100:.3g} %"

    def verdict(state: State, reason: str) -> RatioVerdict:
        return RatioVerdict(state=state, ratio=ratio, ci=(lo, hi), pairs=n, sd=sd, df=df, limit=limits.bad, mde=mde,
                            confidence=confidence, improved=improved, prior_set_aside=set_aside,
                            reason=f"{what} {reason}")

    if state == "fail":
        return verdict("fail", f"is entirely beyond the tolerance {bound}")
    if state in ("pass", "stale"):
        return verdict("pass", f"is within the tolerance {bound}"
                               + (f"; better than the base by more than {tolerance * 100:.3g} %" if improved else "")
                               + f" (these pairs {resolves})")
    if state == "undecided":
        return verdict("undecided", f"straddles the tolerance {bound} (so far these pairs {resolves})")
    return verdict("inconclusive", f"straddles the tolerance {bound} after the last pair: inconclusive, "
                                   f"not decided on the estimate; this run {resolves} "
                                   "(more pairs or a quieter machine resolve smaller ones)")


def can_decide(rv: RatioVerdict, pairs_left: int) -> bool:
    """Could ``pairs_left`` more pairs decide this straddling check, if their spread is what it shows now?"""
    if pairs_left <= 0:
        return False
    n = rv.pairs
    # The CI's half-width projected to n + pairs_left pairs against the estimate's distance from the
    # limit, with one standard error of room for the estimate to move.
    half = t_quantile(0.5 + rv.confidence / 2.0, rv.df + pairs_left) * rv.sd / math.sqrt(n + pairs_left)
    distance = abs(math.log(rv.ratio) - math.log(rv.limit))
    return half < distance + rv.sd / math.sqrt(n)


def detectable_effect(half_width: float, *, tolerance: float, direction: Direction) -> float:
    """The smallest regression (a fraction) decided ``fail`` by a CI of log half-width ``half_width``:
    the CI ``ratio * exp(-+h)`` clears ``1 + t`` from ``(1 + t) * exp(h)`` on (rates: ``1 - t`` below)."""
    if direction == "lower":
        return (1.0 + tolerance) * math.exp(half_width) - 1.0
    return 1.0 - (1.0 - tolerance) * math.exp(-half_width)
