"""Hostile names rendered by every Markdown report, read back through a CommonMark parser: the
HTML has exactly the tags, links, images, headings and comments of the same report of tame names."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from perfbudget.report import (
    CommentLinks,
    diff_results,
    junit_xml,
    markdown_report,
    pr_comment,
    render_diff,
)
from perfbudget.report.comment import MAX_COMMENT_CHARS
from perfbudget.report.common import md_text
from perfbudget.report.terminal import terminal_report
from perfbudget.results import Record, load_results

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
    assert "more in the report" in text or "the comment is cut here" in text
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
