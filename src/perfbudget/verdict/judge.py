"""Judge a test's measurements: a check's verdict, the run's way of judging, budgets per check, the outcome."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from ..budgets.loader import BudgetSet
from ..budgets.schema import Budget, BudgetError
from ..device import DeviceInfo
from ..measure import stats
from ..measure.stats import median, quantile_ci
from ..metrics import OP_TIMED_FAMILIES, Metric, MetricName, family_of, parse_name
from ..settings import STABLE_MACHINE_ENV, RunSpec
from ..vocabulary import Outcome, RunMode, TestOutcome
from .rule import (
    BYTES_FLOOR_MIB,
    FAMILY_ALPHA,
    Limits,
    classify,
    family_confidence,
    settle,
    tolerance_for,
)

__all__ = ["DEFAULT_AB_PRECISION", "REFERENCE_MISMATCH", "STABLE_MACHINE_ENV", "ABSide", "Decision", "Judge",
           "JudgeConfig", "Judging", "Samples", "Stored", "Update", "Verdict", "VerdictPolicy",
           "ab_run_fails", "decide", "judging_for", "pinned_operators", "stable_identity"]

More = Callable[[], Sequence[float]]


@dataclass(frozen=True, kw_only=True)
class VerdictPolicy:
    """How statistical metrics are judged.

    Attributes:
        confidence: coverage of the distribution-free CI of the median.
        max_extra_rounds: fresh sample batches taken while the CI straddles the limit.
        confirm: before failing, take one fresh measurement and fail only if it agrees.
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
        outcome: the :class:`Outcome`; stale: better than the budget beyond its tolerance.
        value: the median (statistical kinds) or the worst value.
        ci: distribution-free CI of the median (statistical kinds only).
        n: samples behind ``value`` (all rounds).
        cv: coefficient of variation of the samples.
        budget: the budget, when one applies.
        limit: the failing limit: budget × (1 ± tolerance) on the bad side (bytes: >= ``BYTES_FLOOR_MIB`` above).
        rounds: sample batches measured (first + extra + confirmation).
        confirmed: for a statistical fail, whether the confirmation agreed.
        reason: one readable sentence.
        samples: raw samples (all rounds, including the confirmation).
        attribution: readable lines explaining where the time went.
        ref_ms: the machine-speed reference time (ms) normalised samples are expressed at.
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

    def as_(self, outcome: Outcome, reason: str, **changes: Any) -> Verdict:
        """This verdict with ``outcome`` for ``reason``."""
        return replace(self, outcome=outcome, reason=reason, **changes)


def _limits(metric: Metric, budget: Budget) -> Limits:
    # A bytes budget's bad limit is at least BYTES_FLOOR_MIB above it: a tolerance of 0 MiB allows no byte.
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
        more: returns a fresh batch of samples, for rounds while the CI straddles the limit and to confirm a fail.
        policy: statistical decision settings.

    Returns:
        The :class:`Verdict`. Bad samples (NaN, inf, empty) give outcome ``error``.
    """
    policy = policy or VerdictPolicy()
    name = metric if isinstance(metric, MetricName) else parse_name(metric)
    info = name.metric
    xs = [samples] if isinstance(samples, (int, float)) else list(samples)
    base = Verdict(key=key, metric=name.full, outcome=Outcome.ERROR, budget=budget, n=len(xs), name=name)
    if problem := _check_finite(xs):
        return base.with_(reason=problem, samples=tuple(x for x in xs if isinstance(x, (int, float))))
    xs = [float(x) for x in xs]
    value = max(xs) if info.direction == "lower" else min(xs)
    v = (_summarised(base, xs, info.quantile, policy) if info.statistical else
         base.with_(value=value, samples=tuple(xs), cv=stats.cv(xs) if len(xs) > 1 else None))
    if budget is None:
        return v.as_(Outcome.UNBUDGETED, "no budget for this metric on this device")
    limits = _limits(info, budget)
    v = v.with_(limit=limits.bad)
    if info.statistical:
        return _decide_stat(v, info.quantile, limits, budget, more, policy)
    state = classify(value, value, limits)
    if state == "fail":
        return v.as_(Outcome.FAIL, f"{value:g} is worse than the limit {limits.bad:g}")
    if state == "stale":
        return v.as_(Outcome.STALE, f"{value:g} beats the budget {budget.value:g} beyond its tolerance")
    return v.as_(Outcome.PASS, "within budget")


def _decide_stat(v: Verdict, q: float, limits: Limits, budget: Budget, more: More | None,
                 policy: VerdictPolicy) -> Verdict:
    while (state := _state(v, limits, q, policy, more)) == "undecided":
        # The CI straddles the limit: measure more, bounded, then settle it (on the point estimate).
        assert more is not None
        fresh = _fresh(more)
        if isinstance(fresh, str):
            return v.as_(Outcome.ERROR, f"extra round: {fresh}", rounds=v.rounds + 1)
        v = _summarised(v, [*v.samples, *fresh], q, policy).with_(rounds=v.rounds + 1)
    assert v.value is not None and v.ci is not None
    med, (lo, hi), bad, rounds = v.value, v.ci, limits.bad, v.rounds
    if state == "fail" and policy.confirm and more is not None:
        return _confirmed(v, limits, more, q, policy)
    if state == "fail":
        return v.as_(Outcome.FAIL, f"median {med:.4g} with CI {lo:.4g}-{hi:.4g} is entirely beyond the limit {bad:.4g}")
    if state == "stale":
        return v.as_(Outcome.STALE, f"CI {lo:.4g}-{hi:.4g} beats the budget {budget.value:.4g} beyond its tolerance")
    if state == "pass":
        return v.as_(Outcome.PASS, "CI within budget")
    coverage = stats.quantile_ci(v.samples, q, policy.confidence)[2]
    short = (f"; {len(v.samples)} samples give the interval of the {q:g} quantile only {coverage:.0%} coverage"
             if q != 0.5 and coverage < policy.confidence else "")
    if settle(lo, hi, limits, evidence="stored", estimate=med) == "fail":
        return v.as_(Outcome.FAIL, f"CI {lo:.4g}-{hi:.4g} straddles the limit {bad:.4g} after {rounds} round(s); "
                                   f"the median {med:.4g} is beyond it{short}")
    return v.as_(Outcome.PASS, f"CI straddles the limit {bad:.4g} after {rounds} round(s); "
                               f"the median {med:.4g} is within it{short}")


def _fresh(more: More) -> list[float] | str:
    """A fresh batch of samples, or what is wrong with it."""
    fresh = list(more())
    return _check_finite(fresh) or fresh


def _summarised(v: Verdict, xs: list[float], q: float, policy: VerdictPolicy) -> Verdict:
    """``v`` holding the samples ``xs``: their quantile ``q`` and its distribution-free interval."""
    lo, hi, _ = stats.quantile_ci(xs, q, policy.confidence)
    return v.with_(value=stats.quantile(xs, q), ci=(lo, hi), n=len(xs), cv=stats.cv(xs), samples=tuple(xs),
                   confidence=policy.confidence)


def _state(v: Verdict, limits: Limits, q: float, policy: VerdictPolicy, more: More | None) -> str:
    """Where the interval of ``v`` lies against ``limits`` (:func:`classify`), final once no round is left."""
    assert v.ci is not None
    final = more is None or v.rounds > policy.max_extra_rounds
    state = classify(v.ci[0], v.ci[1], limits, final=final)
    if state in ("pass", "stale") and q != 0.5 and stats.quantile_ci(v.samples, q, policy.confidence)[2] < policy.confidence:
        # All samples below the limit say little of a tail quantile when they are few (p90: 10 of them are
        # all below it 35 % of the time): as a straddle, more samples, then the point estimate.
        return "inconclusive" if final else "undecided"
    return state


def _confirmed(v: Verdict, limits: Limits, more: More, q: float, policy: VerdictPolicy) -> Verdict:
    """A failure confirmed, or not, by an independent measurement before it fails."""
    assert v.value is not None and v.ci is not None
    fresh = _fresh(more)
    if isinstance(fresh, str):
        return v.as_(Outcome.ERROR, f"confirmation: {fresh}", rounds=v.rounds + 1)
    fmed = stats.quantile(fresh, q)
    flo, fhi, _ = stats.quantile_ci(fresh, q, policy.confidence)
    all_xs = [*v.samples, *fresh]
    agreed = limits.worse(fmed)
    (lo, hi), med, bad = v.ci, v.value, limits.bad
    v = v.with_(rounds=v.rounds + 1, samples=tuple(all_xs), n=len(all_xs), cv=stats.cv(all_xs), confirmed=agreed)
    if not agreed:
        return v.as_(Outcome.PASS, f"first median {med:.4g} was beyond the limit {bad:.4g} but the "
                                   f"confirmation median {fmed:.4g} (CI {flo:.4g}-{fhi:.4g}) was not")
    return v.as_(Outcome.FAIL, f"median {med:.4g} with CI {lo:.4g}-{hi:.4g} is entirely beyond the "
                               f"limit {bad:.4g}; confirmed by a fresh median of {fmed:.4g}")


Samples = float | Sequence[float]
ByOutcome = Mapping[Outcome, tuple[Verdict, ...]]
Gathered = tuple[Samples, Callable[[], Any] | None, Sequence[float] | None]

#: Target half-width of a check's within-pair head/base ratio when one is asked for: +-1 %.
DEFAULT_AB_PRECISION = 0.01


class Judging:
    """What differs between the ways a run judges; the defaults are :class:`Stored`'s."""

    mode: ClassVar[RunMode] = RunMode.STORED
    writes_budgets: ClassVar[bool] = False
    """The session writes budgets from the run's records (and an empty run still finishes)."""
    takes_turns: ClassVar[bool] = False
    """The process takes turns with the other A/B side; the driver alone reads its results (no checkpoints, no HTML)."""
    screens: ClassVar[bool] = True
    """Timing is set aside on a busy or another machine, advisory off a stable one; else verdicts are as recorded."""
    only_errors_fail: ClassVar[bool] = False
    """Verdicts are shown; only errors (and under ``strict`` a budget not recorded) fail a test."""

    def gather(self, name: MetricName, samples: Samples, more: Callable[[], Any] | None,
               reference: Sequence[float] | None, *, confidence: float) -> Gathered:
        """The samples to judge, the source of more, and the reference times to normalise by."""
        return samples, more, reference

    def policy(self, policy: VerdictPolicy) -> VerdictPolicy:
        """The statistical settings a check is decided with."""
        return policy

    def settle(self, by: ByOutcome, *, strict: bool, missing: bool, verdicts: Sequence[Verdict]) -> tuple[
            TestOutcome, tuple[Verdict, ...]]:
        """The test's outcome and the verdicts that fail it, from its verdicts by outcome;
        ``missing``: a budget of this test's families was not recorded (no failure when budgets are written)."""
        missing = strict and missing and not self.writes_budgets
        if self.only_errors_fail:
            errors = by[Outcome.ERROR]
            return (TestOutcome.FAIL if errors or missing else TestOutcome.PASS), errors
        failing = [*by[Outcome.ERROR], *by[Outcome.FAIL]]
        if strict:
            failing += [*by[Outcome.STALE], *by[Outcome.UNBUDGETED], *by[Outcome.NOT_JUDGED],
                        *by[Outcome.INCONCLUSIVE], *(v for v in by[Outcome.ADVISORY] if v.advice == Outcome.FAIL)]
        if failing or missing:
            return TestOutcome.FAIL, tuple(failing)
        unmeasurable = by[Outcome.UNMEASURABLE]
        something_missing = (by[Outcome.NOT_JUDGED] or by[Outcome.UNBUDGETED] or by[Outcome.INCONCLUSIVE]
                             or (unmeasurable and len(unmeasurable) == len(verdicts)))
        return (TestOutcome.SKIP if something_missing else TestOutcome.PASS), ()

    def pinned_operators(self, nodeid: str, key: str) -> tuple[str, ...] | None:
        """The operators this run records for ``nodeid``'s ``key`` whatever their share (``None``: any)."""
        return None


@dataclass(frozen=True)
class Stored(Judging):
    """Judge against the stored budgets (the default)."""


@dataclass(frozen=True)
class Update(Judging):
    """``--update-budgets``: verdicts are shown and fail nothing but errors; budgets are written after."""

    mode: ClassVar[RunMode] = RunMode.UPDATE
    writes_budgets: ClassVar[bool] = True
    only_errors_fail: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class ABSide(Judging):
    """One side of a lockstep A/B run: record samples, judge nothing statistical.

    Attributes:
        precision: the half-width (a fraction) a check's head/base ratio should reach: fresh batches while its median's
            CI is wider than ``precision / sqrt(2)`` (each side carries half the variance); ``None``: one sample set.
        max_batches: most extra batches towards ``precision``.
        max_s: most seconds of extra batches, the other side's turns included.
        operators_file: the driver's file of pinned operators (from the side's :class:`~perfbudget.settings.RunSpec`).
    """

    mode: ClassVar[RunMode] = RunMode.COLLECT
    takes_turns: ClassVar[bool] = True
    only_errors_fail: ClassVar[bool] = True
    screens: ClassVar[bool] = False  # a busy machine is no reason to set samples aside: the other side shares it
    precision: float | None = None
    max_batches: int = 4
    max_s: float = 60.0
    operators_file: str = ""

    def __post_init__(self) -> None:
        if self.precision is not None and not 0 < self.precision < 1:
            raise ValueError(f"precision must be in (0, 1) or None, got {self.precision!r}")
        if self.max_batches < 0 or self.max_s < 0:
            raise ValueError(f"max_batches and max_s must be >= 0, got {self.max_batches!r}, {self.max_s!r}")

    def gather(self, name: MetricName, samples: Samples, more: Callable[[], Any] | None,
               reference: Sequence[float] | None, *, confidence: float) -> Gathered:
        # Both sides share the machine's state: the ratio is judged raw (normalising by a
        # reference measured beside each sample would cancel part of a real slowdown too).
        if name.metric.statistical:
            samples = self._to_precision(samples, more, confidence=confidence, paired=reference is not None)
        return samples, None, None

    def _to_precision(self, samples: Samples, more: Callable[[], Any] | None, *, confidence: float,
                      paired: bool) -> Samples:
        """The samples plus fresh batches while their median's CI is wider than this side's share of ``precision``."""
        if self.precision is None or more is None or isinstance(samples, (int, float)):
            return samples
        target = self.precision / math.sqrt(2)
        xs = list(samples)
        t0 = time.monotonic()
        for _ in range(self.max_batches):
            if _half_width(xs, confidence) <= target or time.monotonic() - t0 > self.max_s:
                break
            fresh = more()
            xs += list(fresh[0] if paired else fresh)
        return xs

    def policy(self, policy: VerdictPolicy) -> VerdictPolicy:
        return VerdictPolicy(confidence=policy.confidence, max_extra_rounds=0, confirm=False)

    def pinned_operators(self, nodeid: str, key: str) -> tuple[str, ...] | None:
        return pinned_operators(self.operators_file, nodeid, key)


def ab_run_fails(outcomes: Sequence[Outcome], *, inconclusive: bool, failed: bool, strict: bool) -> bool:
    """Whether an A/B run fails: a failing or erroring check, ``failed`` (the run could not measure what it
    was asked to), no check at all, or an ``inconclusive`` check under ``strict``."""
    bad = any(o in (Outcome.FAIL, Outcome.ERROR) for o in outcomes)
    return bad or failed or not outcomes or (strict and inconclusive)


def judging_for(*, collect: bool, update: bool, spec: RunSpec | None = None) -> Judging:
    """The run's way of judging from ``--perf-collect``, ``--update-budgets`` and an A/B side's run spec.

    Raises:
        ValueError: both at once.
    """
    if collect and update:
        raise ValueError("--perf-collect (one side of an A/B run) cannot be combined with --update-budgets")
    if collect:
        return ABSide(precision=spec.precision, operators_file=spec.operators_file) if spec else ABSide()
    return Update() if update else Stored()


def pinned_operators(path: str, nodeid: str, key: str) -> tuple[str, ...] | None:
    """The operators a lockstep A/B run pins for ``nodeid``'s ``key`` in the JSON file ``path`` (``None``: not pinned).

    Raises:
        ValueError: the file cannot be read or is not ``{nodeid: {key: [operator, ...]}}`` (naming the file).
    """
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"pinned operators {path}: cannot be read: {exc}") from None
    ops = data.get(nodeid, {}).get(key) if isinstance(data, dict) and isinstance(data.get(nodeid, {}), dict) else None
    if ops is None:
        return None
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ValueError(f"pinned operators {path}: [{nodeid!r}][{key!r}]: expected a list of operator names, "
                         f"got {ops!r}")
    return tuple(ops)


def _half_width(xs: Sequence[float], confidence: float) -> float:
    """Relative half-width of the distribution-free CI of the median of ``xs`` (inf: too few)."""
    if len(xs) < 2:
        return math.inf
    lo, hi, coverage = quantile_ci(xs, 0.5, confidence)
    mid = median(xs)
    if coverage < confidence or mid == 0:
        return math.inf
    return (hi - lo) / 2 / abs(mid)

def stable_identity(declared: str, device: DeviceInfo) -> str | None:
    """``device``'s identity when ``declared`` (env or ini value) declares this machine stable, else ``None``.

    Raises:
        ValueError: the declaration names another identity, or the device's identity is unknown.
    """
    declared = declared.strip()
    if not declared or declared.lower() in ("no", "false", "0"):
        return None
    ident = device.identity
    if ident is None:
        raise ValueError(f"{STABLE_MACHINE_ENV}/perfbudget_stable_machine={declared!r}: this {device.type} device's "
                         "identity is unknown, so no stored timing budget can be matched to it")
    if declared.lower() in ("yes", "true", "1") or declared.lower() == ident.lower():
        return ident
    raise ValueError(f"{STABLE_MACHINE_ENV}/perfbudget_stable_machine={declared!r} declares a stable machine, "
                     f"but this {device.type} device is {ident}: fix the declaration (or the runner) before "
                     "stored timing budgets may gate")

def not_gating(metric: Metric, device_type: str, budget: Budget | None, stable: str | None, budgets: BudgetSet) -> str:
    """Why a stored verdict of ``metric`` may not fail a test here (empty: it may); ``stable``: the machine's
    identity from :func:`stable_identity`. Used by the stored judge and for A/B checks not compared with the base."""
    if not metric.statistical:
        return ""
    if device_type in metric.advisory_on:
        return (f"on {device_type} a step's wall clock follows the host, not the device: a stored "
                "step_device_ms budget gates here; judge wall time with `perfbudget ab --base <ref>`")
    if stable is None:
        return (f"stored timing budgets gate only on a machine declared stable ({STABLE_MACHINE_ENV}); "
                "judge timing here with `perfbudget ab --base <ref>`")
    if budget is not None and not budgets.keyed_by(budget, stable):
        return (f"its file ({budget.source}) is not keyed by this machine's identity {stable}; record one "
                "with --update-budgets, or use `perfbudget ab`")
    return ""


def as_advisory(v: Verdict, why: str) -> Verdict:
    """``v`` shown, not gating: a pass, stale or fail becomes advisory, saying what it would be and ``why``."""
    if v.outcome not in (Outcome.PASS, Outcome.STALE, Outcome.FAIL):
        return v
    return v.with_(outcome=Outcome.ADVISORY, advice=v.outcome,
                   reason=f"advisory (would {'be ' if v.outcome != Outcome.FAIL else ''}{v.outcome}): {v.reason}; {why}")


#: Beyond this relative change of the machine-speed reference from the budget's, timing is not judged.
REFERENCE_MISMATCH = 0.30

@dataclass(frozen=True, kw_only=True)
class JudgeConfig:
    """How one test's measurements are judged.

    Attributes:
        strict: stale, unbudgeted, not-judged and not-measured checks fail the test.
        judging: the run's way of judging (:mod:`perfbudget.verdict.judge`), chosen once per run.
        policy: statistical settings.
        preflight: why timing is untrustworthy now (busy CPU, shared or throttled GPU): timing is not judged.
        family_alpha: false-alarm budget shared by one test's per-operator checks.
        reference_mismatch: see :data:`REFERENCE_MISMATCH`.
        stable_identity: this machine's identity when declared stable; stored timing gates only then (:func:`not_gating`).
    """

    strict: bool = False
    judging: Judging = field(default_factory=Stored)
    policy: VerdictPolicy = field(default_factory=VerdictPolicy)
    preflight: tuple[str, ...] = ()
    family_alpha: float = FAMILY_ALPHA
    reference_mismatch: float = REFERENCE_MISMATCH
    stable_identity: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.family_alpha < 1:
            raise ValueError(f"family_alpha must be in (0, 1), got {self.family_alpha!r}")
        if self.reference_mismatch <= 0:
            raise ValueError(f"reference_mismatch must be > 0, got {self.reference_mismatch!r}")


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What a test's verdicts mean for the test, as data (the report renders it).

    Attributes:
        outcome: ``pass``, ``skip`` (nothing failed, but something was not judged) or ``fail``.
        failing: verdicts that fail the test.
        judged: verdicts decided against a budget (pass, stale, fail or inconclusive).
        advisory: stored timing off a stable machine: shown with the would-be outcome, not deciding.
        not_judged: statistical checks skipped by the preflight or the reference guard.
        unbudgeted: measured with no budget on this device.
        unmeasurable: metrics that cannot be measured here (with the reason in each verdict).
        not_measured: ``(metric, reason)`` budgeted for this key and device but not recorded by the test.
        empty: the test used ``perf`` but recorded nothing.
    """

    outcome: TestOutcome
    failing: tuple[Verdict, ...] = ()
    judged: tuple[Verdict, ...] = ()
    advisory: tuple[Verdict, ...] = ()
    not_judged: tuple[Verdict, ...] = ()
    unbudgeted: tuple[Verdict, ...] = ()
    unmeasurable: tuple[Verdict, ...] = ()
    not_measured: tuple[tuple[str, str], ...] = ()
    empty: bool = False


class Judge:
    """Judges the measurements of one workload ``key`` on one ``device`` against ``budgets``."""

    def __init__(self, key: str, device: DeviceInfo, budgets: BudgetSet, config: JudgeConfig | None = None) -> None:
        self.key = key
        self.device = device
        self.budgets = budgets
        self.config = config or JudgeConfig()

    def budgeted(self) -> dict[str, Budget]:
        """Every metric budgeted for this key on this device (empty when budgets are broken)."""
        if self.budgets.errors_for(self.key, self.device):
            return {}
        try:
            return self.budgets.budgets_for(self.key, self.device)
        except BudgetError:
            return {}

    def policy_for(self, name: MetricName) -> VerdictPolicy:
        """The test's per-operator checks share :attr:`JudgeConfig.family_alpha` (:func:`~perfbudget.rule.family_confidence`)."""
        policy = self.config.judging.policy(self.config.policy)
        n = sum(1 for m in self.budgeted() if family_of(m) in OP_TIMED_FAMILIES) if name.metric.name in OP_TIMED_FAMILIES else 0
        return replace(policy, confidence=family_confidence(name.full, policy.confidence, self.config.family_alpha, n))

    def judge(
        self,
        name: MetricName,
        samples: Samples,
        *,
        more: Callable[[], Any] | None = None,
        reference: Sequence[float] | None = None,
    ) -> Verdict:
        """Judge one metric's samples against its budget.

        Args:
            name: the parsed metric name.
            samples: one value (exact kinds) or raw samples (statistical kinds).
            more: a fresh batch of samples (with ``reference``: a ``(samples, reference)`` pair).
            reference: machine-speed reference times paired with ``samples``, which are expressed at
                the budget's ``ref_ms`` (a new budget: this run's median): ``x * ref_ms / r`` for times.
        """
        samples, more, reference = self.config.judging.gather(name, samples, more, reference,
                                                              confidence=self.config.policy.confidence)
        budget, problem = self.budgets.lookup(self.key, name.full, self.device)
        if problem:
            # Keep what was measured, so a broken budget file loses no data.
            return decide(self.key, name, samples, None, policy=self.config.policy).as_(Outcome.ERROR, problem)
        if not self.config.judging.screens:
            return self.recorded_verdict(name, samples, budget)
        return self.stored_verdict(name, samples, budget, more=more, reference=reference)

    def recorded_verdict(self, name: MetricName, samples: Samples, budget: Budget | None) -> Verdict:
        """The verdict of the samples as recorded: no screen (under the run's policy)."""
        return decide(self.key, name, samples, budget, policy=self.policy_for(name))

    def stored_verdict(self, name: MetricName, samples: Samples, budget: Budget | None, *,
                       more: Callable[[], Any] | None, reference: Sequence[float] | None) -> Verdict:
        """The verdict against a stored budget (or none): advisory, set aside or decided."""
        # An unbudgeted timing metric off a stable machine is advisory too: a budget written there
        # would not gate either, so asking for one (a skip) would be noise.
        busy = f" (measured while {'; '.join(self.config.preflight)})" if self.config.preflight else ""
        why = not_gating(name.metric, self.device.type, budget, self.config.stable_identity, self.budgets)
        advisory = bool(why)
        # A busy machine sets aside only what could fail: an advisory check is shown anyway.
        if self.config.preflight and name.metric.statistical and not advisory:
            return self._not_judged(name, samples, budget, "preflight: " + "; ".join(self.config.preflight))
        ref_ms: float | None = None
        if reference is not None:
            if mismatch := self._reference_mismatch(reference, budget):
                return self._not_judged(name, samples, budget, mismatch)
            samples, more, ref_ms = _normalised(name, samples, reference, more, budget)
        if advisory:
            more = None  # an advisory verdict fails nothing: no extra rounds, no confirmation
        v = decide(self.key, name, samples, budget, more=more, policy=self.policy_for(name)).with_(ref_ms=ref_ms)
        if advisory and v.outcome == Outcome.UNBUDGETED:
            return v.as_(Outcome.ADVISORY, f"advisory: no stored budget for it on this machine; {why}{busy}",
                         advice="")
        return as_advisory(v, why + busy) if advisory else v

    def _not_judged(self, name: MetricName, samples: Samples, budget: Budget | None, reason: str) -> Verdict:
        """A statistical verdict set aside (busy machine, another machine); bad samples stay an error."""
        v = decide(self.key, name, samples, None, policy=self.config.policy)
        if v.outcome == Outcome.ERROR:
            return v.with_(budget=budget)
        return v.as_(Outcome.NOT_JUDGED, reason, budget=budget)

    def _reference_mismatch(self, reference: Sequence[float], budget: Budget | None) -> str:
        """Why this machine is not the one the budget describes, judged by the reference."""
        prov = budget.provenance if budget is not None else None
        if prov is None or not prov.ref_ms or not reference:
            return ""
        now = median(reference)
        change = now / prov.ref_ms - 1
        if abs(change) <= self.config.reference_mismatch:
            return ""
        return (f"the machine-speed reference ran {now:.3g} ms here vs {prov.ref_ms:.3g} ms when the "
                f"budget was measured ({change:+.0%}): a different or busier machine than the budget describes")

    def decision(self, verdicts: Sequence[Verdict]) -> Decision:
        """What the recorded verdicts mean for the test."""
        cfg = self.config
        if not verdicts:
            return Decision(outcome=TestOutcome.FAIL, empty=True)
        by = {o: tuple(v for v in verdicts if v.outcome == o) for o in Outcome}
        recorded = {v.metric for v in verdicts}
        not_measured = tuple(
            (m, "budgeted for this key on this device, but the test did not record it")
            for m in sorted(self.budgeted()) if m not in recorded and self._owned_by_test(m, recorded)
        )
        outcome, failing = cfg.judging.settle(by, strict=cfg.strict, missing=bool(not_measured), verdicts=verdicts)
        judged = (*by[Outcome.PASS], *by[Outcome.STALE], *by[Outcome.FAIL], *by[Outcome.INCONCLUSIVE])
        return Decision(outcome=outcome, failing=failing, judged=judged, advisory=by[Outcome.ADVISORY],
                        not_judged=by[Outcome.NOT_JUDGED], unbudgeted=by[Outcome.UNBUDGETED],
                        unmeasurable=by[Outcome.UNMEASURABLE], not_measured=not_measured)

    @staticmethod
    def _owned_by_test(metric: str, recorded: set[str]) -> bool:
        """Whether a budgeted metric the test did not record is of a family it recorded (one key's
        metrics are spread over a step test, an operator test, a memory test)."""
        family = family_of(metric)
        return any(family_of(r) == family for r in recorded)


def _normalised(
    name: MetricName,
    samples: Samples,
    reference: Sequence[float],
    more: Callable[[], Any] | None,
    budget: Budget | None,
) -> tuple[list[float], Callable[[], Sequence[float]] | None, float]:
    xs = [samples] if isinstance(samples, (int, float)) else list(samples)
    if len(xs) != len(reference) or not reference or min(reference) <= 0:
        raise ValueError(f"{name.full}: reference must pair one positive time with each sample")
    prov = budget.provenance if budget is not None else None
    frame = prov.ref_ms if prov is not None and prov.ref_ms else median(reference)
    higher = name.metric.direction == "higher"

    def scale(values: Sequence[float], refs: Sequence[float]) -> list[float]:
        if higher:
            return [x * r / frame for x, r in zip(values, refs, strict=True)]
        return [x * frame / r for x, r in zip(values, refs, strict=True)]

    scaled_more = (lambda: scale(*more())) if more is not None else None
    return scale(xs, reference), scaled_more, frame
