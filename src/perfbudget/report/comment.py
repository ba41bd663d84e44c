"""The pull-request comment, from a results file: what needs a look first, then the rest in brief."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ..fileio import shown_path
from ..results import Record, Results
from ..vocabulary import Outcome
from .common import (
    DECIDING_COLUMNS,
    MD_MAX_TEXT,
    OUTCOME_ORDER,
    deciding,
    deciding_cells,
    device_label,
    devices,
    failing_tests,
    has_base,
    headline,
    md_fit,
    md_run_problems,
    md_table,
    md_text,
    move_line,
    op_of,
    ordered,
    plain,
    summary_line,
)
from .markdown import ICON

__all__ = ["COMMENT_MARKER", "CommentLinks", "accept_command", "comment_marker", "pr_comment",
           "read_marker", "stale_comment"]

COMMENT_MARKER = "<!-- perfbudget-comment -->"
"""The bare first line (``perfbudget report -f comment``, and the action before check names)."""

_MARKER = re.compile(r"<!-- perfbudget-comment check=(\S+) head=([0-9a-f]*) -->")
_STALE = "> ⚠️ **Stale:** "

#: Outcomes listed one check a row, before everything else.
_NEEDS_A_LOOK = (Outcome.ERROR, Outcome.FAIL, Outcome.INCONCLUSIVE)

#: A comment is read at a glance (GitHub caps one at 65,536 characters): the rest is in the report.
_MAX_ROWS = 25
_MAX_GROUPS = 40
_MAX_MOVES = 3
_MAX_DEVICES = 3
MAX_COMMENT_CHARS = 60_000
"""The longest comment written, below GitHub's 65,536 characters."""


@dataclass(frozen=True, kw_only=True)
class CommentLinks:
    """Where the reader finds more; each is left out when empty."""

    report_url: str = ""
    """The HTML report (or the CI artifact holding it)."""
    history_url: str = ""
    """The main branch's history page."""
    results_url: str = ""
    """The results file the accept command reads (or the artifact holding it); empty: the report's."""

    @property
    def results(self) -> str:
        return self.results_url or self.report_url


def accept_command(results: Results, results_name: str, *, commit: str | None = None) -> str:
    """The ``perfbudget accept`` command line for these results, as found under ``results_name``;
    ``commit`` names the measured commit where the results do not (else ``--commit SHA`` is left to fill)."""
    argv = ["perfbudget", "accept", shlex.quote(results_name)]
    budgets_dir = _budgets_dir(results)
    if budgets_dir not in ("budgets", ""):
        argv += ["--budgets-dir", shlex.quote(budgets_dir)]
    if results.head_commit is None:
        argv += ["--commit", commit or "SHA"]
    return " ".join([*argv, "--reason", '"<why this change is expected>"'])


def _budgets_dir(results: Results) -> str:
    """The run's budgets folder as the accept command may name it: relative, normalised, without ``..``,
    at most :data:`MD_MAX_TEXT` characters; else empty (the pull request's code wrote the results file)."""
    shown = plain(shown_path(results.meta.budgets_dir or "budgets"))
    inside = not posixpath.isabs(shown) and ".." not in re.split(r"[/\\]", shown) and len(shown) <= MD_MAX_TEXT
    return shown if inside and shown == posixpath.normpath(shown) else ""


def comment_marker(check: str, head: str) -> str:
    """The first line of check ``check``'s comment judging ``head``, by which a poster finds it again."""
    return f"<!-- perfbudget-comment check={quote(check, safe='')} head={head} -->"


def read_marker(body: str) -> tuple[str, str] | None:
    """``(check, head)`` of a comment led by :func:`comment_marker`, ``("", "")`` for the bare
    :data:`COMMENT_MARKER`, ``None`` for any other comment."""
    first = body.split("\n", 1)[0].rstrip("\r")
    if first == COMMENT_MARKER:
        return "", ""
    m = _MARKER.fullmatch(first)
    return (unquote(m.group(1)), m.group(2)) if m else None


def stale_comment(body: str, head: str) -> str:
    """A comment of ours marked stale (replacing an earlier note): the push of ``head`` gave no results."""
    first, _, rest = body.partition("\n")
    judged = (read_marker(first) or ("", ""))[1]
    if rest.startswith(_STALE):
        rest = rest.partition("\n")[2].lstrip("\n")
    old = md_text(judged[:12], code=True) if judged else "an earlier commit"
    note = f"{_STALE}no results for {md_text(head[:12], code=True)}: this comment judged {old}."
    return "\n".join([first, note, "", rest])


def pr_comment(results: Results, *, title: str = "perf", links: CommentLinks | None = None,
               results_name: str = "results.json", commit: str | None = None,
               marker: str = COMMENT_MARKER, head: str = "") -> str:
    """Markdown for a pull request's comment, led by ``marker``: failing, erroring and inconclusive checks
    first with the comparison that decided each, what moved, a folded line per passing group, the links,
    and the accept command when a budget would change.

    Args:
        results: the run's results.
        title: the heading's name.
        links: where the HTML report, history and results file are.
        results_name: the results file as the reader will have it (the accept command names it).
        commit: the measured commit, for results that do not name it (see :func:`accept_command`).
        marker: the first line (:func:`comment_marker`).
        head: the pull request's head commit this comment judges, named under the heading.
    """
    links = links or CommentLinks()
    records = ordered(results.records)
    judged = f"Judged {md_text(head[:12], code=True)} · " if head else ""
    problems = md_run_problems(results)
    if not records:
        return _capped([marker, f"### ⚠️ {title}: no perf records", ""],
                       [f"{judged}The run recorded no perf checks: did the selection pick any perf test?", "",
                        *problems], [], [], tail=[])
    # Worst first; within a test, the headline metrics before the per-operator ones.
    look = sorted((r for r in records if r.outcome in _NEEDS_A_LOOK),
                  key=lambda r: (OUTCOME_ORDER.get(r.outcome, 9), r.key,
                                 op_of(r.metric) is not None, r.metric))
    icon, words = headline(records)
    lead = [marker, f"### {icon} {title}: {words}", ""]
    about = [judged + _how(results, links), "", *problems]
    unlike = sorted({b.not_comparable for r in records if (b := r.base) is not None and b.not_comparable})
    if unlike:
        about += [f"**Not comparable with the base**: the sides measured differently ({md_text('; '.join(unlike))}, "
                  "base vs head). Measure both sides with the base's settings to compare them, or accept the "
                  "change with a reason.", ""]
    rest = _moved(records, shown={(r.key, r.metric) for r in look[:_MAX_ROWS]}) if look else []
    rest += _groups([r for r in records if r.outcome not in _NEEDS_A_LOOK])
    accept = _accept(results, links, results_name, commit) \
        if any(r.outcome in (Outcome.FAIL, Outcome.STALE) for r in records) else []
    return _capped(lead, about, look, rest, tail=accept)


#: Room kept for what a cut comment says of the cut (and the ``</details>`` it closes).
_CUT_NOTE = 500


def _capped(lead: list[str], about: list[str], look: list[Record], rest: list[str], *, tail: list[str]) -> str:
    """The comment up to :data:`MAX_COMMENT_CHARS`: ``lead``, ``tail`` (what the reader acts on) and the
    table of ``look`` first, as many rows as fit; ``about`` and ``rest`` fill the room left in whole
    lines (a ``<details>`` left open closed), and the cut is said."""
    rows = md_table(["", "check", *DECIDING_COLUMNS], (_row(r) for r in look[:_MAX_ROWS])) if look else []
    text = "\n".join([*lead, *about, *_table(rows, look), *rest, *tail])
    if len(text) <= MAX_COMMENT_CHARS:
        return text
    room = MAX_COMMENT_CHARS - _CUT_NOTE - _size(lead) - _size(tail)
    rows = md_fit(rows, room - _CUT_NOTE)
    table = _table(rows if len(rows) > 2 else [], look)
    about = md_fit(about, room - _size(table), skip=True)
    rest = md_fit(rest, room - _size(table) - _size(about), skip=True)
    size = _size([*lead, *about, *table, *rest])
    return "\n".join([*lead, *about, *table, *rest, "", f"… the comment is cut, {size:,} of {len(text):,} "
                      "characters shown (GitHub takes 65,536): the rest is in the report.", "", *tail])


def _table(rows: list[str], look: list[Record]) -> list[str]:
    """The table's lines (header, rule and rows), then how many of ``look`` it does not show."""
    cut = look[max(len(rows) - 2, 0):]
    if not cut:
        return [*rows, ""] if rows else []
    failing = all(r.outcome in (Outcome.FAIL, Outcome.ERROR) for r in cut)
    what = "failing" if failing else "failing or inconclusive"
    return [*rows, "", f"… {len(cut)} {what} check{'s' if len(cut) != 1 else ''} not shown: see the report.", ""]


def _size(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


def _how(results: Results, links: CommentLinks) -> str:
    """One line: what the run compared with, on which devices, and the links."""
    ab = results.meta.ab
    if ab is not None and ab.base_commit:
        how = f"Lockstep A/B against `{ab.base_commit[:12]}`"
        if ab.merge_base and ab.base_ref:
            how += f" (merge-base with {md_text(ab.base_ref, code=True)})"
        if ab.pairs or ab.valid_pairs:  # pairs run, of which these were used (0 when every one was lost)
            how += f", {ab.valid_pairs} process pair{'s' if ab.valid_pairs != 1 else ''}"
    elif has_base(results.records):
        how = "Lockstep A/B against the base commit"
    else:
        how = "Against the stored budgets"
    parts = [how + " on " + _devices(results.records)]
    same = links.report_url and links.report_url == links.results
    named = (("HTML report and results" if same else "HTML report", links.report_url),
             ("history", links.history_url), ("results", "" if same else links.results))
    for label, url in named:
        if url:
            parts.append(f"[{label}]({url})")
    return " · ".join(parts)


def _devices(records: Sequence[Record]) -> str:
    """The records' devices: the first :data:`_MAX_DEVICES`, then how many more."""
    labels = devices(records)
    shown = ", ".join(md_text(d, code=True) for d in labels[:_MAX_DEVICES])
    more = len(labels) - _MAX_DEVICES
    return f"{shown} and {more} more device{'s' if more != 1 else ''}" if more > 0 else shown


def _row(r: Record) -> list[str]:
    icon = ICON.get(r.outcome, "")
    return [f"{icon} {r.outcome}", f"{md_text(r.key, code=True)} {md_text(r.metric, code=True)}", *deciding_cells(r)]


def _moved(records: Sequence[Record], shown: set[tuple[str, str]]) -> list[str]:
    """Per failing test, the operators and functions that moved, but none the table already shows."""
    out: list[str] = []
    tests = failing_tests(records)
    for t in tests[:_MAX_ROWS]:
        moves = [m for m in t.moves if (t.key, m.metric) not in shown]
        found = [move_line(m) for m in moves[:_MAX_MOVES]] + t.attribution[:_MAX_MOVES + 1]
        if found:
            out.append(f"- {md_text(t.key, code=True)} moved: " + "; ".join(md_text(x.strip()) for x in found))
    if len(tests) > _MAX_ROWS:
        out.append(f"- … {len(tests) - _MAX_ROWS} more failing tests in the report")
    return ["**What moved**", "", *out, ""] if out else []


def _groups(records: Sequence[Record]) -> list[str]:
    """One line per workload key (and device) of the checks that need no look, collapsed."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((r.key, device_label(r)), []).append(r)
    if not groups:
        return []
    several = len({dev for _, dev in groups}) > 1
    lines = []
    for (key, dev), group in sorted(groups.items())[:_MAX_GROUPS]:
        worst = min(group, key=lambda r: OUTCOME_ORDER.get(r.outcome, 9)).outcome
        on = f" on {md_text(dev, code=True)}" if several else ""
        line = f"- {ICON.get(worst, '')} {md_text(key, code=True)}{on}: {summary_line(group)}"
        moves = [(abs(d.change), r, d) for r in group
                 if (d := deciding(r)) is not None and d.change is not None]
        if moves:
            _, r, d = max(moves, key=lambda x: x[0])
            line += f"; largest change {md_text(r.metric, code=True)} {d.change:+.1%} vs {d.against}"
        lines.append(line)
    if len(groups) > _MAX_GROUPS:
        lines.append(f"- … {len(groups) - _MAX_GROUPS} more groups in the report")
    n = len(records)
    return [f"<details><summary>{n} other check{'s' if n != 1 else ''} in {len(groups)} "
            f"group{'s' if len(groups) != 1 else ''}: {summary_line(records)}</summary>", "",
            *lines, "", "</details>", ""]


def _accept(results: Results, links: CommentLinks, results_name: str,
            commit: str | None) -> list[str]:
    url = links.results
    where = f"[the results]({url})" if url else "the results file"
    command = accept_command(results, results_name, commit=commit)
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall("`+", command))])
    outside = "" if _budgets_dir(results) else (" (the results' budgets folder is left out: absolute, outside this "
                                                "checkout or too long; add --budgets-dir with yours unless it is budgets)")
    return [f"**Accept this change** after review: with {where} ({md_text(results_name, code=True)}) in this "
            f"branch's checkout, run{outside}", "",
            f"{fence}sh", command, fence, "",
            "and commit the budget files it writes. It writes exact, memory and numeric budgets, "
            "and timing only into a budget file keyed by the machine that measured it, run on "
            "that machine (or with `--trust-identity`: a results file cannot prove where it ran); "
            "a timing change judged against the base is part of the base once merged.", ""]
