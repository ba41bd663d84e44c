"""The run's way of judging, chosen once: what each one fails, skips and passes."""

from __future__ import annotations

import pytest

from perfbudget.settings import RunSpec
from perfbudget.verdict.judge import ABSide, Judging, Stored, Update, Verdict, judging_for
from perfbudget.vocabulary import Outcome, RunMode, TestOutcome


def v(outcome: str, metric: str = "step_ms") -> Verdict:
    return Verdict(key="k", metric=metric, outcome=outcome, value=1.0)


def by(*verdicts: Verdict) -> dict[Outcome, tuple[Verdict, ...]]:
    return {o: tuple(x for x in verdicts if x.outcome == o) for o in Outcome}


def test_the_command_line_chooses_one_way_of_judging() -> None:
    assert isinstance(judging_for(collect=False, update=False), Stored)
    assert isinstance(judging_for(collect=False, update=True), Update)
    spec = RunSpec(side="head", precision=0.01, operators_file="ops.json")
    side = judging_for(collect=True, update=False, spec=spec)
    assert side == ABSide(precision=0.01, operators_file="ops.json") and side.mode == RunMode.COLLECT
    assert judging_for(collect=True, update=False) == ABSide()  # --perf-collect without perfbudget ab
    assert isinstance(judging_for(collect=False, update=False, spec=spec), Stored)
    with pytest.raises(ValueError, match="cannot be combined"):
        judging_for(collect=True, update=True)
    with pytest.raises(ValueError, match="precision"):
        ABSide(precision=1.5)


@pytest.mark.parametrize("judging, fail, inconclusive", [
    (Stored(), TestOutcome.FAIL, TestOutcome.SKIP),
    (Update(), TestOutcome.PASS, TestOutcome.PASS),
    (ABSide(), TestOutcome.PASS, TestOutcome.PASS),
])
def test_what_fails_and_what_skips_a_test(judging: Judging, fail: TestOutcome, inconclusive: TestOutcome) -> None:
    failed = (v("fail"), v("pass", "flops"))
    assert judging.settle(by(*failed), strict=False, missing=False, verdicts=failed)[0] == fail
    undecided = (v("inconclusive"),)
    assert judging.settle(by(*undecided), strict=False, missing=False, verdicts=undecided)[0] == inconclusive
    # An error fails every way of judging, and names itself.
    outcome, failing = judging.settle(by(v("error")), strict=False, missing=False, verdicts=(v("error"),))
    assert outcome == TestOutcome.FAIL and [f.outcome for f in failing] == ["error"]


def test_strict_fails_on_what_was_not_judged_except_when_writing_budgets() -> None:
    one = (v("pass"),)
    assert Stored().settle(by(*one), strict=True, missing=True, verdicts=one)[0] == TestOutcome.FAIL
    assert ABSide().settle(by(*one), strict=True, missing=True, verdicts=one)[0] == TestOutcome.FAIL
    assert Update().settle(by(*one), strict=True, missing=True, verdicts=one)[0] == TestOutcome.PASS
    stale = (v("stale"),)
    assert Stored().settle(by(*stale), strict=True, missing=False, verdicts=stale)[0] == TestOutcome.FAIL
    assert Stored().settle(by(*stale), strict=False, missing=False, verdicts=stale)[0] == TestOutcome.PASS


def test_only_a_side_takes_turns_and_only_an_update_writes_budgets() -> None:
    assert [j.takes_turns for j in (Stored(), Update(), ABSide())] == [False, False, True]
    assert [j.writes_budgets for j in (Stored(), Update(), ABSide())] == [False, True, False]
    assert Stored().pinned_operators("t::x", "k") is None and ABSide().pinned_operators("t::x", "k") is None
