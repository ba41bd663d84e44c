"""Two results files compared metric by metric and operator by operator: what ``perfbudget diff`` shows."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..extras import OperatorTable
from ..measure.operators import OpTable
from ..metrics import OP_METRIC_FAMILIES
from ..results import Record, Results
from .common import (
    device_label,
    finite,
    fmt_value,
    md_table,
    md_text,
    op_of,
    plain,
    text_table,
    tolerance_of,
)

__all__ = ["Change", "DiffFormat", "diff_results", "render_diff"]

DiffFormat = Literal["text", "markdown"]

_QUIET = ("same", "n/a")


@dataclass(frozen=True, kw_only=True)
class Change:
    """One metric compared between a base and a new results file."""

    key: str
    metric: str
    base: Record | None
    new: Record | None
    threshold: float
    """Relative change that counts as a move."""

    @property
    def direction(self) -> str:
        r = self.new or self.base
        return r.direction if r and r.direction else "lower"

    @property
    def rel(self) -> float | None:
        """new / base - 1; ``inf`` from zero; ``None`` when either side has no finite value."""
        b = finite(self.base.value) if self.base else None
        n = finite(self.new.value) if self.new else None
        if b is None or n is None:
            return None
        if b == 0:
            return 0.0 if n == 0 else math.inf
        return n / b - 1

    @property
    def status(self) -> str:
        """``worse``, ``better``, ``same`` (within the threshold or overlapping CIs), ``new``, ``gone``, ``n/a``."""
        if self.base is None:
            return "new"
        if self.new is None:
            return "gone"
        rel = self.rel
        if rel is None:
            return "n/a"
        worse = rel > 0 if self.direction == "lower" else rel < 0
        if abs(rel) <= self.threshold or rel == 0:
            return "same"
        if _overlap(self.base.ci, self.new.ci):
            return "same"  # the medians' CIs overlap: not distinguishable from noise
        return "worse" if worse else "better"


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    if a is None or b is None or not all(math.isfinite(x) for x in (*a, *b)):
        return False
    return a[0] <= b[1] and b[0] <= a[1]


def diff_results(base: Results, new: Results, *, threshold: float | None = None,
                 key: str | None = None) -> tuple[list[Change], str]:
    """Pair the records of two results files by device, key and metric (by key and metric alone,
    with a note saying so, when the two share no device).

    Args:
        base: the reference run (e.g. the main branch).
        new: the run to judge.
        threshold: relative change counted as a move (default: each metric's tolerance).
        key: only this workload key.

    Returns:
        The changes (sorted by key, then metric) and a note (empty or why matching was loose).
    """
    def index(res: Results, with_device: bool) -> dict[tuple[str, ...], Record]:
        out: dict[tuple[str, ...], Record] = {}
        for r in res.records:
            if key is not None and r.key != key:
                continue
            k = (device_label(r), r.key, r.metric) if with_device else (r.key, r.metric)
            out.setdefault(k, r)
        return out

    note = ""
    devices_b = {device_label(r) for r in base.records}
    devices_n = {device_label(r) for r in new.records}
    with_device = bool(devices_b & devices_n) or not devices_b or not devices_n
    if not with_device:
        note = (f"no common device ({', '.join(sorted(devices_b))} vs {', '.join(sorted(devices_n))}): "
                "compared by key and metric")
    ib, inew = index(base, with_device), index(new, with_device)
    changes = []
    for k in sorted(set(ib) | set(inew)):
        b, n = ib.get(k), inew.get(k)
        ref = n or b
        assert ref is not None
        changes.append(Change(key=ref.key, metric=ref.metric, base=b, new=n,
                              threshold=tolerance_of(ref) if threshold is None else threshold))
    return changes, note


def _pct(rel: float | None) -> str:
    if rel is None:
        return ""
    return "new" if math.isinf(rel) else f"{rel:+.1%}"


def _val(r: Record | None) -> str:
    return fmt_value(r.value, r.unit) if r is not None else "-"


Table = Callable[[list[str], list[list[str]]], list[str]]


def render_diff(changes: Sequence[Change], note: str = "", *, fmt: DiffFormat = "text", show_all: bool = False) -> str:
    """The comparison as text or Markdown: per key, the operators, the other metrics and the operator
    tables kept in records' ``extra``.

    Args:
        changes: from :func:`diff_results`.
        note: the note :func:`diff_results` returned, shown first.
        fmt: ``text`` or ``markdown``.
        show_all: also list what did not move.
    """
    md = fmt == "markdown"
    # Names come from the results files: every cell and heading passes the one door of its format.
    esc: Callable[[str], str] = (lambda x: md_text(x, limit=1000)) if md else plain

    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        rows = [[esc(c) for c in row] for row in rows]
        return md_table(header, rows) if md else [text_table(header, rows)]

    def head(text: str, level: int) -> str:
        return f"{'#' * (level + 2)} {text}" if md else (text if level == 1 else f"-- {text}")

    lines: list[str] = []
    if note:
        lines += [f"note: {esc(note)}", ""]
    counts = {s: sum(1 for c in changes if c.status == s) for s in ("worse", "better", "same", "new", "gone")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to compare"
    lines.append(head(f"perf diff: {summary}", 1))
    for k in sorted({c.key for c in changes}):
        mine = [c for c in changes if c.key == k]
        if not show_all and all(c.status in _QUIET for c in mine):
            continue
        lines += ["", head(esc(k), 2)]
        lines += _operator_rows(mine, table, show_all)
        rows = [[c.metric, _val(c.base), _val(c.new), _pct(c.rel), c.status] for c in mine
                if op_of(c.metric) is None and (show_all or c.status not in _QUIET)]
        if rows:
            lines += ["", "metrics:", *table(["metric", "base", "new", "change", "status"], rows)]
        lines += _extra_tables(mine, table, show_all, esc)
    return "\n".join(lines) + "\n"


def _operator_rows(changes: list[Change], table: Table, show_all: bool) -> list[str]:
    """Per-operator records side by side: one row per operator, one column per family."""
    ops: dict[str, dict[str, Change]] = {}
    for c in changes:
        parsed = op_of(c.metric)
        if parsed:
            ops.setdefault(parsed[1], {})[parsed[0]] = c

    def weight(item: tuple[str, dict[str, Change]]) -> float:
        c = item[1].get("op_self_ms") or next(iter(item[1].values()))
        b = finite(c.base.value) if c.base else None
        n = finite(c.new.value) if c.new else None
        return -abs((n or 0.0) - (b or 0.0))

    rows = []
    for op, fams in sorted(ops.items(), key=weight):
        if not show_all and all(c.status in _QUIET for c in fams.values()):
            continue
        cells = [op]
        for fam in OP_METRIC_FAMILIES:
            fc = fams.get(fam)
            cells.append(f"{_val(fc.base)} -> {_val(fc.new)} {_pct(fc.rel)}".strip() if fc else "-")
        cells.append(", ".join(sorted({c.status for c in fams.values()})))
        rows.append(cells)
    return ["", "operators:", *table(["operator", "self ms", "share", "calls", "change"], rows)] if rows else []


def _table(r: Record | None) -> OpTable:
    """The operator table kept in ``r``'s extra, as a ``measure.operators.OpTable`` (empty: none)."""
    kept = OperatorTable.from_extra(r.extra) if r is not None else None
    device = r.device.type if r is not None and r.device is not None else "cpu"
    return OpTable(rows=kept.rows if kept is not None else (), steps=1, device=device)


def _extra_tables(changes: list[Change], table: Table, show_all: bool, esc: Callable[[str], str]) -> list[str]:
    """The operators that moved (``OpDiff.moves``) in the operator tables kept in records' ``extra``."""
    lines: list[str] = []
    for c in changes:
        before, after = _table(c.base), _table(c.new)
        if not before.rows and not after.rows:
            continue
        diff = before.diff(after)
        moved = {m.op for m in diff.moves(min_rel=c.threshold, min_step_share=0.0, k=None)}
        rows = []
        for ch in diff.changes:
            if ch.name not in moved and not show_all:
                continue
            b = None if ch.status == "added" else ch.base_self_ms
            n = None if ch.status == "removed" else ch.new_self_ms
            rel = (n / b - 1) if b and n is not None else None
            calls = f"{fmt_value(None if b is None else ch.base_calls)} -> {fmt_value(None if n is None else ch.new_calls)}"
            rows.append([ch.name, f"{fmt_value(b)} -> {fmt_value(n)}", _pct(rel) if b is not None else "new", calls])
        if rows:
            lines += ["", f"operator table of {esc(c.metric)} (extra):"]
            lines += table(["operator", "self ms", "change", "calls"], rows[:25])
    return lines
