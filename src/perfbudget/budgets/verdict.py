"""Turn (metric, raw samples, budget) into a Verdict; decides, never measures."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..measure import stats
from ..metrics import BYTES_FLOOR_MIB, Metric, MetricName, parse_name
from ..rule import Limits, classify, tolerance_for
from ..vocabulary import OUTCOMES, Outcome
from .schema import Budget

__all__ = ["OUTCOMES", "Outcome", "Verdict", "VerdictPolicy", "decide"]

More = Callable[[], Sequence[float]]


@dataclass(frozen=True, kw_only=True)
class VerdictPolicy:
    """How statistical metrics are judged.

    Attributes:
        confidence: coverage of the distribution-free CI of the median.
        max_extra_rounds: fresh sample batches taken while the CI straddles the limit.
        confirm: take one fresh measurement before failing, and fail only if it agrees.
    """

    confidence: float = 0.95
    max_extra_rounds: int = 2
    confirm: bool = True

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if self.max_extra_rounds < 0:
            raise ValueError(f"max_extra_rounds must be >= 0, got {self.max_extra_rounds!r}")


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The judgement of one metric of one workload key.

    Attributes:
        key: workload key.
        metric: full metric name.
        outcome: pass, stale (better than budget by more than its tolerance),
            fail, unbudgeted, unmeasurable or error.
        value: measured value: the median for statistical kinds, else the worst value.
        ci: distribution-free CI of the median (statistical kinds only).
        n: samples behind ``value`` (all rounds).
        cv: coefficient of variation of the samples.
        budget: the budget, when one applies.
        limit: the failing limit, budget × (1 ± tolerance) on the bad side (bytes: at least
            ``BYTES_FLOOR_MIB`` above the budget).
        rounds: sample batches measured (first + extra + confirmation).
        confirmed: for a statistical fail, whether the confirmation agreed.
        reason: one readable sentence.
        samples: raw samples (all rounds, including the confirmation).
        attribution: readable lines explaining where the time went.
        ref_ms: when samples were normalised by a machine-speed reference, the reference
            time they are expressed at (each sample x ``ref_ms`` / its paired reference).
        confidence: coverage of ``ci``.
    """

    key: str
    metric: str
    outcome: Outcome
    value: float | None = None
    ci: tuple[float, float] | None = None
    n: int = 0
    cv: float | None = None
    budget: Budget | None = None
    limit: float | None = None
    rounds: int = 1
    confirmed: bool | None = None
    reason: str = ""
    samples: tuple[float, ...] = ()
    attribution: tuple[str, ...] = field(default=())
    ref_ms: float | None = None
    confidence: float | None = None
    advice: str = ""
    """For an ``advisory`` verdict: what it would have been where timing gates (pass, stale or fail)."""
    name: MetricName | None = field(default=None, compare=False, repr=False)
    """The parsed metric name (set by :func:`decide`; parsed on demand otherwise)."""

    @property
    def info(self) -> Metric:
        return (self.name or parse_name(self.metric)).metric

    @property
    def ratio(self) -> float | None:
        """measured / budget, when both are known and the budget is non-zero."""
        if self.value is None or self.budget is None or self.budget.value == 0:
            return None
        return self.value / self.budget.value

    def with_(self, **changes: Any) -> Verdict:
        return replace(self, **changes)


def _limits(metric: Metric, budget: Budget) -> Limits:
    """A budget's limits: a bytes budget's bad limit at least :data:`~perfbudget.metrics.BYTES_FLOOR_MIB`
    above its value (a relative tolerance of a 0 MiB budget would allow no byte)."""
    return Limits.around(budget.value, tolerance_for(metric, budget).value, metric.direction,
                         floor=BYTES_FLOOR_MIB if metric.kind == "bytes" else 0.0)


def _check_finite(samples: Sequence[float]) -> str | None:
    if len(samples) == 0:
        return "no samples were recorded"
    bad = [x for x in samples if not isinstance(x, (int, float)) or not math.isfinite(x)]
    if bad:
        return f"non-finite measurement(s) {bad[:3]} among {len(samples)} samples"
    return None


def decide(
    key: str,
    metric: str | MetricName,
    samples: float | Sequence[float],
    budget: Budget | None,
    *,
    more: More | None = None,
    policy: VerdictPolicy | None = None,
) -> Verdict:
    """Judge one measurement against its budget.

    Args:
        key: workload key.
        metric: full registered metric name, or the name already parsed.
        samples: one value or raw samples (statistical kinds want >= 30).
        budget: the applicable budget, or ``None`` (unbudgeted).
        more: returns a fresh batch of samples; used to measure more while the CI
            straddles the limit, and to confirm before failing.
        policy: statistical decision settings.

    Returns:
        The :class:`Verdict`. Bad samples (NaN, inf, empty) give outcome ``error``.
    """
    policy = policy or VerdictPolicy()
    name = metric if isinstance(metric, MetricName) else parse_name(metric)
    info = name.metric
    xs = [samples] if isinstance(samples, (int, float)) else list(samples)
    base = Verdict(key=key, metric=name.full, outcome=Outcome.ERROR, budget=budget, n=len(xs), name=name)
    problem = _check_finite(xs)
    if problem:
        return base.with_(reason=problem, samples=tuple(x for x in xs if isinstance(x, (int, float))))
    xs = [float(x) for x in xs]
    if not info.statistical:
        return _decide_exact(base, info, xs, budget)
    return _decide_stat(base, info, xs, budget, more, policy)


def _decide_exact(base: Verdict, info: Metric, xs: list[float], budget: Budget | None) -> Verdict:
    value = max(xs) if info.direction == "lower" else min(xs)
    v = base.with_(value=value, samples=tuple(xs), cv=stats.cv(xs) if len(xs) > 1 else None)
    if budget is None:
        return v.with_(outcome=Outcome.UNBUDGETED, reason="no budget for this metric on this device")
    limits = _limits(info, budget)
    v = v.with_(limit=limits.bad)
    state = classify(value, value, limits)
    if state == "fail":
        return v.with_(outcome=Outcome.FAIL, reason=f"{value:g} is worse than the limit {limits.bad:g}")
    if state == "stale":
        return v.with_(outcome=Outcome.STALE, reason=f"{value:g} beats the budget {budget.value:g} beyond its tolerance")
    return v.with_(outcome=Outcome.PASS, reason="within budget")


def _decide_stat(
    base: Verdict,
    info: Metric,
    xs: list[float],
    budget: Budget | None,
    more: More | None,
    policy: VerdictPolicy,
) -> Verdict:
    q = info.quantile

    def summary(data: list[float]) -> tuple[float, tuple[float, float], float]:
        """The quantile, its interval and the interval's coverage."""
        lo, hi, coverage = stats.quantile_ci(data, q, policy.confidence)
        return stats.quantile(data, q), (lo, hi), coverage

    def short() -> str:
        """Why a sample set's interval is no interval at the confidence asked (a high quantile of few samples)."""
        return (f"; {len(xs)} samples give the interval of the {q:g} quantile only {coverage:.0%} coverage"
                if q != 0.5 and coverage < policy.confidence else "")

    med, ci, coverage = summary(xs)
    v = base.with_(value=med, ci=ci, n=len(xs), cv=stats.cv(xs), samples=tuple(xs), confidence=policy.confidence)
    if budget is None:
        return v.with_(outcome=Outcome.UNBUDGETED, reason="no budget for this metric on this device")
    limits = _limits(info, budget)
    bad = limits.bad
    v = v.with_(limit=bad)
    rounds = 1
    while True:
        extra = more is not None and rounds <= policy.max_extra_rounds
        state = classify(ci[0], ci[1], limits, final=not extra)
        if state in ("pass", "stale") and q != 0.5 and coverage < policy.confidence:
            # All samples below the limit say little of a tail quantile when they are few (p90: 10 of them are
            # all below it 35 % of the time): as a straddle, more samples, then the point estimate. (A median of
            # few rounds, e.g. the lease's 3, is a choice of its owner, which says so.)
            state = "undecided" if extra else "inconclusive"
        if state == "fail":
            # Entirely worse: confirm with an independent measurement before failing.
            if policy.confirm and more is not None:
                fresh = list(more())
                problem = _check_finite(fresh)
                if problem:
                    return v.with_(outcome=Outcome.ERROR, reason=f"confirmation: {problem}", rounds=rounds + 1)
                fmed, fci, _ = summary(fresh)
                all_xs = xs + fresh
                agreed = limits.worse(fmed)
                v = v.with_(
                    rounds=rounds + 1, samples=tuple(all_xs), n=len(all_xs), cv=stats.cv(all_xs),
                    confirmed=agreed,
                )
                if not agreed:
                    return v.with_(
                        outcome=Outcome.PASS,
                        reason=(
                            f"first median {med:.4g} was beyond the limit {bad:.4g} but the confirmation "
                            f"median {fmed:.4g} (CI {fci[0]:.4g}-{fci[1]:.4g}) was not"
                        ),
                    )
                return v.with_(
                    outcome=Outcome.FAIL,
                    reason=(
                        f"median {med:.4g} with CI {ci[0]:.4g}-{ci[1]:.4g} is entirely beyond the limit "
                        f"{bad:.4g}; confirmed by a fresh median of {fmed:.4g}"
                    ),
                )
            return v.with_(
                outcome=Outcome.FAIL, rounds=rounds,
                reason=f"median {med:.4g} with CI {ci[0]:.4g}-{ci[1]:.4g} is entirely beyond the limit {bad:.4g}",
            )
        if state == "stale":
            return v.with_(
                outcome=Outcome.STALE, rounds=rounds,
                reason=f"CI {ci[0]:.4g}-{ci[1]:.4g} beats the budget {budget.value:.4g} beyond its tolerance",
            )
        if state == "pass":
            return v.with_(outcome=Outcome.PASS, rounds=rounds, reason="CI within budget")
        if state == "undecided":
            # The CI straddles the limit: measure more, bounded, then decide on the point estimate.
            assert more is not None
            fresh = list(more())
            problem = _check_finite(fresh)
            if problem:
                return v.with_(outcome=Outcome.ERROR, reason=f"extra round: {problem}", rounds=rounds + 1)
            xs = xs + fresh
            rounds += 1
            med, ci, coverage = summary(xs)
            v = v.with_(value=med, ci=ci, n=len(xs), cv=stats.cv(xs), samples=tuple(xs), rounds=rounds)
            continue
        if limits.worse(med):
            return v.with_(
                outcome=Outcome.FAIL, rounds=rounds,
                reason=(
                    f"CI {ci[0]:.4g}-{ci[1]:.4g} straddles the limit {bad:.4g} after {rounds} round(s); "
                    f"the median {med:.4g} is beyond it{short()}"
                ),
            )
        return v.with_(
            outcome=Outcome.PASS, rounds=rounds,
            reason=f"CI straddles the limit {bad:.4g} after {rounds} round(s); the median {med:.4g} is within it{short()}",
        )
