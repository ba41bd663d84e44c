"""The pull-request comment: one comparison per check (the one that decided), what needs a look
first, a line per passing group, the accept command; rendered from results alone."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from perfbudget.cli import main
from perfbudget.device import DeviceInfo
from perfbudget.report import COMMENT_MARKER, CommentLinks, accept_command, pr_comment
from perfbudget.report.common import deciding, interval_text
from perfbudget.results import (
    ABRunInfo,
    BaseSide,
    BudgetRef,
    Record,
    Results,
    RunInfo,
    load_results,
)
from perfbudget.vocabulary import Outcome, RunMode

DATA = Path(__file__).parent / "data" / "results"
CPU = DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1, cpuid="6/207/2",
                 isa_class="avx2")
SHA = "0123456789abcdef0123456789abcdef01234567"
WHY = '"<why this change is expected>"'


def rec(metric: str, outcome: Outcome | str, value: float, *, kind: str = "timing",
        budget: float | None = None, tol: float = 0.05, key: str = "enc", **kw: Any) -> Record:
    ref = None if budget is None else BudgetRef(value=budget, tolerance=tol,
                                                source="budgets/cpu.yaml", line=4)
    return Record(nodeid="t.py::test_a", key=key, metric=metric, outcome=Outcome(outcome),
                  value=value, kind=kind, direction="lower", unit="ms" if kind == "timing" else "1",
                  budget=ref, device=CPU, limit=None if budget is None else budget * (1 + tol),
                  **kw)


def ab_side(ratio: float, ci: tuple[float, float], **kw: Any) -> BaseSide:
    return BaseSide(value=10.0, ratio=ratio, ratio_ci=ci, pairs=3, tolerance=0.05,
                    confidence=0.95, **kw)


def test_the_deciding_comparison_is_head_base_where_judged_so_else_the_budget() -> None:
    timed = rec("step_ms", "fail", 10.85, budget=9.0,
                base=ab_side(1.085, (1.07, 1.10), detectable=0.031))
    d = deciding(timed)
    assert d is not None and d.against == "base" and d.pairs == 3 and d.detectable == 0.031
    assert d.change == pytest.approx(0.085) and d.interval == pytest.approx((0.07, 0.10))
    assert d.tolerance == 0.05 and interval_text(d) == "+7.0% to +10.0%"
    # An exact value beyond its budget was decided by the budget, whatever the base says.
    flops = rec("flops", "fail", 2.6e9, kind="exact", budget=2.416e9, tol=0.0,
                base=BaseSide(value=2.416e9, ratio=1.076, pairs=3))
    d = deciding(flops)
    assert d is not None and d.against == "budget" and d.interval is None
    assert d.where == "budgets/cpu.yaml:4"
    assert d.change == pytest.approx(2.6 / 2.416 - 1) and interval_text(d) == "exact"
    # An instruction count within its budget fails against the base: the base decided.
    count = rec("instructions[callgrind]", "fail", 1010.0, kind="count", budget=1100.0, tol=0.005,
                base=BaseSide(value=1000.0, ratio=1.01, pairs=1, tolerance=0.005))
    d = deciding(count)
    assert d is not None and d.against == "base" and d.change == pytest.approx(0.01)
    assert d.tolerance == 0.005
    # Stored timing: the median's interval against the budget, at its own coverage.
    stored = rec("step_ms", "fail", 11.0, budget=10.0, ci=(10.5, 11.5), ci_confidence=0.99)
    d = deciding(stored)
    assert d is not None and d.against == "budget" and d.interval == pytest.approx((0.05, 0.15))
    assert interval_text(d) == "+5.0% to +15.0% (99%)"
    assert deciding(rec("step_ms", "unbudgeted", 3.0)) is None


def test_the_comment_of_an_ab_run_reads_at_a_glance() -> None:
    results = load_results(DATA / "ab.json")
    links = CommentLinks(report_url="https://ci/artifact/1", history_url="https://pages/history")
    text = pr_comment(results, title="perf", links=links, results_name="results-ab.json")
    lines = text.splitlines()
    assert lines[0] == COMMENT_MARKER
    assert lines[1] == "### ❌ perf: 3 fail, 1 unbudgeted, 2 stale, 1 unmeasurable, 6 pass"
    assert lines[3] == ("Lockstep A/B against the base commit on "
                        "`cpu AMD EPYC 7763 64-Core Processor (1 thread)` · "
                        "[HTML report and results](https://ci/artifact/1) · [history](https://pages/history)")
    # The results are where the report is unless a link of their own is given (the accept
    # command below reads them from there): the same line from the action and from the CLI.
    rows = [line for line in lines if line.startswith("| ❌")]
    # One comparison per check, the headline metric before the per-operator ones.
    assert rows == [
        "| ❌ fail | `encoder-train` `step_ms` | base, 3 pairs | **+8.5%** | +8.5% to +8.6% "
        "| - | 5% |",
        "| ❌ fail | `encoder-train` `op_self_ms[aten::addmm]` | base, 3 pairs | **+45.6%** "
        "| +43.7% to +47.5% | - | 5% |",
        "| ❌ fail | `encoder-train` `op_share[aten::addmm]` | base, 3 pairs | **+19.9%** "
        "| +18.4% to +21.5% | - | 5% |",
    ]
    # No second comparison beside the one that decided (the budget's 38.2 ms, its limit).
    assert "38.2" not in text and "limit" not in text
    # The operators that moved are rows of the table already: not listed a second time.
    assert "**What moved**" not in text and "moved: aten::addmm" not in text
    details = text[text.index("<details>"):text.index("</details>")]
    assert details.startswith("<details><summary>10 other checks in 3 groups: 1 unbudgeted, "
                              "2 stale, 1 unmeasurable, 6 pass</summary>")
    assert ("- ✅ `encoder-train`: 5 pass; largest change `peak_allocated_mib[forward]` -0.3% "
            "vs budget") in details
    assert "- 🟡 `bucketing-padding`: 1 stale; largest change `padding_rate` -2.0% vs budget" \
        in details
    assert len([line for line in details.splitlines() if line.startswith("- ")]) == 3
    # The sample names no commit: the command asks for it.
    command = f"perfbudget accept results-ab.json --commit SHA --reason {WHY}"
    assert f"```sh\n{command}\n```" in text
    assert "with [the results](https://ci/artifact/1) (`results-ab.json`)" in text


def test_an_operator_that_moved_without_a_row_of_its_own_is_named_under_what_moved() -> None:
    results = load_results(DATA / "ab.json")
    quiet = [replace(r, outcome=Outcome.PASS) if r.metric == "op_share[aten::addmm]" else r for r in results.records]
    text = pr_comment(replace(results, records=quiet), title="perf", links=CommentLinks(), results_name="r.json")
    assert "**What moved**" in text
    assert "- `encoder-train` moved: aten::addmm op_share: 0.552 vs base 0.4586 (+19.9%, fail)" in text
    assert "aten::addmm op_self_ms: 11.68" not in text  # that one is a row


def test_inconclusive_and_error_rows_and_a_clean_run() -> None:
    ab = {"head_commit": SHA, "base_commit": "f" * 40, "base_ref": "main", "merge_base": True,
          "valid_pairs": 6}
    error = "budgets: budgets/cpu.yaml:4: flops: expected a number"
    results = Results(meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(**ab)), records=[
        rec("step_ms", "inconclusive", 10.4, budget=10.0,
            base=ab_side(1.04, (1.01, 1.07), detectable=0.062)),
        rec("flops", "error", 1.0, kind="exact", reason=error),
        rec("ttft_ms", "pass", 5.0, budget=5.0, key="dec", base=ab_side(0.99, (0.97, 1.01))),
    ])
    lines = pr_comment(results).splitlines()
    assert lines[1] == "### ❌ perf: 1 error, 1 inconclusive, 1 pass"
    assert lines[3] == ("Lockstep A/B against `ffffffffffff` (merge-base with `main`), "
                        "6 process pairs on `cpu Test CPU (1 thread)`")
    assert f"| ⛔ error | `enc` `flops` | - | error: {error} | - | - | - |" in lines
    assert ("| ❔ inconclusive | `enc` `step_ms` | base, 3 pairs | **+4.0%** | +1.0% to +7.0% "
            "| ±6.2% | 5% |") in lines
    assert not any("perfbudget accept" in line for line in lines)  # no budget would change
    clean = pr_comment(Results(records=[results.records[2]]),
                       links=CommentLinks(report_url="u", results_url="u"))
    assert clean.splitlines()[1] == "### ✅ perf: 1 pass" and "| " not in clean
    assert "[HTML report and results](u)" in clean
    assert "- ✅ `dec`: 1 pass; largest change `ttft_ms` -1.0% vs base" in clean
    assert pr_comment(Results()).splitlines()[:2] == [COMMENT_MARKER,
                                                      "### ⚠️ perf: no perf records"]


def test_the_accept_command_names_what_the_reader_has(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ab = Results(meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=SHA),
                          budgets_dir=str(tmp_path / "perf" / "budgets")))
    assert accept_command(ab, "results ab.json") == \
        f"perfbudget accept 'results ab.json' --budgets-dir perf/budgets --reason {WHY}"
    stored = Results(meta=RunInfo(budgets_dir=str(tmp_path / "budgets")))
    assert accept_command(stored, "r.json", commit="abc1234") == \
        f"perfbudget accept r.json --commit abc1234 --reason {WHY}"


@pytest.mark.parametrize("where", ["../../.github/workflows", "/etc/elsewhere", "perf/../../up",
                                   "..\\..\\up", "b" * 201])
def test_the_accept_command_never_repeats_a_budgets_folder_outside_the_checkout(where: str) -> None:
    results = Results(records=[rec("flops", "fail", 2.0, kind="exact", budget=1.0, tol=0.0)],
                      meta=RunInfo(budgets_dir=where))
    assert accept_command(results, "r.json", commit=SHA) == f"perfbudget accept r.json --commit {SHA} --reason {WHY}"
    text = pr_comment(results, results_name="r.json", commit=SHA)
    assert "--budgets-dir" in text and "budgets folder is left out: absolute, outside this checkout" in text
    inside = Results(records=results.records, meta=RunInfo(budgets_dir="perf/budgets"))
    assert "--budgets-dir perf/budgets " in accept_command(inside, "r.json", commit=SHA)
    assert "left out" not in pr_comment(inside, results_name="r.json", commit=SHA)


def test_perfbudget_report_renders_the_comment() -> None:
    out = io.StringIO()
    code = main(["report", str(DATA / "ab.json"), "-f", "comment", "--title", "perf (cpu)",
                 "--report-url", "https://r", "--history-url", "https://h",
                 "--results-url", "https://j"], out=out)
    text = out.getvalue()
    assert code == 1 and text.startswith(COMMENT_MARKER + "\n### ❌ perf (cpu): 3 fail")
    assert "· [HTML report](https://r) · [history](https://h) · [results](https://j)" in text
    assert f"perfbudget accept {DATA / 'ab.json'} --commit SHA" in text
