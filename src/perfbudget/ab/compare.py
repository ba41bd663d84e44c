"""Merge the records of process pairs into one A/B record per check; decides, never measures.

Statistical checks (timing, rate, energy) are judged on head/base (``ab.verdict``); exact
and bytes checks keep the head's own verdict against the budgets and show any change
from the base. A check the base cannot give (it failed to run, lacks the test, errored)
is "not compared" and judged against the stored budgets alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..budgets.loader import BudgetSet
from ..budgets.schema import Budget, BudgetError
from ..budgets.verdict import Verdict, decide
from ..extras import ExtraError
from ..measure import stats
from ..metrics import Metric, UnknownMetricError, parse_name
from ..results import BaseSide, BudgetRef, Record, Results
from .verdict import ABPolicy, RatioVerdict, describe_change, judge_ratios, pair_ratio

__all__ = ["AB_INFO", "ABInfo", "CheckId", "Comparison", "PairRecords", "compare_pairs"]

CheckId = tuple[str, str, str]
"""``(nodeid, key, metric)``: the same check on both sides."""

#: Outcomes of a side's record that carry a measurement to compare (others are kept as they are:
#: error, unmeasurable, not_measured).
_MEASURED = ("pass", "stale", "fail", "unbudgeted")
#: A statistical check "not judged" by a side's preflight (a busy CPU, a shared GPU) still holds
#: its samples: in lockstep both sides ran under that same machine state, which is what the
#: A/B comparison is for.
_PREFLIGHT = "preflight:"


def _usable(r: Record | None) -> bool:
    if r is None or not (r.value is not None or r.samples):
        return False
    return r.outcome in _MEASURED or (r.outcome == "unmeasurable" and r.reason.startswith(_PREFLIGHT)
                                      and bool(r.samples))


@dataclass(frozen=True, kw_only=True)
class PairRecords:
    """The results of one process pair, as read from the sides' files."""

    head: Results | None
    """``None``: the head side wrote no usable results this pair."""
    base: Results | None
    """``None``: the base side wrote no usable results this pair."""
    base_problem: str = ""
    """Why ``base`` is missing (exit status and the end of its output)."""


#: Key of :class:`ABInfo` in a record's ``extra``.
AB_INFO = "ab"


@dataclass(frozen=True, kw_only=True)
class ABInfo:
    """How a record's verdict was reached in an A/B run (``extra["ab"]``, beside ``record.base``)."""

    compared: bool
    """Judged against the base; otherwise against the stored budgets alone."""
    tolerance: float | None = None
    """The relative tolerance applied to head/base (statistical checks)."""
    tolerance_from: str = ""
    """``budgets/cpu.yaml:12``, or ``default for timing`` when the check has no budget."""
    by_estimate: bool = False
    """Decided on the point estimate after the last pair (its CI straddled the tolerance)."""
    sd: float | None = None
    """Pooled per-pair sd of ln(head/base) behind the CI."""
    note: str = ""
    """Why it was not compared (``the base lacks it``)."""

    def to_extra(self) -> dict[str, Any]:
        """``{"ab": {"compared", "tolerance", "tolerance_from", "by_estimate", "sd", "note"}}``."""
        return {AB_INFO: {"compared": self.compared, "tolerance": self.tolerance,
                          "tolerance_from": self.tolerance_from, "by_estimate": self.by_estimate,
                          "sd": self.sd, "note": self.note}}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> ABInfo | None:
        """Read it back from a record's ``extra``; ``None`` for a record not made by ``perfbudget ab``.

        Raises:
            ExtraError: naming the key and the bad value.
        """
        value = extra.get(AB_INFO)
        if value is None:
            return None
        if not isinstance(value, Mapping) or not isinstance(value.get("compared"), bool):
            raise ExtraError(f"extra[{AB_INFO!r}]: expected {{'compared': bool, ...}}, got {value!r}")
        numbers = {k: value.get(k) for k in ("tolerance", "sd")}
        bad = {k: v for k, v in numbers.items() if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))}
        if bad:
            raise ExtraError(f"extra[{AB_INFO!r}]: expected numbers or null, got {bad!r}")
        return cls(compared=value["compared"], tolerance=numbers["tolerance"],
                   tolerance_from=str(value.get("tolerance_from", "")), by_estimate=bool(value.get("by_estimate")),
                   sd=numbers["sd"], note=str(value.get("note", "")))


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Every check of a run, merged over its pairs."""

    records: list[Record]
    """One record per head check, in the head's order (provisional while ``undecided``)."""
    undecided: tuple[CheckId, ...] = ()
    """Statistical checks whose CI still straddles the tolerance (only when not final)."""
    not_compared: tuple[CheckId, ...] = ()
    """Checks judged against the stored budgets alone."""
    base_only: tuple[CheckId, ...] = field(default=())
    """Checks the base has and the head does not (shown, not judged)."""


def _id(r: Record) -> CheckId:
    return (r.nodeid, r.key, r.metric)


def _index(results: Results | None) -> dict[CheckId, Record]:
    return {} if results is None else {_id(r): r for r in results.records}


def _metric(r: Record) -> Metric | None:
    try:
        return parse_name(r.metric).metric
    except UnknownMetricError:
        return None


def _samples(r: Record) -> list[float]:
    xs = [x for x in r.samples if math.isfinite(x)]
    if xs:
        return xs
    return [r.value] if r.value is not None and math.isfinite(r.value) else []


def compare_pairs(
    pairs: Sequence[PairRecords],
    *,
    budgets: BudgetSet,
    policy: ABPolicy | None = None,
    final: bool = False,
) -> Comparison:
    """Merge the pairs' records into one record per head check.

    Args:
        pairs: every pair run so far, in order.
        budgets: the head's budgets (tolerances; the verdicts of checks not compared).
        policy: A/B decision settings.
        final: no more pairs will run: decide straddling checks on the point estimate.
    """
    policy = policy or ABPolicy()
    heads = [_index(p.head) for p in pairs]
    bases = [_index(p.base) for p in pairs]
    order: dict[CheckId, None] = {}
    for h in heads:
        order.update(dict.fromkeys(h))
    records: list[Record] = []
    undecided: list[CheckId] = []
    not_compared: list[CheckId] = []
    for cid in order:
        used = [(h[cid], b.get(cid)) for h, b in zip(heads, bases, strict=True) if cid in h]
        rec, state = _merge_one(used, pairs, budgets=budgets, policy=policy, final=final)
        records.append(rec)
        if state == "undecided":
            undecided.append(cid)
        elif state == "not compared":
            not_compared.append(cid)
    base_only = tuple(dict.fromkeys(c for b in bases for c in b if c not in order))
    return Comparison(records=records, undecided=tuple(undecided), not_compared=tuple(not_compared),
                      base_only=base_only)


def _merge_one(
    used: list[tuple[Record, Record | None]],
    pairs: Sequence[PairRecords],
    *,
    budgets: BudgetSet,
    policy: ABPolicy,
    final: bool,
) -> tuple[Record, str]:
    """One check's merged record and its state: pass/fail/undecided/not compared/kept."""
    head0 = used[0][0]
    info = _metric(head0)
    if not _usable(head0) or info is None:
        return head0, "kept"
    budget: Budget | None = None
    if head0.device is not None:
        errors = budgets.errors_for(head0.key, head0.device)
        try:
            budget = budgets.resolve(head0.key, head0.metric, head0.device)
        except BudgetError as exc:
            errors = [exc, *errors]
        if errors:
            return head0.with_(outcome="error", reason=f"budgets: {errors[0]}"), "kept"
    if not info.statistical:
        return _merge_exact(head0, used, pairs), "kept"
    ratios: list[float] = []
    head_stats: list[float] = []
    base_stats: list[float] = []
    head_xs: list[float] = []
    base_xs: list[float] = []
    problems: list[str] = []
    for head, base in used:
        if not _usable(head):
            problems.append(f"head {head.outcome}: {head.reason}" if head.reason else f"head {head.outcome}")
            continue
        hx = _samples(head)
        if base is None or not _usable(base):
            if base is not None:
                problems.append(f"base {base.outcome}: {base.reason}" if base.reason else f"base {base.outcome}")
            continue
        bx = _samples(base)
        try:
            ratios.append(pair_ratio(hx, bx, quantile=info.quantile))
        except ValueError as exc:
            problems.append(str(exc))
            continue
        head_stats.append(stats.quantile(hx, info.quantile))
        base_stats.append(stats.quantile(bx, info.quantile))
        head_xs.extend(hx)
        base_xs.extend(bx)
    if not ratios:
        why = _why_not(used, pairs, problems)
        if head0.outcome == "unmeasurable":  # not judged by the head's preflight: nothing to judge alone
            ab = ABInfo(compared=False, note=why)
            return head0.with_(reason=f"not compared with the base: {why}; {head0.reason}",
                               extra={**head0.extra, **ab.to_extra()}), "not compared"
        return _not_compared(head0, used, budget, why), "not compared"
    if budget is not None and policy.tolerance_from_budgets and budget.ab_tolerance is not None:
        tolerance, source = budget.ab_tolerance, BudgetRef.of(budget).where
    else:
        tolerance, source = info.default_tolerance, f"default for {info.kind}"
    rv = judge_ratios(ratios, tolerance=tolerance, direction=info.direction, prior_sd=policy.sd_for(info.kind),
                      prior_df=policy.prior_df, confidence=policy.confidence, final=final)
    base_value = stats.median(base_stats)
    skipped = len(used) - len(ratios)
    reason = f"{rv.reason} [tolerance from {source}]"
    if skipped:
        reason += f"; {skipped} pair(s) not used ({problems[0] if problems else 'the base lacks it'})"
    ab = ABInfo(compared=True, tolerance=tolerance, tolerance_from=source, by_estimate=rv.by_estimate, sd=rv.sd)
    rec = head0.with_(
        outcome="fail" if rv.state == "fail" else "pass",
        value=stats.median(head_stats), ci=None, ci_confidence=None,
        n=len(head_xs), cv=stats.cv(head_xs) if len(head_xs) > 1 else None,
        budget=None if budget is None else BudgetRef.of(budget),
        limit=base_value * rv.limit, rounds=rv.pairs, confirmed=None, reason=reason,
        samples=tuple(head_xs),
        base=_base_side(rv, base_value, base_xs, ratios),
        extra={**head0.extra, **ab.to_extra()},
    )
    return rec, rv.state


def _base_side(rv: RatioVerdict, value: float, samples: list[float], ratios: list[float]) -> BaseSide:
    return BaseSide(value=value, samples=tuple(samples), ratio=rv.ratio, ratio_ci=rv.ci, pairs=rv.pairs,
                    pair_ratios=tuple(ratios))


def _why_not(used: list[tuple[Record, Record | None]], pairs: Sequence[PairRecords], problems: list[str]) -> str:
    if problems:
        return problems[0]
    if all(p.base is None for p in pairs):
        first = next((p.base_problem for p in pairs if p.base_problem), "")
        return f"the base could not run under this instrument ({first})" if first else \
            "the base could not run under this instrument"
    return "the base lacks it"


def _not_compared(head0: Record, used: list[tuple[Record, Record | None]], budget: Budget | None, why: str) -> Record:
    """Judge the head's samples (all pairs) against the stored budget alone."""
    samples = [x for head, _ in used if _usable(head) for x in _samples(head)]
    v = decide(head0.key, head0.metric, samples, budget)
    ab = ABInfo(compared=False, note=why)
    return _with_verdict(head0, v).with_(
        reason=f"not compared with the base: {why}; against the stored budget: {v.reason}",
        base=None, extra={**head0.extra, **ab.to_extra()},
    )


def _with_verdict(rec: Record, v: Verdict) -> Record:
    return rec.with_(
        outcome=v.outcome, value=v.value, ci=v.ci, ci_confidence=v.confidence if v.ci else None, n=v.n,
        cv=v.cv, budget=None if v.budget is None else BudgetRef.of(v.budget), limit=v.limit, rounds=v.rounds,
        confirmed=v.confirmed, reason=v.reason, samples=tuple(v.samples),
    )


def _merge_exact(head0: Record, used: list[tuple[Record, Record | None]], pairs: Sequence[PairRecords]) -> Record:
    """Keep the head's verdict against the budgets; say how the value differs from the base's."""
    head_values = _distinct(h.value for h, _ in used)
    base_values = _distinct(b.value for _, b in used if b is not None and _usable(b))
    reason = head0.reason
    if head0.value is None:
        return head0
    if not base_values:
        why = _why_not(used, pairs, [f"base {b.outcome}: {b.reason}" for _, b in used
                                     if b is not None and not _usable(b)])
        ab = ABInfo(compared=False, note=why)
        return head0.with_(reason=f"{reason}; not compared with the base: {why}",
                           extra={**head0.extra, **ab.to_extra()})
    base_value = base_values[0]
    change = describe_change(head0.value, base_value, unit=head0.unit)
    if len(head_values) > 1:
        change += f"; the head varies across pairs: {', '.join(f'{x:g}' for x in head_values)}"
    if len(base_values) > 1:
        change += f"; the base varies across pairs: {', '.join(f'{x:g}' for x in base_values)}"
    ratio = head0.value / base_value if base_value != 0 else None
    pairs_with_base = sum(1 for _, b in used if _usable(b))
    ab = ABInfo(compared=True)
    return head0.with_(
        reason=f"{reason}; vs base: {change}" if reason else f"vs base: {change}",
        base=BaseSide(value=base_value, ratio=ratio, pairs=pairs_with_base),
        extra={**head0.extra, **ab.to_extra()},
    )


def _distinct(values: Iterable[float | None]) -> list[float]:
    out: list[float] = []
    for v in values:
        if v is not None and not any(math.isclose(v, o, rel_tol=1e-9, abs_tol=1e-12) for o in out):
            out.append(v)
    return out
