"""Merge the records of process pairs into one A/B record per check; decides, never measures."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from ..budgets.loader import BudgetSet
from ..budgets.schema import Budget
from ..extras import InstructionProfile, OperatorMoves
from ..measure import stats
from ..measure.memory import Allocation
from ..measure.nvml import GpuClocks
from ..measure.operators import OpMove, op_metric
from ..metrics import (
    Metric,
    UnknownMetricError,
    op_family_sizes,
    parse_name,
)
from ..results import BaseSide, BudgetRef, Record, Results, SetAsidePair, is_unrecorded_budget
from ..verdict.judge import Verdict, as_advisory, decide, not_gating, stable_identity
from ..verdict.ratio import can_decide, judge_ratios, pair_ratio
from ..verdict.rule import (
    Limits,
    State,
    classify,
    family_confidence,
    same,
    tolerance_for,
    with_evidence,
)
from ..vocabulary import Outcome
from .ratios import ABPolicy, describe_change, outlying_pair, process_modes

__all__ = ["MAX_CLOCK_OFFSET", "CheckId", "Comparison", "PairRecords", "clock_refusal", "compare_pairs"]

CheckId = tuple[str, str, str]
"""``(nodeid, key, metric)``: the same check on both sides."""

#: Outcomes of a side's record that carry a measurement to compare. "Not judged" by a side's
#: preflight (a busy machine) is one: in lockstep both sides ran under that same state.
_MEASURED = (Outcome.PASS, Outcome.STALE, Outcome.FAIL, Outcome.UNBUDGETED, Outcome.ADVISORY, Outcome.NOT_JUDGED)


#: The most the sides' SM clocks may differ (median, and mean, over each side's busy samples) for a
#: pair's GPU timing to be compared: a clock-bound kernel's time moves up to one point per point of clock.
MAX_CLOCK_OFFSET = 0.01


_STOPPED = "the base was stopped at the time limit (--max-minutes) before it recorded it"


def clock_refusal(clocks: Mapping[str, GpuClocks], *, limit: float = MAX_CLOCK_OFFSET) -> str:
    """Why a pair's GPU timing cannot be compared, naming both sides' clocks; empty when it can
    (or neither side has a busy sample, unless NVML could not say whether the GPU worked)."""
    base, head = clocks.get("base"), clocks.get("head")
    if (base is None or not base.busy) and (head is None or not head.busy):
        if any(side is not None and side.unknown for side in (base, head)):
            return (f"the GPU's clock-event reasons could not be read, so the clocks it worked at are unknown "
                    f"(base {base.text if base else 'not sampled'}; head {head.text if head else 'not sampled'})")
        return ""
    if base is None or head is None or not base.busy or not head.busy:
        return (f"the GPU clocks of one side are unknown (base {base.text if base else 'not sampled'}; "
                f"head {head.text if head else 'not sampled'})")
    offsets = {what: h / b - 1.0 for what, h, b in (("median", head.sm_median_mhz, base.sm_median_mhz),
                                                     ("mean", head.sm_mean_mhz, base.sm_mean_mhz))
               if h is not None and b}
    if not offsets:
        return f"the GPU clocks cannot be compared (base {base.text}; head {head.text})"
    worst = max(offsets, key=lambda k: abs(offsets[k]))
    if abs(offsets[worst]) <= limit:
        return ""
    return (f"the sides' GPU SM clocks differ by {offsets[worst]:+.2%} ({worst}; limit {limit:.0%}): "
            f"base {base.text}; head {head.text}")


def _usable(r: Record | None) -> bool:
    return r is not None and (r.value is not None or bool(r.samples)) and r.outcome in _MEASURED


@dataclass(frozen=True, kw_only=True)
class PairRecords:
    """The results of one process pair, as read from the sides' files."""

    head: Results | None
    """``None``: no usable results this pair (so for ``base``)."""
    base: Results | None
    base_problem: str = ""
    """Why ``base`` is missing (exit status and the end of its output)."""
    index: int = 0
    """The pair's number in the run (0: its position in the list, from 1)."""
    stopped: tuple[str, ...] = ()
    """Sides stopped at the time limit: their results hold only the tests they finished."""
    clocks: Mapping[str, GpuClocks] = field(default_factory=dict)
    """Per side, the GPU clocks over its turns (empty without NVML)."""

    @cached_property
    def refused(self) -> str:
        """Why this pair's GPU timing is not compared (:func:`clock_refusal`), empty when it is."""
        return clock_refusal(self.clocks)

    @cached_property
    def unlike(self) -> str:
        """How the sides measured differently (``threads 1 vs 2``, base first); empty when alike or unknown."""
        head, base = (None if r is None else r.meta.measured for r in (self.head, self.base))
        return "; ".join(head.differences(base)) if head is not None and base is not None else ""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Every check of a run, merged over its pairs."""

    records: list[Record]
    """One record per head check, in the head's order (provisional while ``undecided``)."""
    undecided: tuple[CheckId, ...] = ()
    """Checks that want another pair (only when not final)."""
    inconclusive: tuple[CheckId, ...] = ()
    """Statistical checks whose CI still straddles the tolerance after the last pair."""
    not_compared: tuple[CheckId, ...] = ()
    """Checks judged against the stored budgets alone."""
    beyond_reach: tuple[CheckId, ...] = ()
    """Checks still straddling that the pairs left would not decide (``verdict.can_decide``)."""
    base_only: tuple[CheckId, ...] = field(default=())
    """Checks the base has and the head does not (shown, not judged)."""
    not_comparable: tuple[CheckId, ...] = ()
    """Checks no pair could compare: the sides measured differently (an error)."""


def _index(results: Results | None) -> dict[CheckId, Record]:
    return {} if results is None else {(r.nodeid, r.key, r.metric): r for r in results.records}



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
    min_pairs: int = 1,
    require_base: bool = False,
    pairs_left: int | None = None,
    stable_machine: str = "",
) -> Comparison:
    """Merge the pairs' records into one record per head check.

    Args:
        pairs: every valid pair run so far, in order (a pair may hold only some tests).
        budgets: the head's budgets (tolerances; the verdicts of checks not compared).
        policy: A/B decision settings.
        final: no more pairs will run: a check whose CI still straddles is inconclusive.
        min_pairs: pairs compared before a statistical check may be decided.
        require_base: no base results make a statistical check an error, not a stored-budget verdict.
        pairs_left: pairs the run may still start; a check they would not decide is ``beyond_reach``.
        stable_machine: the run's stable-machine declaration, as in a stored run.
    """
    policy = policy or ABPolicy()
    numbered = [p if p.index else replace(p, index=i) for i, p in enumerate(pairs, 1)]
    heads = [_index(p.head) for p in numbered]
    bases = [_index(p.base) for p in numbered]
    order: dict[CheckId, None] = {}
    for h in heads:
        order.update(dict.fromkeys(h))
    # A later pair's session reports every budget of tests it did not re-run as "budgeted, not
    # recorded": moot where another pair recorded them, as when shards merge (results.merge_results).
    recorded = {(key, metric) for h in heads for (_, key, metric), r in h.items() if not is_unrecorded_budget(r)}
    moot = {c for side in (*heads, *bases) for c in side if not c[0] and (c[1], c[2]) in recorded}
    for cid in moot & set(order):
        del order[cid]
    in_base = {c for b in bases for c in b}
    family = op_family_sizes((nodeid, metric) for nodeid, _, metric in order)
    context = _Context(budgets=budgets, policy=policy, final=final, min_pairs=min_pairs, pairs_left=pairs_left,
                       base_ran=any(p.base is not None or "base" in p.stopped for p in numbered),
                       require_base=require_base, stable_machine=stable_machine,
                       base_problem=next((p.base_problem for p in numbered if p.base_problem), ""))
    records: list[Record] = []
    by_state: dict[Merged, list[CheckId]] = {}
    for cid in order:
        used = [_Used(pair=p, head=h[cid], base=b.get(cid)) for p, h, b in zip(numbered, heads, bases, strict=True)
                if cid in h]
        confidence = family_confidence(cid[2], policy.confidence, policy.family_alpha, family.get(cid[0], 0))
        rec, state = _merge_one(used, context, confidence=confidence, base_has_it=cid in in_base)
        records.append(rec)
        by_state.setdefault(state, []).append(cid)
    # A check of a base whose head was stopped first is one the head did not reach, not one it lacks.
    base_only = tuple(dict.fromkeys(c for p, b in zip(numbered, bases, strict=True) if "head" not in p.stopped
                                    for c in b if c not in order and c not in moot))
    return Comparison(records=_with_moved_operators(records), base_only=base_only,
                      **{name: tuple(by_state.get(state, ())) for name, state in _STATES.items()})


Merged = Literal[State, "kept", "not compared", "not comparable"]
"""Where a check's merge left it: a ratio verdict's :data:`~perfbudget.verdict.rule.State`, or ``kept`` (the head's)."""
Gap = Literal["problem", "absent", "unlike", "refused"]
"""Why a pair gives a check no head/base ratio: a side unusable or stopped, the base ``absent`` (no
evidence either way), the sides ``unlike``, or their GPU clocks ``refused``."""
#: The field of :class:`Comparison` that lists the checks whose merge left them in each state.
_STATES: dict[str, Merged] = {"undecided": "undecided", "inconclusive": "inconclusive", "not_compared": "not compared",
                              "beyond_reach": "beyond reach", "not_comparable": "not comparable"}


def _with_moved_operators(records: list[Record]) -> list[Record]:
    """Failing records with their test's operators that moved, against the base where compared."""
    by_test: dict[tuple[str, str], list[OpMove]] = {}
    for r in records:
        move = _op_move(r)
        if move is not None:
            by_test.setdefault((r.nodeid, r.key), []).append(move)
    out = []
    for r in records:
        moved = OperatorMoves.of(by_test.get((r.nodeid, r.key), ()))
        out.append(r.with_(extra={**r.extra, **moved.to_extra()}) if r.outcome == Outcome.FAIL and moved.moves else r)
    return out


def _op_move(r: Record) -> OpMove | None:
    """A per-operator record as the move it made: against the base commit when compared with it."""
    parsed = op_metric(r.metric)
    info = _metric(r)
    if parsed is None or info is None or r.value is None or not math.isfinite(r.value):
        return None
    vs = r.vs_base
    base = vs.value if vs is not None and vs.value is not None and math.isfinite(vs.value) else None
    budget = r.budget.value if r.budget is not None else None
    before = base if base is not None else budget
    if before is None:
        return None
    tolerance = (vs.tolerance if vs is not None and base is not None and vs.tolerance is not None
                 else tolerance_for(info, r.budget).value)
    ratio = vs.ratio if vs is not None and base is not None else None
    return OpMove(op=parsed[1], family=parsed[0], before=before, after=r.value,
                  against="base" if base is not None else "budget", unit=r.unit, tolerance=tolerance,
                  failing=r.outcome in (Outcome.FAIL, Outcome.ERROR), outcome=r.outcome,
                  ratio=ratio if ratio is not None and math.isfinite(ratio) else None)


@dataclass(frozen=True, kw_only=True)
class _Context:
    """What every check's merge needs to know about the run."""

    budgets: BudgetSet
    policy: ABPolicy
    final: bool
    min_pairs: int
    base_ran: bool
    """Some pair has the base's results, or stopped the base at the time limit."""
    require_base: bool
    base_problem: str
    pairs_left: int | None = None
    """``None``: unknown, every straddling check wants another."""
    stable_machine: str = ""


@dataclass(frozen=True)
class _Taken:
    """One pair's head/base of a statistical check, with the sides' samples behind it."""

    pair: int
    ratio: float
    head: list[float]
    base: list[float]


@dataclass(frozen=True, kw_only=True)
class _Used:
    """One pair in which the head recorded the check."""

    pair: PairRecords
    head: Record
    base: Record | None


def _merge_one(used: list[_Used], ctx: _Context, *, confidence: float, base_has_it: bool) -> tuple[Record, Merged]:
    """One check's merged record and its state: pass/fail/undecided/inconclusive/not compared/kept."""
    head0 = used[0].head
    info = _metric(head0)
    if not _usable(head0) or info is None:
        return head0, "kept"
    budget: Budget | None = None
    if head0.device is not None:
        budget, problem = ctx.budgets.lookup(head0.key, head0.metric, head0.device)
        if problem:
            return head0.with_(outcome=Outcome.ERROR, reason=problem), "kept"
    if not info.statistical:
        return _merge_exact(head0, used, ctx, base_has_it=base_has_it), "kept"
    taken, skipped, gaps = _take(used, info)
    if not taken:
        return _without_ratios(head0, used, budget, ctx, gaps, base_has_it=base_has_it)
    return _with_ratios(head0, used, budget, ctx, info, taken, skipped, confidence=confidence)


def _take(used: Sequence[_Used], info: Metric) -> tuple[list[_Taken], list[str], dict[Gap, list[str]]]:
    """The pairs that give a check a head/base ratio; the others as ``pair 2 (why)``, and whys by gap."""
    taken: list[_Taken] = []
    skipped: list[str] = []  # "pair 2 (the base did not record it there)"
    gaps: dict[Gap, list[str]] = {"problem": [], "unlike": [], "refused": []}
    head0 = used[0].head
    on_gpu = head0.device is not None and head0.device.type == "cuda"
    for u in used:
        kind, why = _gap(u, on_gpu=on_gpu)
        if kind is None:
            assert u.base is not None
            hx, bx = _samples(u.head), _samples(u.base)
            try:
                # Paired only with every sample finite on both sides: positions still match request for request.
                paired = info.paired and len(u.head.samples) == len(hx) and len(u.base.samples) == len(bx)
                taken.append(_Taken(pair=u.pair.index, ratio=pair_ratio(hx, bx, quantile=info.quantile, paired=paired),
                                    head=hx, base=bx))
                continue
            except ValueError as exc:
                kind, why = "problem", str(exc)
        gaps.setdefault(kind, []).append(f"pair {u.pair.index}: {why}" if kind == "refused" else why)
        skipped.append(f"pair {u.pair.index} ({'not comparable: ' if kind == 'unlike' else ''}{why})")
    return taken, skipped, gaps


def _without_ratios(head0: Record, used: list[_Used], budget: Budget | None, ctx: _Context,
                    gaps: dict[Gap, list[str]], *, base_has_it: bool) -> tuple[Record, Merged]:
    """A statistical check no pair gave a ratio: not comparable, not judged, or judged without the base."""
    problems, unlike, refused = gaps["problem"], gaps["unlike"], gaps["refused"]
    if unlike:
        return head0.with_(outcome=Outcome.ERROR, reason=_unlike_reason(unlike[0]),
                           base=_not_comparable(unlike[0])), "not comparable"
    if refused:
        # Not judged against the budgets either: on this machine the clocks were not the sides' to compare.
        rec = head0.with_(outcome=Outcome.NOT_JUDGED, reason=f"not judged: {'; '.join(refused)}",
                          base=_not_with_base(refused[0]))
        return rec, "kept" if ctx.final else "undecided"
    why = _why_not(ctx, problems, base_has_it=base_has_it)
    if ctx.require_base and not ctx.base_ran:
        return head0.with_(
            outcome=Outcome.ERROR,
            reason=f"not compared with the base: {why}; a timing check is judged on head/base and the "
                   "base gave none (pass --allow-missing-base to judge it against the stored budgets instead)",
            base=_not_with_base(why)), "not compared"
    if head0.outcome == Outcome.NOT_JUDGED:  # set aside by the head's preflight: nothing to judge alone
        return head0.with_(reason=f"not compared with the base: {why}; {head0.reason}",
                           base=_not_with_base(why)), "not compared"
    return _not_compared(head0, used, budget, why, ctx), "not compared"


def _with_ratios(head0: Record, used: Sequence[_Used], budget: Budget | None, ctx: _Context, info: Metric,
                 taken: list[_Taken], skipped: list[str], *, confidence: float) -> tuple[Record, Merged]:
    """A statistical check judged on its pairs' head/base ratios, after setting an outlying pair aside."""
    chosen = tolerance_for(info, budget, against="base", from_budgets=ctx.policy.tolerance_from_budgets)
    tolerance, source = chosen.value, chosen.source
    identity = head0.device.identity if head0.device is not None else None
    prior = ctx.policy.prior_for(identity, head0.key, head0.metric, info.kind)
    set_aside: list[SetAsidePair] = []
    if (out := outlying_pair([t.ratio for t in taken], floor_sd=prior.sd)) is not None:
        i, why = out
        set_aside.append(SetAsidePair(pair=taken[i].pair, ratio=taken[i].ratio, why=why))
        skipped.append(f"pair {taken[i].pair} (set aside: {why})")
        del taken[i]
    modes = process_modes([t.ratio for t in taken] + [p.ratio for p in set_aside])
    ratios = [t.ratio for t in taken]
    head_stats = [stats.quantile(t.head, info.quantile) for t in taken]
    base_stats = [stats.quantile(t.base, info.quantile) for t in taken]
    head_xs = [x for t in taken for x in t.head]
    base_xs = [x for t in taken for x in t.base]
    rv = judge_ratios(ratios, tolerance=tolerance, direction=info.direction, prior_sd=prior.sd,
                      prior_df=prior.df, prior_test=ctx.policy.prior_test, confidence=confidence,
                      final=ctx.final)
    # A failure is confirmed by one more pair, as stored mode confirms before failing: a small step's
    # processes can run in speed modes that two pairs may share by chance (benchmarks/process-modes-cpu.md).
    state: State = with_evidence(rv.state, n=rv.pairs, least=ctx.min_pairs, final=ctx.final,
                               reachable=ctx.pairs_left is None or can_decide(rv, ctx.pairs_left))
    if set_aside and not ctx.final and state not in ("undecided", "beyond reach") and ctx.pairs_left != 0:
        # A pair set aside is replaced, as an invalid one is: deciding on the others alone would narrow the
        # interval after looking at the data.
        state = "undecided"
    if state == "inconclusive" and rv.state != "inconclusive":
        short = f"not confirmed: a failure needs {ctx.min_pairs + 1} pairs" if rv.state == "fail" else \
            f"{rv.pairs} pair(s), fewer than the {ctx.min_pairs} a check needs (--min-pairs)"
        rv = replace(rv, state="inconclusive", reason=f"{rv.reason}; {short} and the run ended before another: "
                                                      "inconclusive")
    base_value = stats.median(base_stats)
    measured = "" if prior.source.startswith("default") else f"; prior sd {prior.sd:.1%} per pair, {prior.source}"
    said = [rv.reason, *([f"bimodal between processes: {modes[0]:.2f} / {modes[1]:.2f}"] if modes else []),
            *filter(None, [_allocation_change(used)])]
    reason = f"{'; '.join(said)} [tolerance from {source}{measured}]"
    if skipped:
        reason += f"; not compared in {', '.join(skipped)}"
    rec = head0.with_(
        outcome={"fail": Outcome.FAIL, "inconclusive": Outcome.INCONCLUSIVE}.get(rv.state, Outcome.PASS),
        value=stats.median(head_stats), ci=None, ci_confidence=None,
        n=len(head_xs), cv=stats.cv(head_xs) if len(head_xs) > 1 else None,
        budget=None if budget is None else BudgetRef.of(budget),
        limit=base_value * rv.limit, rounds=rv.pairs, confirmed=None, reason=reason,
        samples=tuple(head_xs),
        base=BaseSide(value=base_value, samples=tuple(base_xs), ratio=rv.ratio, ratio_ci=rv.ci, pairs=rv.pairs,
                      pair_ratios=tuple(ratios), detectable=rv.mde, tolerance=tolerance, tolerance_from=source,
                      sd=rv.sd, df=rv.df, prior="set aside" if rv.prior_set_aside else prior.source,
                      confidence=rv.confidence, set_aside=tuple(set_aside)),
    )
    return rec, state


def _allocation_change(used: Sequence[_Used]) -> str:
    """What one call of the head allocates unlike the base's, from the first pair both said ("": none)."""
    for u in used:
        try:
            head = Allocation.from_extra(u.head.extra)
            base = Allocation.from_extra(u.base.extra) if u.base is not None else None
        except ValueError:
            return ""
        if head is not None and base is not None:
            return head.change_from(base)
    return ""


def _gap(u: _Used, *, on_gpu: bool) -> tuple[Gap | None, str]:
    """Why pair ``u`` gives its check no head/base ratio, as ``(kind, why)``; ``(None, "")`` when it gives one."""
    head, base, pair = u.head, u.base, u.pair
    if not _usable(head):
        return "problem", f"head {head.outcome}: {head.reason}" if head.reason else f"head {head.outcome}"
    if base is None and "base" in pair.stopped:
        return "problem", _STOPPED
    if base is None:
        return "absent", "the base did not record it there" if pair.base is not None else "the base wrote no results"
    if not _usable(base):
        return "problem", f"base {base.outcome}: {base.reason}" if base.reason else f"base {base.outcome}"
    if pair.unlike:
        return "unlike", pair.unlike
    if _where(head) != _where(base):  # a test moved to another device (a gpu mark added or dropped)
        return "unlike", f"device {_where(base)} vs {_where(head)}"
    return ("refused", pair.refused) if on_gpu and pair.refused else (None, "")


def _where(r: Record) -> str:
    """The device a record measured on, as comparable across sides: its type and identity."""
    return "none" if r.device is None else f"{r.device.type} {r.device.identity or r.device.model}"


def _unlike_reason(unlike: str) -> str:
    return (f"not comparable: {unlike} (base vs head): the sides measured differently, so head/base would carry "
            "the difference; measure both sides with the base's settings, or accept the change with a reason")


def _not_with_base(why: str) -> BaseSide:
    """The comparison of a check judged without the base (``why``: the base lacks it, ...)."""
    return BaseSide(value=None, compared=False, note=why)


def _not_comparable(unlike: str) -> BaseSide:
    return BaseSide(value=None, compared=False, note=f"not comparable: {unlike}", not_comparable=unlike)



def _why_not(ctx: _Context, problems: list[str], *, base_has_it: bool) -> str:
    if problems:
        return problems[0]
    if not ctx.base_ran:
        return f"the base could not run under this instrument ({ctx.base_problem})" if ctx.base_problem else \
            "the base could not run under this instrument"
    if base_has_it:
        # e.g. an operator near the top-N cut, listed by one process and not by the other.
        return "the head and the base never recorded it in the same pair"
    return "the base lacks it"


def _not_compared(head0: Record, used: list[_Used], budget: Budget | None, why: str, ctx: _Context) -> Record:
    """Judge the head's samples (all pairs) against the stored budget alone, as a stored run would."""
    samples = [x for u in used if _usable(u.head) for x in _samples(u.head)]
    v = decide(head0.key, head0.metric, samples, budget)
    info, device = _metric(head0), head0.device
    if info is not None and device is not None:
        try:
            stable = stable_identity(ctx.stable_machine, device)
            not_here = not_gating(info, device.type, budget, stable, ctx.budgets)
        except ValueError as exc:  # a declaration naming another machine: nothing gates
            not_here = str(exc)
        if not_here:
            v = as_advisory(v, not_here)
    return _with_verdict(head0, v).with_(
        reason=f"not compared with the base: {why}; against the stored budget: {v.reason}", base=_not_with_base(why))


def _with_verdict(rec: Record, v: Verdict) -> Record:
    return rec.with_(
        outcome=v.outcome, value=v.value, ci=v.ci, ci_confidence=v.confidence if v.ci else None, n=v.n,
        cv=v.cv, budget=None if v.budget is None else BudgetRef.of(v.budget), limit=v.limit, rounds=v.rounds,
        confirmed=v.confirmed, reason=v.reason, samples=tuple(v.samples), advice=v.advice,
    )


def _merge_exact(head0: Record, used: list[_Used], ctx: _Context, *, base_has_it: bool) -> Record:
    """Keep the head's verdict (its first pair's) against the budgets; say how the value differs from the base's."""
    head_values = _distinct(u.head.value for u in used)
    base_values = _distinct(u.base.value for u in used if u.base is not None and _usable(u.base) and not u.pair.unlike)
    reason = head0.reason
    if head0.value is None:
        return head0
    unlike = next((u.pair.unlike for u in used if u.pair.unlike), "")
    if not base_values and unlike:
        return head0.with_(reason=f"{reason}; not compared with the base: not comparable: {unlike} (base vs head)",
                           base=_not_comparable(unlike))
    if not base_values:
        why = _why_not(ctx, [*(f"base {u.base.outcome}: {u.base.reason}" for u in used
                               if u.base is not None and not _usable(u.base)),
                             *(_STOPPED for u in used if u.base is None and "base" in u.pair.stopped)],
                       base_has_it=base_has_it)
        return head0.with_(reason=f"{reason}; not compared with the base: {why}", base=_not_with_base(why))
    base_value = base_values[0]
    change = describe_change(head0.value, base_value, unit=head0.unit)
    if len(head_values) > 1:
        change += f"; the head varies across pairs: {', '.join(f'{x:g}' for x in head_values)}"
    if len(base_values) > 1:
        change += f"; the base varies across pairs: {', '.join(f'{x:g}' for x in base_values)}"
    ratio = head0.value / base_value if base_value != 0 else None
    pairs_with_base = sum(1 for u in used if _usable(u.base) and not u.pair.unlike)
    outcome = head0.outcome
    info = _metric(head0)
    tolerance = None
    attribution = head0.attribution
    if info is not None and (info.per_isa or info.kind == "count"):
        # A stated bound, not the last digit: a change of the numerics path is shown, only a real loss fails.

        found = ctx.policy.measured(head0.device.identity if head0.device is not None else None,
                                    head0.key, head0.metric)
        spread = found[0].count_tolerance() if found is not None else None
        chosen = tolerance_for(info, head0.budget, against="base", measured=None if found is None or spread is None
                               else (spread, f"{found[1].where}, {found[0].runs} A/A runs"))
        tolerance = chosen.value
        change += f" (tolerance {tolerance * 100:.3g}% from {chosen.source})"
        worse = classify(head0.value, head0.value, Limits.around(base_value, tolerance, info.direction)) == "fail"
        if worse and outcome in (Outcome.PASS, Outcome.STALE, Outcome.UNBUDGETED):
            outcome = Outcome.FAIL
            change += ": worse than the base beyond its tolerance"
            attribution = (*attribution, *_moved_functions(head0, used))
    return head0.with_(
        outcome=outcome, attribution=attribution,
        reason=f"{reason}; vs base: {change}" if reason else f"vs base: {change}",
        base=BaseSide(value=base_value, ratio=ratio, pairs=pairs_with_base, tolerance=tolerance),
    )


def _moved_functions(head0: Record, used: list[_Used]) -> list[str]:
    """The functions whose instructions moved most from base to head (none without both profiles)."""
    head = InstructionProfile.from_extra(head0.extra)
    base = next((p for u in used if u.base is not None and _usable(u.base)
                 and (p := InstructionProfile.from_extra(u.base.extra)) is not None), None)
    if head is None or base is None:
        return []
    return ["functions that moved (inclusive instructions per step, base -> head):",
            *(f"  {line}" for line in head.moved_against(base))]


def _distinct(values: Iterable[float | None]) -> list[float]:
    out: list[float] = []
    for v in values:
        if v is not None and not any(same(v, o) for o in out):
            out.append(v)
    return out
