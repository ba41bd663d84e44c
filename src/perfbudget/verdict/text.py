"""The text of a test's outcome: what failed, what was judged and what was not (terminal, JUnit, Markdown)."""

from __future__ import annotations

from collections.abc import Sequence

from ..results import Record
from ..vocabulary import Outcome, TestOutcome
from .judge import Decision

__all__ = ["decision_text", "judged_summary"]


def judged_summary(decision: Decision, *, skip: frozenset[str] = frozenset()) -> list[str]:
    """One line per group of ``decision``'s verdicts, but the groups named in ``skip`` (said elsewhere)."""
    lines = []
    if decision.judged:
        lines.append("judged: " + ", ".join(f"{v.metric} {v.outcome}" for v in decision.judged))
    if decision.advisory:
        lines.append("advisory (stored timing, not gating here): "
                     + ", ".join(f"{v.metric} would {v.advice}" if v.advice else f"{v.metric} (no budget here)"
                                 for v in decision.advisory))
    if decision.not_judged and "not_judged" not in skip:
        lines.append("not judged: " + ", ".join(v.metric for v in decision.not_judged)
                     + f" ({decision.not_judged[0].reason})")
    if decision.unbudgeted and "unbudgeted" not in skip:
        lines.append("unbudgeted: " + ", ".join(v.metric for v in decision.unbudgeted))
    if decision.unmeasurable and "unmeasurable" not in skip:
        lines.append("unmeasurable: " + "; ".join(f"{v.metric}: {v.reason}" for v in decision.unmeasurable))
    if decision.not_measured:
        lines.append("not measured: " + ", ".join(m for m, _ in decision.not_measured)
                     + f" ({decision.not_measured[0][1]})")
    return lines


def decision_text(
    decision: Decision,
    records: Sequence[Record],
    *,
    key: str,
    device_label: str,
    update_command: str = "",
) -> str:
    """The message pytest shows for a failed or skipped perf test (empty for a pass)."""
    from ..report import move_line, moved_operators, moves_note, records_table

    if decision.empty:
        return f"{key}: the test used `perf` but recorded no measurement"
    if decision.outcome == Outcome.FAIL:
        lines = [f"perf budget check failed: {key} on {device_label}", "", records_table(list(records)), ""]
        failing = {v.metric for v in decision.failing}
        failed = [r for r in records if r.metric in failing]
        for r in failed:
            where = f" [{r.budget.where}]" if r.budget is not None and r.budget.source else ""
            lines.append(f"{r.metric}: {r.outcome}: {r.reason}{where}")
            lines.extend(f"    {a}" for a in r.attribution)
        if moves := moved_operators(failed):
            note = moves_note(failed)
            lines.append(f"operators that moved ({note}):" if note else "operators that moved:")
            lines.extend(f"    {move_line(m)}" for m in moves)
        if decision.not_measured and not decision.failing:
            lines.append("budgets that apply but were not measured (--perf-strict): "
                         + ", ".join(m for m, _ in decision.not_measured))
        if stale := [v.metric for v in decision.judged if v.outcome == Outcome.STALE]:
            lines.append(f"stale (better than budget): {', '.join(stale)}; ratchet with --update-budgets")
        lines += ["", *judged_summary(decision)]
        return "\n".join(lines)
    if decision.outcome == TestOutcome.SKIP:
        head = []
        if decision.not_judged:
            names = ", ".join(v.metric for v in decision.not_judged)
            head.append(f"timing checks of {key} not judged ({names}): {decision.not_judged[0].reason}")
        if inconclusive := [v for v in decision.judged if v.outcome == Outcome.INCONCLUSIVE]:
            head.append("inconclusive: " + "; ".join(f"{v.metric}: {v.reason}" for v in inconclusive))
        if decision.unbudgeted:
            head.append(
                f"unbudgeted: {key} has no budget for {', '.join(v.metric for v in decision.unbudgeted)} on "
                f"{device_label}; create it with: {update_command or 'pytest --update-budgets'}"
            )
        only_unmeasurable = not head and bool(decision.unmeasurable)
        if only_unmeasurable:
            head.append("; ".join(f"{v.metric} unmeasurable: {v.reason}" for v in decision.unmeasurable))
        said = {"not_judged", "unbudgeted"} | ({"unmeasurable"} if only_unmeasurable else set())
        return " — ".join([*head, *judged_summary(decision, skip=frozenset(said))])
    return ""
