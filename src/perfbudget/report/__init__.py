"""Reports rendered from a results file alone: terminal, Markdown, JUnit, HTML, the comment, the diff."""

from .comment import (
    COMMENT_MARKER,
    CommentLinks,
    accept_command,
    comment_marker,
    pr_comment,
    read_marker,
    stale_comment,
)
from .common import (
    REGRESSION_OUTCOMES,
    FailingTest,
    OpMove,
    device_label,
    failing_tests,
    fmt_value,
    move_line,
    moved_operators,
    moves_note,
    regressions,
    run_problems,
    text_table,
)
from .diff import Change, diff_results, render_diff
from .html import render_html, write_html
from .junit import junit_properties, junit_xml
from .markdown import markdown_report
from .terminal import records_table, terminal_report

__all__ = [
    "COMMENT_MARKER",
    "REGRESSION_OUTCOMES",
    "Change",
    "CommentLinks",
    "FailingTest",
    "OpMove",
    "accept_command",
    "comment_marker",
    "device_label",
    "diff_results",
    "failing_tests",
    "fmt_value",
    "junit_properties",
    "junit_xml",
    "markdown_report",
    "move_line",
    "moved_operators",
    "moves_note",
    "pr_comment",
    "read_marker",
    "records_table",
    "regressions",
    "render_diff",
    "render_html",
    "run_problems",
    "stale_comment",
    "terminal_report",
    "text_table",
    "write_html",
]
