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


Samples = float | Sequence[float]

#: Target half-width of a check's within-pair head/base ratio when one is asked for: +-1 %.
DEFAULT_AB_PRECISION = 0.01


ByOutcome = Mapping[Outcome, tuple[Verdict, ...]]


class Judging:
    """What differs between the ways a run judges (subclasses: :class:`Stored`, :class:`Update`,
    :class:`ABSide`); the defaults are :class:`Stored`'s."""

    mode: ClassVar[RunMode] = RunMode.STORED
    writes_budgets: ClassVar[bool] = False
    """The session writes budgets from the run's records (and an empty run still finishes)."""
    takes_turns: ClassVar[bool] = False
    """The process takes turns with the other side of an A/B run; its results are read by the
    driver only (no checkpoint after each test, no HTML report)."""
    screens: ClassVar[bool] = True
    """A busy machine or another machine sets timing aside, and stored timing is advisory off a
    machine declared stable; else a check's verdict is that of its samples as recorded."""

    def gather(self, name: MetricName, samples: Samples, more: Callable[[], Any] | None,
               reference: Sequence[float] | None, *, confidence: float) -> tuple[
            Samples, Callable[[], Any] | None, Sequence[float] | None]:
        """The samples to judge, the source of more, and the reference times to normalise by
        (``confidence``: of the checks' intervals)."""
        return samples, more, reference

    def policy(self, policy: VerdictPolicy) -> VerdictPolicy:
        """The statistical settings a check is decided with."""
        return policy

    def settle(self, by: ByOutcome, *, strict: bool, missing: bool, verdicts: Sequence[Verdict]) -> tuple[
            TestOutcome, tuple[Verdict, ...]]:
        """The test's outcome and the verdicts that fail it, from its verdicts by outcome;
        ``missing``: a budget of this test's families was not recorded."""
        failing = [*by[Outcome.ERROR], *by[Outcome.FAIL]]
        if strict:
            failing += [*by[Outcome.STALE], *by[Outcome.UNBUDGETED], *by[Outcome.NOT_JUDGED],
                        *by[Outcome.INCONCLUSIVE], *(v for v in by[Outcome.ADVISORY] if v.advice == Outcome.FAIL)]
        if failing or (strict and missing):
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

    def settle(self, by: ByOutcome, *, strict: bool, missing: bool, verdicts: Sequence[Verdict]) -> tuple[
            TestOutcome, tuple[Verdict, ...]]:
        errors = by[Outcome.ERROR]
        return (TestOutcome.FAIL if errors else TestOutcome.PASS), errors


@dataclass(frozen=True, kw_only=True)
class ABSide(Judging):
    """One side of a lockstep A/B run: record samples, judge nothing statistical.

    Attributes:
        precision: the half-width (a fraction) that a check's within-pair head/base ratio
            should reach: a check keeps taking fresh batches (each one in turns with the other
            side) while the CI of its own median is wider than ``precision / sqrt(2)`` (each
            side carries half the ratio's variance), up to ``max_batches`` extra batches or
            ``max_s`` seconds. Noisy checks get more samples, quiet ones none. ``None``: one
            fixed sample set.
        max_batches: see ``precision``.
        max_s: see ``precision`` (wall time of the extra batches, the other side's turns included).
        operators_file: the driver's file of pinned operators (named in the side's run spec,
            :class:`perfbudget.settings.RunSpec`); it writes the file after the first pair.
    """

    mode: ClassVar[RunMode] = RunMode.COLLECT
    takes_turns: ClassVar[bool] = True
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
               reference: Sequence[float] | None, *, confidence: float) -> tuple[
            Samples, Callable[[], Any] | None, Sequence[float] | None]:
        # Both sides share the machine's state: the ratio is judged raw (normalising by a
        # reference measured beside each sample would cancel part of a real slowdown too).
        if name.metric.statistical:
            samples = self._to_precision(samples, more, confidence=confidence, paired=reference is not None)
        return samples, None, None

    def _to_precision(self, samples: Samples, more: Callable[[], Any] | None, *, confidence: float,
                      paired: bool) -> Samples:
        """The samples extended by fresh batches while the CI of their median is wider than
        the side's share of :attr:`precision`."""
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

    def settle(self, by: ByOutcome, *, strict: bool, missing: bool, verdicts: Sequence[Verdict]) -> tuple[
            TestOutcome, tuple[Verdict, ...]]:
        errors = by[Outcome.ERROR]
        return (TestOutcome.FAIL if errors or (strict and missing) else TestOutcome.PASS), errors

    def pinned_operators(self, nodeid: str, key: str) -> tuple[str, ...] | None:
        return pinned_operators(self.operators_file, nodeid, key)


def ab_run_fails(outcomes: Sequence[Outcome], *, inconclusive: bool, failed: bool, strict: bool) -> bool:
    """Whether an A/B run fails (a stored run's tests are settled by :meth:`Judging.settle`): a failing or
    erroring check, ``failed`` (the run could not measure what it was asked to), no check at all, or an
    ``inconclusive`` check under ``strict``."""
    bad = any(o in (Outcome.FAIL, Outcome.ERROR) for o in outcomes)
    return bad or failed or not outcomes or (strict and inconclusive)


def judging_for(*, collect: bool, update: bool, spec: RunSpec | None = None) -> Judging:
    """The run's way of judging from its command line (``--perf-collect``, ``--update-budgets``) and,
    on a side of an A/B run, its run spec (precision, pinned operators).

    Raises:
        ValueError: both at once.
    """
    if collect and update:
        raise ValueError("--perf-collect (one side of an A/B run) cannot be combined with --update-budgets")
    if collect:
        return ABSide(precision=spec.precision, operators_file=spec.operators_file) if spec else ABSide()
    return Update() if update else Stored()


def pinned_operators(path: str, nodeid: str, key: str) -> tuple[str, ...] | None:
    """The operators a lockstep A/B run pins for ``nodeid``'s ``key`` (``None``: not pinned).

    Raises:
        ValueError: the file cannot be read or is not of the form above (naming the file).
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
    """``device``'s identity when ``declared`` (the env variable's or ini option's value) declares
    this machine stable, else ``None`` (empty, ``no``, ``false``, ``0``).

    Raises:
        ValueError: the declaration names another identity (the runner's hardware changed, or a
            setting was copied to another machine kind), or the device's identity is unknown.
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
    """Why a stored verdict of ``metric`` may not fail a test here (empty: it may), for the stored judge and
    for an A/B check not compared with the base alike. Stored timing gates only on a machine declared stable
    (``stable``: its identity, from :func:`stable_identity`) against a budget whose file is keyed by that
    identity; a metric advisory on this device type (a GPU step's wall clock) never gates."""
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


#: Beyond this relative change of the machine-speed reference against the budget's, the
#: machine is not the one the budget describes: timing checks are not judged.
REFERENCE_MISMATCH = 0.30

@dataclass(frozen=True, kw_only=True)
class JudgeConfig:
    """How one test's measurements are judged.

    Attributes:
        strict: stale, unbudgeted, not-judged and not-measured checks fail the test.
        judging: the run's way of judging (:mod:`perfbudget.verdict.judge`), chosen once per run.
        policy: statistical settings.
        preflight: reasons timing cannot be trusted right now (busy CPU, shared or
            throttled GPU): statistical checks are then not judged.
        family_alpha: false-alarm budget shared by one test's per-operator checks.
        reference_mismatch: see :data:`REFERENCE_MISMATCH`.
        stable_identity: this machine's identity when it is declared stable (ini
            ``perfbudget_stable_machine`` or :data:`STABLE_MACHINE_ENV`). Stored timing, rate
            and energy budgets gate only then, and only those in a file keyed by that identity;
            elsewhere they are ``advisory``: the same judgement, shown, never a failure (under
            ``strict`` an advisory fail fails).
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
        judged: verdicts decided against a budget (pass, stale or fail).
        advisory: statistical checks judged against stored budgets on a machine they do not
            describe as stable: shown with the would-be outcome, not part of the decision.
        not_judged: statistical checks skipped by the preflight or the reference guard.
        unbudgeted: measured with no budget on this device.
        unmeasurable: metrics that cannot be measured here (with the reason in each verdict).
        not_measured: budgeted for this key and device but not recorded by the test:
            ``(metric, reason)``.
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
    """Judges the measurements of one workload key on one device.

    Args:
        key: workload key of the budgets.
        device: the device measured.
        budgets: the loaded budget set.
        config: how to judge.
    """

    def __init__(self, key: str, device: DeviceInfo, budgets: BudgetSet, config: JudgeConfig | None = None) -> None:
        self.key = key
        self.device = device
        self.budgets = budgets
        self.config = config or JudgeConfig()

    # -- budgets --------------------------------------------------------------------------

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

    # -- one metric -----------------------------------------------------------------------

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
            more: a fresh batch of samples for extra rounds and confirmation (with
                ``reference``: a ``(samples, reference)`` pair).
            reference: machine-speed reference times paired with ``samples``; each sample
                is expressed at the budget's reference time (provenance ``ref_ms``; for a
                new budget, this run's median): ``x * ref_ms / r`` for times, ``x * r /
                ref_ms`` for rates.
        """
        samples, more, reference = self.config.judging.gather(name, samples, more, reference,
                                                              confidence=self.config.policy.confidence)
        budget, problem = self.budgets.lookup(self.key, name.full, self.device)
        if problem:
            # Keep what was measured, so a broken budget file loses no data.
            v = decide(self.key, name, samples, None, policy=self.config.policy)
            return v.with_(outcome=Outcome.ERROR, reason=problem)
        if not self.config.judging.screens:
            return self.recorded_verdict(name, samples, budget)
        return self.stored_verdict(name, samples, budget, more=more, reference=reference)

    def recorded_verdict(self, name: MetricName, samples: Samples, budget: Budget | None) -> Verdict:
        """The verdict of the samples as recorded: no screen (under the run's policy)."""
        return decide(self.key, name, samples, budget, policy=self.policy_for(name))

    def stored_verdict(self, name: MetricName, samples: Samples, budget: Budget | None, *,
                       more: Callable[[], Any] | None, reference: Sequence[float] | None) -> Verdict:
        """The verdict against a stored budget (or none): advisory, set aside or decided."""
        statistical = name.metric.statistical
        # Stored timing is a verdict only on a machine declared stable, against budgets keyed
        # by its identity; elsewhere it is shown (advisory) and `perfbudget ab` judges timing.
        # An unbudgeted timing metric on such a machine is advisory too: a budget written
        # there would not gate either, so asking for one (a skip) would be noise. A metric
        # advisory on this device type (a GPU step's wall clock) never gates, stable or not.
        busy = f" (measured while {'; '.join(self.config.preflight)})" if self.config.preflight else ""
        why = not_gating(name.metric, self.device.type, budget, self.config.stable_identity, self.budgets)
        advisory = bool(why)
        # A busy machine sets aside only what could fail: an advisory check is shown anyway.
        if self.config.preflight and statistical and not advisory:
            return _not_judged(decide(self.key, name, samples, None, policy=self.config.policy), budget,
                               "preflight: " + "; ".join(self.config.preflight))
        ref_ms: float | None = None
        if reference is not None:
            mismatch = self._reference_mismatch(reference, budget)
            if mismatch:
                return _not_judged(decide(self.key, name, samples, None, policy=self.config.policy), budget, mismatch)
            samples, more, ref_ms = _normalised(name, samples, reference, more, budget)
        if advisory:
            more = None  # an advisory verdict fails nothing: no extra rounds, no confirmation
        v = decide(self.key, name, samples, budget, more=more, policy=self.policy_for(name))
        if ref_ms is not None:
            v = v.with_(ref_ms=ref_ms)
        if advisory and v.outcome == Outcome.UNBUDGETED:
            return v.with_(outcome=Outcome.ADVISORY, advice="",
                           reason=f"advisory: no stored budget for it on this machine; {why}{busy}")
        return as_advisory(v, why + busy) if advisory else v

    def _reference_mismatch(self, reference: Sequence[float], budget: Budget | None) -> str:
        """Why this machine is not the one the budget describes, judged by the reference."""
        prov = budget.provenance if budget is not None else None
        if prov is None or not prov.ref_ms or not reference:
            return ""
        now = median(reference)
        change = now / prov.ref_ms - 1
        if abs(change) <= self.config.reference_mismatch:
            return ""
        return (
            f"the machine-speed reference ran {now:.3g} ms here vs {prov.ref_ms:.3g} ms when the "
            f"budget was measured ({change:+.0%}): a different or busier machine than the budget describes"
        )

    # -- the test -------------------------------------------------------------------------

    def decision(self, verdicts: Sequence[Verdict]) -> Decision:
        """What the recorded verdicts mean for the test."""
        cfg = self.config
        if not verdicts:
            return Decision(outcome=TestOutcome.FAIL, empty=True)
        by = {o: tuple(v for v in verdicts if v.outcome == o) for o in Outcome}
        not_judged = by[Outcome.NOT_JUDGED]
        unmeasurable = by[Outcome.UNMEASURABLE]
        recorded = {v.metric for v in verdicts}
        not_measured = tuple(
            (m, "budgeted for this key on this device, but the test did not record it")
            for m in sorted(self.budgeted()) if m not in recorded and self._owned_by_test(m, recorded)
        )
        outcome, failing = cfg.judging.settle(by, strict=cfg.strict, missing=bool(not_measured), verdicts=verdicts)
        judged = (*by[Outcome.PASS], *by[Outcome.STALE], *by[Outcome.FAIL], *by[Outcome.INCONCLUSIVE])
        return Decision(outcome=outcome, failing=failing, judged=judged,
                        advisory=by[Outcome.ADVISORY], not_judged=not_judged, unbudgeted=by[Outcome.UNBUDGETED],
                        unmeasurable=unmeasurable, not_measured=not_measured)

    @staticmethod
    def _owned_by_test(metric: str, recorded: set[str]) -> bool:
        """Whether a budgeted metric the test did not record belongs to this test.

        One key's metrics are spread over several tests (a step test, an operator test, a
        memory test), so a test answers for the families it recorded: an operator test that
        recorded ``op_count[aten::mm]`` answers for every budgeted ``op_count[...]``.
        """
        family = family_of(metric)
        return any(family_of(r) == family for r in recorded)


def _not_judged(v: Verdict, budget: Budget | None, reason: str) -> Verdict:
    """A statistical verdict set aside (busy machine, another machine): kept as measured;
    bad samples stay an error."""
    if v.outcome == Outcome.ERROR:
        return v.with_(budget=budget)
    return v.with_(outcome=Outcome.NOT_JUDGED, budget=budget, reason=reason)


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

    scaled_more = None
    if more is not None:
        def scaled_more() -> list[float]:
            fresh, refs = more()
            return scale(fresh, refs)

    return scale(xs, reference), scaled_more, frame
