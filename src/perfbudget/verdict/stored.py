"""Turn (metric, raw samples, budget) into a Verdict; decides, never measures."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..budgets.schema import Budget
from ..measure import stats
from ..metrics import BYTES_FLOOR_MIB, Metric, MetricName, parse_name
from ..vocabulary import OUTCOMES, Outcome
from .rule import Limits, classify, settle, tolerance_for

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
    v = _summarised(base, xs, q, policy)
    if budget is None:
        return v.with_(outcome=Outcome.UNBUDGETED, reason="no budget for this metric on this device")
    limits = _limits(info, budget)
    v = v.with_(limit=limits.bad)
    rounds = 1
    while (state := _state(v, limits, q, policy, final=more is None or rounds > policy.max_extra_rounds)) == "undecided":
        # The CI straddles the limit: measure more, bounded, then settle it (on the point estimate).
        assert more is not None
        fresh = list(more())
        problem = _check_finite(fresh)
        if problem:
            return v.with_(outcome=Outcome.ERROR, reason=f"extra round: {problem}", rounds=rounds + 1)
        rounds += 1
        v = _summarised(v, [*v.samples, *fresh], q, policy).with_(rounds=rounds)
    assert v.value is not None and v.ci is not None
    med, (lo, hi), bad = v.value, v.ci, limits.bad
    if state == "fail" and policy.confirm and more is not None:
        return _confirmed(v.with_(rounds=rounds), limits, more, q, policy)
    if state == "fail":
        return v.with_(outcome=Outcome.FAIL, rounds=rounds,
                       reason=f"median {med:.4g} with CI {lo:.4g}-{hi:.4g} is entirely beyond the limit {bad:.4g}")
    if state == "stale":
        return v.with_(outcome=Outcome.STALE, rounds=rounds,
                       reason=f"CI {lo:.4g}-{hi:.4g} beats the budget {budget.value:.4g} beyond its tolerance")
    if state == "pass":
        return v.with_(outcome=Outcome.PASS, rounds=rounds, reason="CI within budget")
    coverage = stats.quantile_ci(v.samples, q, policy.confidence)[2]
    short = (f"; {len(v.samples)} samples give the interval of the {q:g} quantile only {coverage:.0%} coverage"
             if q != 0.5 and coverage < policy.confidence else "")
    if settle(lo, hi, limits, evidence="stored", estimate=med) == "fail":
        return v.with_(outcome=Outcome.FAIL, rounds=rounds,
                       reason=f"CI {lo:.4g}-{hi:.4g} straddles the limit {bad:.4g} after {rounds} round(s); "
                              f"the median {med:.4g} is beyond it{short}")
    return v.with_(outcome=Outcome.PASS, rounds=rounds,
                   reason=f"CI straddles the limit {bad:.4g} after {rounds} round(s); the median {med:.4g} is within it{short}")


def _summarised(v: Verdict, xs: list[float], q: float, policy: VerdictPolicy) -> Verdict:
    """``v`` holding the samples ``xs``: their quantile ``q`` and its distribution-free interval."""
    lo, hi, _ = stats.quantile_ci(xs, q, policy.confidence)
    return v.with_(value=stats.quantile(xs, q), ci=(lo, hi), n=len(xs), cv=stats.cv(xs), samples=tuple(xs),
                   confidence=policy.confidence)


def _state(v: Verdict, limits: Limits, q: float, policy: VerdictPolicy, *, final: bool) -> str:
    """Where the interval of ``v`` lies against ``limits`` (:func:`classify`)."""
    assert v.ci is not None
    state = classify(v.ci[0], v.ci[1], limits, final=final)
    if state in ("pass", "stale") and q != 0.5 and stats.quantile_ci(v.samples, q, policy.confidence)[2] < policy.confidence:
        # All samples below the limit say little of a tail quantile when they are few (p90: 10 of them are
        # all below it 35 % of the time): as a straddle, more samples, then the point estimate. (A median of
        # few rounds, e.g. the lease's 3, is a choice of its owner, which says so.)
        return "inconclusive" if final else "undecided"
    return state


def _confirmed(v: Verdict, limits: Limits, more: More, q: float, policy: VerdictPolicy) -> Verdict:
    """A failure confirmed, or not, by an independent measurement before it fails."""
    assert v.value is not None and v.ci is not None
    fresh = list(more())
    problem = _check_finite(fresh)
    if problem:
        return v.with_(outcome=Outcome.ERROR, reason=f"confirmation: {problem}", rounds=v.rounds + 1)
    fmed = stats.quantile(fresh, q)
    flo, fhi, _ = stats.quantile_ci(fresh, q, policy.confidence)
    all_xs = [*v.samples, *fresh]
    agreed = limits.worse(fmed)
    (lo, hi), med, bad = v.ci, v.value, limits.bad
    v = v.with_(rounds=v.rounds + 1, samples=tuple(all_xs), n=len(all_xs), cv=stats.cv(all_xs), confirmed=agreed)
    if not agreed:
        return v.with_(outcome=Outcome.PASS, reason=f"first median {med:.4g} was beyond the limit {bad:.4g} but the "
                                                    f"confirmation median {fmed:.4g} (CI {flo:.4g}-{fhi:.4g}) was not")
    return v.with_(outcome=Outcome.FAIL, reason=f"median {med:.4g} with CI {lo:.4g}-{hi:.4g} is entirely beyond the "
                                                f"limit {bad:.4g}; confirmed by a fresh median of {fmed:.4g}")
