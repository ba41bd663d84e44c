"""The job summary, the pull-request comment and the HTML report lead with the same verdict: the
same icon and the same count of every outcome, for each outcome alone and for all together."""

from __future__ import annotations

import re

import pytest

from perfbudget.device import DeviceInfo
from perfbudget.report import markdown_report, pr_comment, render_html
from perfbudget.results import Record, Results
from perfbudget.vocabulary import Outcome

CPU = DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1, cpuid="6/207/2", isa_class="avx2")


def results(*outcomes: Outcome) -> Results:
    return Results(records=[
        Record(nodeid="t.py::test_a", key=f"k{i}", metric="step_ms", outcome=o, value=10.0,
               kind="timing", direction="lower", unit="ms", device=CPU,
               reason="error: budgets/cpu.yaml:4: boom" if o == Outcome.ERROR else "")
        for i, o in enumerate(outcomes)])


def verdicts(res: Results) -> tuple[str, str, str]:
    """The summary's, the comment's and the HTML report's headline, title left out."""
    summary = markdown_report(res, title="perf").splitlines()[0]
    comment = pr_comment(res, title="perf").splitlines()[1]
    html = re.search(r"<h1>perf: (.*?)</h1>", render_html(res, title="perf"))
    assert summary.startswith("## ") and comment.startswith("### ") and html is not None
    return summary.removeprefix("## "), comment.removeprefix("### "), html.group(1)


ICONS = {Outcome.FAIL: "❌", Outcome.ERROR: "❌", Outcome.INCONCLUSIVE: "❔"}


@pytest.mark.parametrize("outcome", list(Outcome))
def test_one_outcome_reads_the_same_everywhere(outcome: Outcome) -> None:
    summary, comment, html = verdicts(results(outcome, outcome))
    icon = ICONS.get(outcome, "✅")
    assert summary == comment == f"{icon} perf: 2 {outcome}"
    assert html == f"2 {outcome}"


def test_every_outcome_at_once_and_ten_inconclusive_checks() -> None:
    every = results(*Outcome, Outcome.PASS)
    summary, comment, html = verdicts(every)
    counts = ("1 error, 1 fail, 1 inconclusive, 1 not_measured, 1 unbudgeted, 1 stale, "
              "1 not_judged, 1 advisory, 1 unmeasurable, 2 pass")
    assert summary == comment == f"❌ perf: {counts}" and html == counts
    # The case that read "all budgets hold" beside a comment listing ten open checks.
    open_checks = results(*[Outcome.INCONCLUSIVE] * 10, Outcome.PASS)
    summary, comment, _ = verdicts(open_checks)
    assert summary == comment == "❔ perf: 10 inconclusive, 1 pass"
    assert verdicts(Results())[:2] == ("⚠️ perf: no perf records",) * 2
