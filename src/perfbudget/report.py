"""Readable renderings of verdicts and results: the budget table of a test and of a session."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .results import Record

__all__ = ["fmt_value", "records_table", "text_table"]

_ORDER = {"error": 0, "fail": 1, "unbudgeted": 2, "stale": 3, "unmeasurable": 4, "pass": 5}


def fmt_value(x: float | None, unit: str = "") -> str:
    """Compact number with its unit (``38.21 ms``, ``2.416e+09``, ``0.1234``)."""
    if x is None:
        return "-"
    if isinstance(x, str):  # non-finite values survive JSON as strings
        return x
    if float(x).is_integer() and abs(x) < 1e9:
        s = f"{int(x)}"
    elif abs(x) >= 1e5 or (abs(x) < 1e-3 and x != 0):
        s = f"{x:.4g}"
    else:
        s = f"{x:.4g}"
    return f"{s} {unit}" if unit and unit != "1" else s


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned plain-text table with a rule under the header."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def _row(r: Record, with_key: bool) -> list[str]:
    b = r.budget
    budget = fmt_value(b["value"], r.unit) if b else "-"
    tol = f"{b['tolerance']:.0%}" if b else "-"
    ci = f"{fmt_value(r.ci[0])}-{fmt_value(r.ci[1])}" if r.ci else "-"
    cv = f"{r.cv:.1%}" if isinstance(r.cv, (int, float)) else "-"
    cells = [r.metric, budget, tol, fmt_value(r.value, r.unit), ci, str(r.n), cv, r.outcome.upper()]
    return [r.key, *cells] if with_key else cells


def records_table(records: Iterable[Record], *, with_key: bool = False, sort: bool = True) -> str:
    """The budget table: metric, budget, tolerance, measured, CI, samples, noise, verdict."""
    recs = list(records)
    if sort:
        recs.sort(key=lambda r: (_ORDER.get(r.outcome, 9), r.key, r.metric))
    header = ["metric", "budget", "tol", "measured", "CI", "n", "cv", "verdict"]
    if with_key:
        header = ["key", *header]
    return text_table(header, (_row(r, with_key) for r in recs))
