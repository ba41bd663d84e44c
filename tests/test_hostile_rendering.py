"""Hostile names rendered by every Markdown report, read back through a CommonMark parser: the
HTML has exactly the tags, links, images, headings and comments of the same report of tame names."""

from __future__ import annotations

import io
import re
import unicodedata
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from perfbudget.device import DeviceInfo
from perfbudget.report import (
    CommentLinks,
    diff_results,
    junit_xml,
    markdown_report,
    pr_comment,
    render_diff,
)
from perfbudget.report.comment import MAX_COMMENT_CHARS
from perfbudget.report.common import md_cell, md_text
from perfbudget.report.markdown import MAX_SUMMARY_BYTES
from perfbudget.report.terminal import terminal_report
from perfbudget.results import BaseSide, Record, Results, load_results
from perfbudget.vocabulary import Outcome

AB = Path(__file__).parent / "data" / "results" / "ab.json"
HOSTILE = ("x` **bold** [link](https://e.com) ``` <img src=x onerror=y> @user www.e.com $x$ "
           "\n# heading\n<!-- \x1b[31m|")


def named(r: Record, i: int, name: str) -> Record:
    """``r`` with ``name`` in every text field a report shows (the metric keeps its family)."""
    base, _, arg = r.metric.partition("[")
    device = replace(r.device, model=f"{name} {i}") if r.device is not None else None
    budget = replace(r.budget, source=f"budgets/{name}.yaml") if r.budget is not None else None
    return replace(r, key=f"{name}{i % 3}", nodeid=f"t.py::test_{name}{i % 3}", reason=f"{name} why",
                   metric=f"{base}[{name}]" if arg else base, attribution=(name,), device=device, budget=budget,
                   advice=r.advice and name)


def rendered(name: str) -> dict[str, str]:
    results = load_results(AB)
    results = replace(results, records=[named(r, i, name) for i, r in enumerate(results.records)])
    results.meta = replace(results.meta, budgets_dir=f"b/{name}",
                           ab=replace(results.meta.ab, base_ref=name) if results.meta.ab else None)
    changes, note = diff_results(load_results(AB), results)
    return {"comment": pr_comment(results, links=CommentLinks(report_url="https://ci/r"), results_name="r.json"),
            "summary": markdown_report(results), "diff": render_diff(changes, note, fmt="markdown", show_all=True)}


def html_shape(markdown: str) -> Counter[str]:
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    return Counter(re.findall(r"<(!--|/?[a-zA-Z][a-zA-Z0-9]*)", html))


@pytest.mark.parametrize("report", ["comment", "summary", "diff"])
def test_hostile_names_render_as_text(report: str) -> None:
    tame, hostile = rendered("tame")[report], rendered(HOSTILE)[report]
    assert html_shape(hostile) == html_shape(tame)
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(hostile)
    prose = re.sub(r"<code[^>]*>.*?</code>", "", html, flags=re.S)  # GitHub neither links nor mentions in code
    assert "@user" not in prose and "www.e.com" not in prose and "\x1b" not in hostile


def test_a_code_span_outlasts_any_backtick_run_and_prose_is_inert() -> None:
    assert md_text("a``b", code=True) == "```a``b```"
    assert md_text("`a", code=True) == "`` `a ``"
    assert md_text("*a* <b> @c\nd") == "\\*a\\* \\<b\\> @\u200dc d"
    assert md_text("k" * 300).endswith("…") and len(md_text("k" * 300)) == 200


def test_the_accept_command_stays_in_its_fence() -> None:
    results = load_results(AB)
    results.meta = replace(results.meta, budgets_dir="b````\n```\nrm -rf ~ #")
    text = pr_comment(results, results_name="r.json")
    html = MarkdownIt("commonmark").render(text)
    assert html.count("<pre>") == 1 and html.count('<code class="language-sh">') == 1
    assert "--budgets-dir 'b```` ``` rm -rf ~ #' " in text  # one quoted argument on one line
    assert "\n`````sh\n" in text


def test_the_comment_stays_under_githubs_limit_and_says_what_was_cut() -> None:
    results = load_results(AB)
    many = [replace(r, key=f"{'k' * 900}{i}", reason="r" * 5000) for i, r in enumerate(results.records * 30)]
    text = pr_comment(replace(results, records=many))
    assert len(text) <= MAX_COMMENT_CHARS < 65_536
    assert "failing checks not shown" in text or "the comment is cut" in text
    # Whatever is cut, the accept command (what the reader acts on) stays, whole, in its fence.
    assert any(r.outcome == "fail" for r in many) and "**Accept this change**" in text
    assert MarkdownIt("commonmark").render(text).count('<code class="language-sh">') == 1
    assert "more failing tests in the report" in text


def test_terminal_and_junit_show_no_control_characters() -> None:
    results = load_results(AB)
    bad = replace(results, records=[replace(r, reason="\x1b[2J\x00 gone", key="k\x1b]0;t\x07") for r in results.records])
    assert not re.search("[\x00-\x08\x0b-\x1f]", terminal_report(bad))
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f]", junit_xml(bad))


def test_the_html_report_draws_a_dollar_name_as_text() -> None:
    from perfbudget.report import render_html

    results = load_results(AB)
    dollars = replace(results, records=[named(r, i, "$\\frac{x$") for i, r in enumerate(results.records)])
    html = render_html(dollars)
    assert "$\\frac{x$" in html


def test_prose_refers_to_no_issue_and_draws_no_formula_and_a_cell_ends_at_no_line_break() -> None:
    assert md_text("owner/repo#1, #2 and GH-3 cost $x$") == \
        "owner/repo#\u200d1, #\u200d2 and GH\u200d-3 cost \\$x\\$"
    assert md_text("gh-4 high-level") == "gh\u200d-4 high-level"
    assert md_text("a\rb\u2028c\u2029d\x0be\x0cf\x85g") == "a b c d e f g"
    assert md_cell("a\rb\u2028c\u2029d\x0be\x0cf\x85g\r\nh|") == "a b c d e f g  h\\|"


NOTE = "\r<img src=https://evil.example/x.png>\r@octocat #1\r</details>\r# PWNED"


def test_a_moved_operators_note_from_a_results_file_renders_as_text() -> None:
    results = load_results(AB)

    def noted(note: str) -> str:
        records = []
        for r in results.records:
            moved = r.extra.get("moved_ops")
            extra = {**r.extra, "moved_ops": {**moved, "note": note}} if moved else r.extra
            records.append(replace(r, extra=extra))
        return markdown_report(replace(results, records=records))

    tame, hostile = noted("profiled when step_ms failed"), noted(NOTE)
    assert "Top moved operators (" in hostile and "PWNED" in hostile
    assert html_shape(hostile) == html_shape(tame)
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(hostile)
    assert "@octocat" not in html and "#1" not in html


CPU = DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1, cpuid="6/207/2", isa_class="avx2")


def test_the_summary_stays_under_githubs_step_summary_limit_and_says_what_it_left_out() -> None:
    failing = [Record(nodeid=f"t.py::test_{i}", key=f"k{i}", metric="step_ms", outcome=Outcome.FAIL, value=2.0,
                      kind="timing", direction="lower", unit="ms", device=CPU, reason="r" * 300) for i in range(2_000)]
    text = markdown_report(failing)
    assert len(text.encode()) <= MAX_SUMMARY_BYTES
    assert text.count("#### ") == 50 and "… 1950 more failing tests: every one is in the HTML report" in text
    # Past the limits of every section, the whole summary is cut at GitHub's, whole lines only.
    wide = "🔥" * 200
    many = [Record(nodeid=f"t.py::test_{wide}{i}", key=f"{wide}{i}", metric=f"op_self_ms[{wide}{i}]",
                   outcome=Outcome.UNBUDGETED, value=1.0, kind="timing", direction="lower", unit="ms", device=CPU,
                   reason=wide) for i in range(3_000)]
    text = markdown_report([*failing[:3], *many])
    assert len(text.encode()) <= MAX_SUMMARY_BYTES < 2**20
    assert "… the summary is cut here" in text and "every record is in the HTML report and the results JSON" in text
    assert text.count("#### ") == 3  # the regressions, first, are whole
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    assert html.count("<details>") == html.count("</details>")


def test_a_comment_of_many_devices_keeps_its_failing_checks_table() -> None:
    model = "M" * 190
    records = [Record(nodeid=f"t.py::test_{i}", key=f"k{i}", metric="step_ms", outcome=Outcome.FAIL if i < 3 else
                      Outcome.PASS, value=2.0, kind="timing", direction="lower", unit="ms",
                      device=replace(CPU, model=f"{model}{i}")) for i in range(200)]
    text = pr_comment(Results(records=records))
    assert len(text) <= MAX_COMMENT_CHARS
    how = next(line for line in text.splitlines() if line.startswith("Against the stored budgets on "))
    assert how.endswith(" and 197 more devices") and len(how) < 1_000
    assert [line.split("|")[2].strip() for line in text.splitlines() if line.startswith("| ❌")] == \
        ["`k0` `step_ms`", "`k1` `step_ms`", "`k2` `step_ms`"]


def test_a_line_too_long_for_the_comment_is_left_out_not_the_failing_checks_table() -> None:
    results = load_results(AB)
    text = pr_comment(results, links=CommentLinks(history_url="https://ci/" + "r" * 70_000))
    assert len(text) <= MAX_COMMENT_CHARS and "r" * 1_000 not in text
    assert sum(line.startswith("| ❌") for line in text.splitlines()) == 3
    assert "the comment is cut" in text and "**Accept this change**" in text
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    assert html.count("<details>") == html.count("</details>")


def test_the_ab_summary_shows_no_control_characters() -> None:
    from perfbudget.ab.cli import summary
    from perfbudget.ab.merge import Comparison
    from perfbudget.ab.run import ABRun
    from perfbudget.results import ABRunInfo, PairClocks, RunInfo

    bad = "\x1b]0;pwned\x07\x1b[2J\u2028"
    r = Record(nodeid="t.py::test_a", key="k", metric="step_ms", outcome=Outcome.FAIL, value=2.0, kind="timing",
               direction="lower", unit="ms", device=CPU, reason=f"slower {bad}",
               base=BaseSide(value=1.0, ratio=2.0, pairs=1, compared=False, note=f"base lacks it {bad}"))
    meta = RunInfo(ab=ABRunInfo(clocks=(PairClocks(pair=1, refused=f"clocks differ {bad}"),)))
    run = ABRun(results=Results(records=[r], meta=meta), path=Path("results.json"), exit_code=1,  # type: ignore[arg-type]
                comparison=Comparison(records=[r]), pairs=())
    text = summary(run)
    assert "slower" in text and "base lacks it" in text and "clocks differ" in text
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f\u2028]", text)


def raw_controls(text: str) -> list[str]:
    """The control, format and line-separator characters of ``text`` but its newlines."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


#: A budget key that sets the terminal's title, rings its bell and overwrites its line with "FAKE".
HOSTILE_KEY = '"k\\e]0;PWN\\a\\rFAKE\\u202e"'


@pytest.mark.parametrize("command", [["show"], ["update", "RESULTS", "--dry-run"],
                                     ["accept", "RESULTS", "--reason", "r", "--commit", "abc1234"]])
def test_budget_commands_print_no_control_character_of_a_budget_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    from perfbudget.cli import main

    root = tmp_path / "budgets"
    root.mkdir()
    (root / "cpu.yaml").write_text(f"schema: 1\ndevice: {{type: cpu}}\nbudgets:\n  {HOSTILE_KEY}:\n    flops: 1000\n")
    (root / "broken\x1b[2J.yaml").write_text(f"schema: 1\ndevice: {{type: cpu}}\nbudgets:\n  {HOSTILE_KEY}:\n"
                                             "    flops: {value: 1, tolerance: 5}\n")
    record = Record(nodeid="t.py::test_x", key="enc", metric="flops", outcome=Outcome.PASS, value=1.0, n=1,
                    device=CPU, kind="exact", direction="lower")
    results = Results(records=[record]).write(tmp_path / "results.json")
    out = io.StringIO()
    argv = [str(results) if a == "RESULTS" else a for a in command]
    code = main([*argv, "--budgets-dir", str(root)], out=out)
    said = out.getvalue() + capsys.readouterr().err
    assert code == 2 and "PWN" in said and "FAKE" in said  # shown, inert
    assert raw_controls(said) == []
