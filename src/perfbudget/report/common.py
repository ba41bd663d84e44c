"""What every report shares: values with units, CI and budget text, "vs base" text, order, counts, failing tests."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..extras import FailureArtifacts, OperatorMoves
from ..measure.operators import OpMove
from ..metrics import STATISTICAL_KINDS, Metric, UnknownMetricError, op_metric, parse_name
from ..results import BaseSide, Record, Results
from ..verdict.rule import beyond, tolerance_for
from ..vocabulary import Outcome, count_outcomes

__all__ = [
    "BASE_COLUMNS",
    "DECIDING_COLUMNS",
    "OUTCOME_ORDER",
    "REGRESSION_OUTCOMES",
    "Deciding",
    "FailingTest",
    "OpMove",
    "base_cells",
    "base_text",
    "budget_text",
    "budget_where",
    "change_text",
    "ci_text",
    "cv_text",
    "deciding",
    "deciding_cells",
    "detectable_text",
    "device_label",
    "devices",
    "failing_tests",
    "finite",
    "fmt_ratio",
    "fmt_tolerance",
    "fmt_value",
    "has_base",
    "headline",
    "interval_text",
    "md_cell",
    "md_fit",
    "md_table",
    "md_text",
    "move_change_text",
    "move_line",
    "moved_operators",
    "moves_note",
    "op_of",
    "ordered",
    "outcome_counts",
    "outcome_text",
    "plain",
    "ratio_ci_text",
    "ratio_text",
    "record_ci_text",
    "regressions",
    "sort_key",
    "summary_line",
    "terminal_text",
    "text_table",
    "tolerance_of",
]

#: Outcomes that make a run red (a regression or a broken measurement/budget).
REGRESSION_OUTCOMES = (Outcome.FAIL, Outcome.ERROR)

#: Report order of outcomes: what needs attention first.
OUTCOME_ORDER: dict[str, int] = {o: i for i, o in enumerate((
    Outcome.ERROR, Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.NOT_MEASURED, Outcome.UNBUDGETED, Outcome.STALE,
    Outcome.NOT_JUDGED, Outcome.ADVISORY, Outcome.UNMEASURABLE, Outcome.PASS))}


def finite(x: float | None) -> float | None:
    """``x`` when it is a finite number, else ``None`` (missing, NaN, inf)."""
    return x if x is not None and math.isfinite(x) else None


def fmt_value(x: float | None, unit: str = "") -> str:
    """Compact number with its unit (``38.21 ms``, ``2.416e+09``, ``0.1234``, ``nan``)."""
    if x is None:
        return "-"
    s = f"{int(x)}" if float(x).is_integer() and abs(x) < 1e9 else f"{x:.4g}"
    return f"{s} {unit}" if unit and unit != "1" else s


def fmt_tolerance(t: float) -> str:
    """A relative tolerance to 3 significant digits (``0.05`` -> ``5%``, ``0.005`` -> ``0.5%``)."""
    return f"{t * 100:.3g}%"


def fmt_ratio(x: float | None) -> str:
    """A head/base ratio to 4 digits (``1.079``), ``-`` when unknown."""
    return "-" if x is None else f"{x:.4g}"


def ci_text(ci: tuple[float, float] | None, fmt: Any = fmt_value) -> str:
    """``lo-hi`` of a confidence interval, ``-`` without one."""
    return f"{fmt(ci[0])}-{fmt(ci[1])}" if ci else "-"


def record_ci_text(r: Record) -> str:
    """The record's CI, with its coverage when that is not the usual 95 % (per-operator families)."""
    return _with_coverage(ci_text(r.ci), r.ci_confidence if r.ci else None)


def _with_coverage(text: str, confidence: float | None) -> str:
    """``text`` with its interval's coverage when that is not the usual 95 % (``(99.6%)``)."""
    return f"{text} ({100 * confidence:.4g}%)" if confidence is not None and abs(confidence - 0.95) > 1e-9 else text


def cv_text(r: Record) -> str:
    """The record's noise (coefficient of variation) as a percentage, ``-`` when unknown."""
    return "-" if r.cv is None or not math.isfinite(r.cv) else f"{r.cv:.1%}"


def budget_text(r: Record) -> str:
    """``38.2 ms ± 5%``, ``-`` for an unbudgeted record."""
    return f"{fmt_value(r.budget.value, r.unit)} ± {fmt_tolerance(r.budget.tolerance)}" if r.budget else "-"


def budget_where(r: Record) -> str:
    """The budget's file and line (``budgets/cpu.yaml:12``), empty when unknown."""
    return r.budget.where if r.budget and r.budget.source else ""


def change_text(r: Record) -> str:
    """Measured vs budget as a signed percentage (``+7.3%``), empty when either is unknown."""
    v = finite(r.value)
    b = finite(r.budget.value) if r.budget else None
    return f"{v / b - 1:+.1%}" if v is not None and b else ""


def tolerance_of(r: Record) -> float:
    """The relative tolerance a record is held to: its budget's, else its metric's default."""
    try:
        metric: Metric | None = parse_name(r.metric).metric
    except UnknownMetricError:  # a metric this version does not know: the rule judges it as timing
        metric = None
    return tolerance_for(metric, r.budget).value


def has_base(records: Iterable[Record]) -> bool:
    """Whether any record was compared with the base commit (lockstep A/B)."""
    return any(r.vs_base is not None for r in records)


def ratio_text(b: BaseSide | None) -> str:
    """head/base with the change it means: ``1.079 (+7.9%)``; ``-`` without a ratio."""
    if b is None or b.ratio is None:
        return "-"
    if not math.isfinite(b.ratio):
        return fmt_ratio(b.ratio)
    return f"{fmt_ratio(b.ratio)} ({b.ratio - 1:+.1%})"


def ratio_ci_text(b: BaseSide | None) -> str:
    """The ratio's CI from the process pairs: ``1.051-1.102``."""
    return ci_text(b.ratio_ci, fmt_ratio) if b is not None else "-"


#: Table columns of a record compared with the base commit; see :func:`base_cells`.
BASE_COLUMNS = ("base", "head/base", "ratio CI", "pairs", "detectable")


def base_cells(r: Record) -> list[str]:
    """The :data:`BASE_COLUMNS` cells of a record (``-`` without base, or for exact checks)."""
    b = r.vs_base
    if b is None:
        return ["-"] * len(BASE_COLUMNS)
    return [fmt_value(b.value, r.unit), ratio_text(b), ratio_ci_text(b), str(b.pairs), detectable_text(b.detectable)]


def detectable_text(x: float | None) -> str:
    """``±3.1%``: the minimum detectable effect of an A/B check, ``-`` when not computed."""
    return "-" if x is None or not math.isfinite(x) else f"±{x:.1%}"


def base_text(r: Record) -> str:
    """One line of the A/B comparison: ``base 38 ms, head/base 1.079 (+7.9%), CI 1.051-1.102, 3 pairs``."""
    b = r.vs_base
    if b is None:
        return ""
    parts = [f"base {fmt_value(b.value, r.unit)}", f"head/base {ratio_text(b)}"]
    if b.ratio_ci:
        parts.append(f"CI {ratio_ci_text(b)}")
    parts.append(f"{b.pairs} process pair{'s' if b.pairs != 1 else ''}")
    if b.detectable is not None:
        parts.append(f"could resolve changes beyond {detectable_text(b.detectable)}")
    return ", ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Deciding:
    """The one comparison that decided a record: head/base, else the value against its budget."""

    against: Literal["base", "budget"]
    change: float | None
    """head/base - 1, or value/budget - 1; ``None`` against a zero or missing reference."""
    interval: tuple[float, float] | None
    """The change's confidence interval, in the same form; ``None`` for exact checks."""
    confidence: float | None
    """Two-sided coverage of ``interval``."""
    detectable: float | None
    """The smallest change (a fraction) the run could have resolved; A/B checks only."""
    tolerance: float
    """The relative tolerance the change was held to, in the bad direction."""
    pairs: int = 0
    """Process pairs behind a head/base ratio."""
    where: str = ""
    """The budget's file and line (``budgets/cpu.yaml:12``) for a budget comparison."""


def _beyond_budget(r: Record) -> bool:
    v, limit = finite(r.value), finite(r.limit)
    return v is not None and limit is not None and beyond(v, limit, "higher" if r.direction == "higher" else "lower")


def deciding(r: Record) -> Deciding | None:
    """What decided ``r``: head/base for a statistical check compared with the base (an exact one
    when judged against the base within its budget), else its budget; ``None`` without either."""
    b = r.vs_base
    ratio = finite(b.ratio) if b is not None else None
    if b is not None and ratio is not None and (
            r.kind in STATISTICAL_KINDS or (b.tolerance is not None and not _beyond_budget(r))):
        ci = b.ratio_ci
        tolerance = b.tolerance if b.tolerance is not None else tolerance_of(r)
        return Deciding(against="base", change=ratio - 1,
                        interval=(ci[0] - 1, ci[1] - 1) if ci else None,
                        confidence=(b.confidence or 0.95) if ci else None, detectable=b.detectable,
                        tolerance=tolerance, pairs=b.pairs)
    if r.budget is None:
        return None
    ref, v = finite(r.budget.value), finite(r.value)
    return Deciding(against="budget", change=v / ref - 1 if v is not None and ref else None,
                    interval=(r.ci[0] / ref - 1, r.ci[1] / ref - 1) if r.ci and ref else None,
                    confidence=r.ci_confidence if r.ci else None, detectable=None,
                    tolerance=r.budget.tolerance, where=budget_where(r))


#: Table columns of the one comparison that decided a record; see :func:`deciding_cells`.
DECIDING_COLUMNS = ("against", "change", "interval", "could resolve", "tolerance")

_MAX_REASON = 160


def deciding_cells(r: Record, *, md: bool = True) -> list[str]:
    """The :data:`DECIDING_COLUMNS` cells of a record, or an undecided record's outcome and reason.
    ``md``: Markdown emphasis and code spans (else plain text)."""
    d = deciding(r)
    if d is None:
        reason = md_text(r.reason, limit=_MAX_REASON) if md else plain(r.reason)[:_MAX_REASON]
        return ["-", f"{r.outcome}: {reason}" if reason else str(r.outcome), "-", "-", "-"]
    code = (lambda x: md_text(x, code=True)) if md else (lambda x: x)
    if d.against == "base":
        against = f"base, {d.pairs} pair{'s' if d.pairs != 1 else ''}"
    else:
        against = f"budget {code(d.where)}" if d.where else "budget"
    change = "-" if d.change is None else f"**{d.change:+.1%}**" if md else f"{d.change:+.1%}"
    budget = r.budget.value if r.budget is not None else None
    if d.against == "budget" and budget is not None:
        change += f" ({fmt_value(r.value, r.unit)} vs {fmt_value(budget, r.unit)})"
    resolve = detectable_text(d.detectable)
    return [against, change, interval_text(d), resolve, fmt_tolerance(d.tolerance)]


def interval_text(d: Deciding) -> str:
    """``+6.1% to +11.0%``, with its coverage when that is not 95 %; ``exact`` without one."""
    if d.interval is None:
        return "exact"
    return _with_coverage(f"{d.interval[0]:+.1%} to {d.interval[1]:+.1%}", d.confidence)


def device_label(r: Record) -> str:
    """The record's device as a short label (``cpu AMD EPYC (1 thread)``, ``cuda NVIDIA H100``)."""
    return r.device.label if r.device is not None else "unknown device"


def sort_key(r: Record) -> tuple[Any, ...]:
    """Worst outcome first, then key, metric and test."""
    return (OUTCOME_ORDER.get(r.outcome, 9), r.key, r.metric, r.nodeid)


def ordered(records: Iterable[Record]) -> list[Record]:
    """Deterministic order, independent of shard or worker order."""
    return sorted(records, key=lambda r: (device_label(r), r.nodeid, r.key, r.metric))


def outcome_counts(records: Iterable[Record]) -> dict[str, int]:
    """``{outcome: count}``, worst outcome first."""
    out = count_outcomes(r.outcome for r in records)
    return dict(sorted(out.items(), key=lambda kv: OUTCOME_ORDER.get(kv[0], 9)))


def outcome_text(r: Record) -> str:
    """``FAIL``, or ``ADVISORY (fail)`` for an advisory record with its would-be outcome."""
    text = r.outcome.upper().replace("_", " ")
    return f"{text} ({r.advice})" if r.outcome == Outcome.ADVISORY and r.advice else text


def summary_line(records: Iterable[Record]) -> str:
    """``3 fail, 1 unbudgeted, 6 pass``."""
    counts = outcome_counts(records)
    return ", ".join(f"{n} {o}" for o, n in counts.items()) if counts else "no perf records"


def headline(records: Iterable[Record]) -> tuple[str, str]:
    """The icon (❌ failed or errored, ❔ inconclusive, ✅ otherwise, ⚠️ no records) and words every
    report leads with."""
    # The words are summary_line's counts: no report can call a run clean that another shows open.
    records = list(records)
    seen = {r.outcome for r in records}
    icon = ("⚠️" if not records else "❌" if seen & set(REGRESSION_OUTCOMES)
            else "❔" if Outcome.INCONCLUSIVE in seen else "✅")
    return icon, summary_line(records)


def devices(records: Iterable[Record]) -> list[str]:
    """Device labels of the records, sorted."""
    return sorted({device_label(r) for r in records})


def run_problems(results: Results) -> list[str]:
    """What went wrong beside the records: an unfinished run, a test whose measuring raised.
    Untrusted text: each renderer escapes it."""
    meta = results.meta
    out = [f"the run did not finish: {meta.unfinished}"] if meta.unfinished else []
    return out + [f"{e.get('nodeid', '?')}: raised while measuring{' on the ' + e['side'] if e.get('side') else ''}: "
                  f"{e.get('error', '?')}" for e in meta.errors]


def md_run_problems(results: Results) -> list[str]:
    """:func:`run_problems` as Markdown lines, a blank line after them (none without problems)."""
    lines = [f"- ⚠️ {md_text(p)}" for p in run_problems(results)]
    return [*lines, ""] if lines else []


def regressions(records: Iterable[Record]) -> list[Record]:
    """Records whose outcome makes the run red (fail or error), in report order."""
    return [r for r in ordered(records) if r.outcome in REGRESSION_OUTCOMES]


def op_of(metric: str) -> tuple[str, str] | None:
    """``op_self_ms[aten::mm]`` -> ``("op_self_ms", "aten::mm")``; ``None`` for other metrics."""
    return op_metric(metric)


def move_change_text(m: OpMove) -> str:
    """``+50.0%``; ``new``/``not budgeted`` without a reference, ``gone`` when it did not run."""
    if m.before is None:
        return "not budgeted" if m.against == "budget" else "new"
    if m.after is None:
        return "gone"
    return f"{m.change:+.1%}" if math.isfinite(m.change) else "new"


def move_line(m: OpMove) -> str:
    """``aten::mm op_self_ms: 12 ms vs budget 8 ms (+50.0%, fail)``."""
    why = ", ".join(x for x in (move_change_text(m), m.outcome) if x)
    if m.before is None:
        return f"{m.op} {m.family}: {fmt_value(m.after, m.unit)} ({why})"
    if m.after is None:
        return f"{m.op} {m.family}: was {fmt_value(m.before, m.unit)} ({why})"
    return f"{m.op} {m.family}: {fmt_value(m.after, m.unit)} vs {m.against} {fmt_value(m.before, m.unit)} ({why})"


def moved_operators(records: Iterable[Record]) -> list[OpMove]:
    """The operators that moved (:class:`~perfbudget.extras.OperatorMoves`), each once, in record order."""
    moved = (m for r in records if (om := OperatorMoves.from_extra(r.extra)) is not None for m in om.moves)
    return list(dict.fromkeys(moved))


def moves_note(records: Iterable[Record]) -> str:
    """How the records' moved operators were found, when not by the test's own checks (first note given)."""
    notes = (m.note for r in records if (m := OperatorMoves.from_extra(r.extra)) is not None and m.note)
    return next(notes, "")


@dataclass(frozen=True, kw_only=True)
class FailingTest:
    """One test (on one device) with failing or erroring records, and what explains them."""

    device: str
    nodeid: str
    key: str
    bad: tuple[Record, ...]
    """Failing/erroring records: the test's headline metrics first, per-operator ones after."""
    records: tuple[Record, ...]
    """Every record of the test."""

    @property
    def worst(self) -> str:
        """``error`` when any record errored, else ``fail``."""
        return "error" if any(r.outcome == Outcome.ERROR for r in self.bad) else "fail"

    @property
    def moves(self) -> list[OpMove]:
        """The operators that moved, as the failing records carry them."""
        return moved_operators(self.bad)

    @property
    def moves_note(self) -> str:
        """How the moved operators were found, when not by the test's own checks (e.g. profiled on failure)."""
        return moves_note(self.bad)

    @property
    def attribution(self) -> list[str]:
        """Attribution lines of the failing records, each once."""
        return list(dict.fromkeys(a for r in self.bad for a in r.attribution))

    @property
    def artifacts(self) -> dict[str, str]:
        """Failure artifacts (label -> path) of the failing records."""
        found = (a.paths for r in self.bad if (a := FailureArtifacts.from_extra(r.extra)) is not None)
        return {label: path for paths in found for label, path in paths}


def failing_tests(records: Iterable[Record]) -> list[FailingTest]:
    """Tests with a failing or erroring record, in report order."""
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for r in ordered(records):
        groups.setdefault((device_label(r), r.nodeid, r.key), []).append(r)
    out = []
    for (dev, nodeid, key), group in groups.items():
        bad = [r for r in group if r.outcome in REGRESSION_OUTCOMES]
        if bad:
            bad.sort(key=lambda r: (op_of(r.metric) is not None, r.outcome != Outcome.ERROR, r.metric))
            out.append(FailingTest(device=dev, nodeid=nodeid, key=key, bad=tuple(bad), records=tuple(group)))
    return out


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned plain-text table with a rule under the header."""
    cells = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


#: The most characters one name or reason from a results file shows in Markdown (a cell, a line):
#: a longer one is cut, ending in "…", so rows of them stay under GitHub's 65,536-character comment.
MD_MAX_TEXT = 200

#: What starts markup (``$``: GitHub's math); an underscore inside a word (``op_share``) never does.
_MD_PUNCTUATION = re.compile(r"([\\`*\[\]<>&~$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
#: Where GitHub links text to something else: a mention, an issue (``#2``, ``owner/repo#1``,
#: ``GH-3``), an autolink; each broken by a zero-width joiner.
_MD_REFERENCE = re.compile(r"([@#]|:(?=//)|w(?=ww)|(?<![A-Za-z0-9])(?i:gh)(?=-))")
#: Every line break a reader may honour: a table row or a Markdown line ends at none of them.
_LINE_BREAK = re.compile("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
#: Unicode categories :func:`plain` shows as a space: control, format, line and paragraph separators.
_NOT_PLAIN = ("Cc", "Cf", "Zl", "Zp")


def plain(text: Any) -> str:
    """``text`` on one line: control and format characters (newlines, ANSI escapes, right-to-left
    overrides) and line separators each shown as a space."""
    return "".join(" " if unicodedata.category(c) in _NOT_PLAIN else c for c in str(text))


def terminal_text(text: Any) -> str:
    """The one door for text from a file into a terminal: each line :func:`plain`, so no escape
    sequence sets the title or moves the cursor and no carriage return overwrites a line."""
    return "\n".join(map(plain, str(text).split("\n")))


def md_text(text: Any, *, code: bool = False, limit: int = MD_MAX_TEXT) -> str:
    """The one door for text from a results file into Markdown: inert, on one line, cut at ``limit``.

    ``code``: a code span fenced longer than any backtick run inside. Else prose: punctuation,
    ``<``/``&`` and ``$`` backslash-escaped; mentions, issue references and autolinks broken by a
    zero-width joiner (:data:`_MD_REFERENCE`). Pipes are :func:`md_cell`'s.
    """
    s = plain(text)
    if len(s) > limit:
        s = s[:limit - 1] + "…"
    if code:
        fence = "`" * (max(map(len, re.findall("`+", s)), default=0) + 1)
        pad = " " if s[:1] in ("`", " ") or s[-1:] in ("`", " ") else ""
        return f"{fence}{pad}{s}{pad}{fence}"
    s = _MD_PUNCTUATION.sub(r"\\\1", s)
    return _MD_REFERENCE.sub("\\1\u200d", s)


def md_cell(text: Any) -> str:
    """A Markdown table cell: pipes escaped, line breaks (``\\r``, ``\\u2028`` too) flattened."""
    return _LINE_BREAK.sub(" ", str(text).replace("|", "\\|"))


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A Markdown table as lines."""
    out = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out.extend("| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows)
    return out


def md_fit(lines: Iterable[str], room: int, *, size: Callable[[str], int] = len, skip: bool = False) -> list[str]:
    """The ``lines`` that fit in ``room`` (by ``size``, plus a newline each): up to the first that does
    not, or (``skip``) every one that does; ``<details>`` kept balanced."""
    kept: list[str] = []
    used = depth = 0
    for line in lines:
        closes = line == "</details>"
        if closes and not depth:
            continue
        if used + size(line) + 1 > room:
            if skip:
                continue
            break
        kept.append(line)
        used += size(line) + 1
        depth += line.startswith("<details>") - closes
    return kept + ["", "</details>"] * depth
