"""Readable renderings of results: terminal tables, Markdown for CI step summaries, JUnit properties and XML."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .results import Record, Results

__all__ = [
    "REGRESSION_OUTCOMES",
    "FailingTest",
    "OpMove",
    "bucket_rows",
    "failing_tests",
    "fmt_value",
    "junit_properties",
    "junit_xml",
    "markdown_report",
    "moved_operators",
    "op_rows",
    "op_table_extra",
    "padding_extra",
    "records_table",
    "regressions",
    "terminal_report",
    "text_table",
]

_ORDER = {"error": 0, "fail": 1, "unbudgeted": 2, "stale": 3, "unmeasurable": 4, "pass": 5}

#: Outcomes that make a run red (a regression or a broken measurement/budget).
REGRESSION_OUTCOMES = ("fail", "error")

#: Metric families judged per operator: their records are "the operators that moved".
_OP_FAMILIES = ("op_self_ms", "op_share", "op_count")

_ICON = {"fail": "❌", "error": "⛔", "stale": "🟡", "unbudgeted": "⚪", "unmeasurable": "➖", "pass": "✅"}

#: GitHub caps one step summary at 1 MiB; stay well under it.
_MARKDOWN_MAX_ROWS = 400


def fmt_value(x: float | None, unit: str = "") -> str:
    """Compact number with its unit (``38.21 ms``, ``2.416e+09``, ``0.1234``)."""
    if x is None:
        return "-"
    if isinstance(x, str):  # non-finite values survive JSON as strings
        return x
    s = f"{int(x)}" if float(x).is_integer() and abs(x) < 1e9 else f"{x:.4g}"
    return f"{s} {unit}" if unit and unit != "1" else s


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned plain-text table with a rule under the header."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def _num(x: Any) -> float | None:
    """A finite float, or ``None`` for missing and non-finite (string) values."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _ci_text(r: Record) -> str:
    return f"{fmt_value(r.ci[0])}-{fmt_value(r.ci[1])}" if r.ci else "-"


def _row(r: Record, with_key: bool) -> list[str]:
    b = r.budget
    budget = fmt_value(b["value"], r.unit) if b else "-"
    tol = f"{b['tolerance']:.0%}" if b else "-"
    cv = f"{r.cv:.1%}" if isinstance(r.cv, (int, float)) else "-"
    cells = [r.metric, budget, tol, fmt_value(r.value, r.unit), _ci_text(r), str(r.n), cv, r.outcome.upper()]
    return [r.key, *cells] if with_key else cells


def _sort_key(r: Record) -> tuple[Any, ...]:
    return (_ORDER.get(r.outcome, 9), r.key, r.metric, r.nodeid)


def records_table(records: Iterable[Record], *, with_key: bool = False, sort: bool = True) -> str:
    """The budget table: metric, budget, tolerance, measured, CI, samples, noise, verdict."""
    recs = list(records)
    if sort:
        recs.sort(key=_sort_key)
    header = ["metric", "budget", "tol", "measured", "CI", "n", "cv", "verdict"]
    if with_key:
        header = ["key", *header]
    return text_table(header, (_row(r, with_key) for r in recs))


# --------------------------------------------------------------------------- grouping


def device_label(r: Record) -> str:
    """The record's device as a short label (``cpu AMD EPYC (1 thread)``, ``cuda NVIDIA H100``)."""
    d = r.device or {}
    if d.get("type") == "cpu":
        t = d.get("threads")
        th = f" ({t} thread{'s' if t != 1 else ''})" if t else ""
        return f"cpu {d.get('model', '?')}{th}"
    return f"{d.get('type', '?')} {d.get('model', '?')}"


def _ordered(records: Iterable[Record]) -> list[Record]:
    """Deterministic order, independent of shard or worker order."""
    return sorted(records, key=lambda r: (device_label(r), r.nodeid, r.key, r.metric))


def _counts(records: Iterable[Record]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r.outcome] = out.get(r.outcome, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: _ORDER.get(kv[0], 9)))


def _devices(records: Iterable[Record]) -> list[str]:
    return sorted({device_label(r) for r in records})


def regressions(records: Iterable[Record]) -> list[Record]:
    """Records whose outcome makes the run red (fail or error), in report order."""
    return [r for r in _ordered(records) if r.outcome in REGRESSION_OUTCOMES]


def _same_test(records: Sequence[Record], r: Record) -> list[Record]:
    lab = device_label(r)
    return [x for x in records if x.nodeid == r.nodeid and x.key == r.key and device_label(x) == lab]


# --------------------------------------------------------------------------- operators


@dataclass(frozen=True, kw_only=True)
class OpMove:
    """How far one operator's measurement sits from its budget (one per-operator record)."""

    op: str
    metric: str
    family: str
    budget: float
    measured: float
    unit: str
    outcome: str
    tolerance: float = 0.0

    @property
    def change(self) -> float:
        """Relative change measured vs budget (+0.25 = 25 % above the budget)."""
        return self.measured / self.budget - 1 if self.budget else math.inf

    def line(self) -> str:
        ch = f"{self.change:+.1%}" if math.isfinite(self.change) else "new"
        return (f"{self.op} {self.family}: {fmt_value(self.measured, self.unit)} vs budget "
                f"{fmt_value(self.budget, self.unit)} ({ch}, {self.outcome})")


def _op_of(metric: str) -> tuple[str, str] | None:
    m = re.fullmatch(r"([a-z_]+)\[(.+)\]", metric)
    if m is None or m.group(1) not in _OP_FAMILIES:
        return None
    return m.group(1), m.group(2)


def moved_operators(records: Iterable[Record], *, k: int = 5) -> list[OpMove]:
    """The per-operator records of one test that moved beyond their tolerance.

    Args:
        records: records of one test (``op_self_ms[...]``, ``op_share[...]``, ``op_count[...]``
            are used; others are ignored).
        k: how many to return.

    Returns:
        Up to ``k`` moves, failing ones first, then largest relative change; operators
        within their budget's tolerance are left out as noise.
    """
    out = []
    for r in records:
        parsed = _op_of(r.metric)
        value = _num(r.value)
        if parsed is None or value is None or not r.budget:
            continue
        budget = _num(r.budget.get("value"))
        if budget is None:
            continue
        out.append(OpMove(op=parsed[1], metric=r.metric, family=parsed[0], budget=budget, measured=value,
                          unit=r.unit, outcome=r.outcome, tolerance=float(r.budget.get("tolerance") or 0.0)))
    out.sort(key=lambda m: (m.outcome not in REGRESSION_OUTCOMES, -abs(m.change), m.metric))
    return [m for m in out if m.outcome in REGRESSION_OUTCOMES or abs(m.change) > m.tolerance][:k]


def op_table_extra(table: Any, *, k: int = 25) -> dict[str, Any]:
    """``extra`` for a record from an operator table (``measure.operators.OpTable`` or alike).

    The report plots it as the per-operator breakdown and ``perfbudget diff`` compares it.

    Args:
        table: object whose ``rows`` have ``name``, ``self_ms``, ``calls`` and optionally
            ``share``, ``total_ms``, ``flops``.
        k: keep the ``k`` heaviest operators.

    Returns:
        ``{"ops": [{"name", "self_ms", "calls", "share", "total_ms", "flops"}, ...]}``.
    """
    rows = sorted(table.rows, key=lambda r: -float(r.self_ms))[:k]
    ops = []
    for r in rows:
        row = {"name": str(r.name), "self_ms": float(r.self_ms), "calls": float(r.calls)}
        for name in ("share", "total_ms", "flops"):
            if hasattr(r, name):
                row[name] = float(getattr(r, name))
        ops.append(row)
    return {"ops": ops}


def padding_extra(per_bucket: Mapping[Any, Any], *, sorted_rate: float | None = None) -> dict[str, Any]:
    """``extra`` for a ``padding_rate`` record: padding per length bucket.

    Args:
        per_bucket: bucket label -> object with ``real_tokens`` and ``pad_tokens``
            (``levers.bucketing.PaddingStats``) or a mapping with those keys.
        sorted_rate: padding rate of length-sorted batching, the lower bound to compare with.

    Returns:
        ``{"buckets": [{"bucket", "real_tokens", "pad_tokens", "padding_rate"}], "sorted_padding_rate"}``.
    """
    rows = []
    for label, st in per_bucket.items():
        real = int(st["real_tokens"] if isinstance(st, Mapping) else st.real_tokens)
        pad = int(st["pad_tokens"] if isinstance(st, Mapping) else st.pad_tokens)
        rate = pad / (real + pad) if real + pad else 0.0
        rows.append({"bucket": str(label), "real_tokens": real, "pad_tokens": pad, "padding_rate": rate})
    out: dict[str, Any] = {"buckets": rows}
    if sorted_rate is not None:
        out["sorted_padding_rate"] = float(sorted_rate)
    return out


def op_rows(extra: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Operator rows of a record's ``extra`` (``{"ops": [...]}`` or ``{"ops": {name: {...}}}``)."""
    ops = extra.get("ops") if isinstance(extra, Mapping) else None
    if isinstance(ops, Mapping):
        ops = [{"name": n, **(v if isinstance(v, Mapping) else {"self_ms": v})} for n, v in ops.items()]
    if not isinstance(ops, list):
        return []
    return [dict(o) for o in ops if isinstance(o, Mapping) and "name" in o and _num(o.get("self_ms")) is not None]


def bucket_rows(extra: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-bucket padding rows of a record's ``extra``, each with a ``padding_rate``.

    Accepts ``{"buckets": [{"bucket", "padding_rate" | "real_tokens"+"pad_tokens"}]}``
    or ``{"padding_by_bucket": {label: rate}}``.
    """
    if not isinstance(extra, Mapping):
        return []
    by = extra.get("padding_by_bucket")
    if isinstance(by, Mapping):
        return [{"bucket": str(k), "padding_rate": float(v)} for k, v in by.items() if _num(v) is not None]
    rows = extra.get("buckets")
    if not isinstance(rows, list):
        return []
    out = []
    for i, b in enumerate(rows):
        if not isinstance(b, Mapping):
            continue
        rate = _num(b.get("padding_rate"))
        if rate is None:
            real, pad = _num(b.get("real_tokens")), _num(b.get("pad_tokens"))
            if real is None or pad is None or real + pad <= 0:
                continue
            rate = pad / (real + pad)
        out.append({**b, "bucket": str(b.get("bucket", i)), "padding_rate": rate})
    return out


# --------------------------------------------------------------------------- shared text


def _budget_text(r: Record) -> str:
    b = r.budget
    if not b:
        return "-"
    return f"{fmt_value(b['value'], r.unit)} ± {b['tolerance']:.0%}"


def _source(r: Record) -> str:
    b = r.budget
    if not b or not b.get("source"):
        return ""
    return f"{b['source']}:{b['line']}" if b.get("line") else str(b["source"])


def _change(r: Record) -> str:
    v = _num(r.value)
    b = _num(r.budget.get("value")) if r.budget else None
    if v is None or not b:
        return ""
    return f"{v / b - 1:+.1%}"


def _artifacts(r: Record) -> dict[str, str]:
    art = r.extra.get("artifacts") if isinstance(r.extra, dict) else None
    return {str(k): str(v) for k, v in art.items()} if isinstance(art, dict) else {}


def _summary_line(records: Sequence[Record]) -> str:
    counts = _counts(records)
    if not counts:
        return "no perf records"
    return ", ".join(f"{n} {o}" for o, n in counts.items())


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
    def moves(self) -> list[OpMove]:
        """The operators that moved beyond their tolerance."""
        return moved_operators(self.records)

    @property
    def attribution(self) -> list[str]:
        """Attribution lines of the failing records not already shown as operator moves."""
        op_metrics = {r.metric for r in self.records if _op_of(r.metric)}
        out: list[str] = []
        for r in self.bad:
            for a in r.attribution:
                if not any(a.startswith(m + ":") for m in op_metrics) and a not in out:
                    out.append(a)
        return out

    @property
    def artifacts(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for r in self.bad:
            out.update(_artifacts(r))
        return out


def failing_tests(records: Iterable[Record]) -> list[FailingTest]:
    """Tests with a failing or erroring record, in report order."""
    recs = _ordered(records)
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for r in recs:
        groups.setdefault((device_label(r), r.nodeid, r.key), []).append(r)
    out = []
    for (dev, nodeid, key), group in groups.items():
        bad = [r for r in group if r.outcome in REGRESSION_OUTCOMES]
        if bad:
            bad.sort(key=lambda r: (_op_of(r.metric) is not None, r.outcome != "error", r.metric))
            out.append(FailingTest(device=dev, nodeid=nodeid, key=key, bad=tuple(bad), records=tuple(group)))
    return out


def _numbers(r: Record) -> str:
    nums = [f"budget {_budget_text(r)}"]
    if r.limit is not None:
        nums.append(f"limit {fmt_value(r.limit, r.unit)}")
    nums.append(f"measured {fmt_value(r.value, r.unit)}" + (f" ({_change(r)})" if _change(r) else ""))
    if r.ci:
        nums.append(f"CI {_ci_text(r)}")
    if r.n:
        nums.append(f"n {r.n}")
    if isinstance(r.cv, (int, float)):
        nums.append(f"cv {r.cv:.1%}")
    return ", ".join(nums)


def _detail_lines(t: FailingTest) -> list[str]:
    """Plain-text lines explaining one failing test: numbers, reasons, moved operators, artifacts."""
    lines = [f"{t.key}  {t.nodeid}  ({t.device})"]
    for r in t.bad:
        lines.append(f"  {r.metric}: {r.outcome.upper()}: {_numbers(r)}")
        if _source(r):
            lines.append(f"      budget from {_source(r)}")
        if r.reason:
            lines.append(f"      {r.reason}")
    if t.moves:
        lines.append("  operators that moved:")
        lines.extend(f"      {m.line()}" for m in t.moves)
    if t.attribution:
        lines.append("  attribution:")
        lines.extend(f"      {a}" for a in t.attribution)
    for kind, path in t.artifacts.items():
        lines.append(f"  {kind}: {path}")
    return lines


def terminal_report(results: Results | Iterable[Record]) -> str:
    """Plain-text report: the budget table per device, the counts, then each regression explained."""
    records = _ordered(results.records if isinstance(results, Results) else results)
    if not records:
        return "perf budgets: no records"
    out = []
    for dev in _devices(records):
        recs = [r for r in records if device_label(r) == dev]
        out.append(f"perf budgets on {dev}")
        out.append(records_table(recs, with_key=True))
        out.append("")
    out.append(_summary_line(records))
    failing = failing_tests(records)
    if failing:
        out.append("")
        out.append("regressions:")
        for t in failing:
            out.extend(_detail_lines(t))
    return "\n".join(out)


# --------------------------------------------------------------------------- markdown


def _md(text: Any) -> str:
    """A table cell: pipes escaped, newlines flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)]
    out.extend("| " + " | ".join(_md(c) for c in row) + " |" for row in rows)
    return out


def markdown_report(results: Results | Iterable[Record], *, title: str = "perf budgets") -> str:
    """Markdown for a CI step summary.

    Verdicts first (counts and devices), then each regression with budget, measured value,
    CI, noise, reason, the operators that moved and the failure artifacts, then stale and
    unbudgeted budgets, then every other record in a collapsed table.
    """
    records = _ordered(results.records if isinstance(results, Results) else results)
    bad = regressions(records)
    counts = _counts(records)
    if not records:
        return "\n".join([f"## ⚠️ {title}: no perf records", "", "No perf records were produced.", ""])
    head = "❌" if bad else "✅"
    state = f"{len(bad)} regression{'s' if len(bad) != 1 else ''}" if bad else "all budgets hold"
    lines = [f"## {head} {title}: {state}", ""]
    lines.append(" · ".join(f"{_ICON.get(o, '')} **{n}** {o}" for o, n in counts.items()))
    lines.append("")
    lines.append("Devices: " + ", ".join(f"`{d}`" for d in _devices(records)))
    lines.append("")
    if bad:
        lines.append("### Regressions")
        lines.append("")
        for t in failing_tests(records):
            lines.extend(_md_regression(t))
    stale = [r for r in records if r.outcome == "stale"]
    if stale:
        lines.append("### Stale budgets (better than budget beyond tolerance)")
        lines.append("")
        lines.append("The code got faster or leaner: ratchet them with `pytest perf_tests --update-budgets` "
                     "or `perfbudget update results.json`.")
        lines.append("")
        lines.extend(_md_table(["key", "metric", "budget", "measured", "change", "device"],
                               ([f"`{r.key}`", f"`{r.metric}`", _budget_text(r), fmt_value(r.value, r.unit),
                                 _change(r), device_label(r)] for r in stale)))
        lines.append("")
    unbudgeted = [r for r in records if r.outcome in ("unbudgeted", "unmeasurable")]
    if unbudgeted:
        lines.append("### Unbudgeted or unmeasurable")
        lines.append("")
        lines.extend(_md_table(["verdict", "key", "metric", "measured", "why", "test"],
                               ([r.outcome, f"`{r.key}`", f"`{r.metric}`", fmt_value(r.value, r.unit),
                                 r.reason, f"`{r.nodeid}`"] for r in unbudgeted)))
        lines.append("")
    rest = records
    lines.append(f"<details><summary>All {len(records)} records</summary>")
    lines.append("")
    rows = [[_ICON.get(r.outcome, "") + " " + r.outcome, f"`{r.key}`", f"`{r.metric}`", _budget_text(r),
             fmt_value(r.value, r.unit), _ci_text(r), str(r.n), device_label(r)]
            for r in sorted(rest, key=lambda r: (device_label(r), _sort_key(r)))[:_MARKDOWN_MAX_ROWS]]
    lines.extend(_md_table(["verdict", "key", "metric", "budget", "measured", "CI", "n", "device"], rows))
    if len(rest) > _MARKDOWN_MAX_ROWS:
        lines.append("")
        lines.append(f"… {len(rest) - _MARKDOWN_MAX_ROWS} more in the results JSON and the HTML report.")
    lines.extend(["", "</details>", ""])
    return "\n".join(lines)


def _md_regression(t: FailingTest) -> list[str]:
    worst = "error" if any(r.outcome == "error" for r in t.bad) else "fail"
    lines = [f"#### {_ICON[worst]} `{t.key}` — `{t.nodeid}`", "", f"on `{t.device}`", ""]
    rows = []
    for r in t.bad:
        cv = f"{r.cv:.1%}" if isinstance(r.cv, (int, float)) else "-"
        rows.append([f"`{r.metric}`", r.outcome, _budget_text(r), fmt_value(r.limit, r.unit),
                     f"**{fmt_value(r.value, r.unit)}**", _change(r), _ci_text(r), str(r.n), cv,
                     f"`{_source(r)}`" if _source(r) else "-"])
    lines.extend(_md_table(["metric", "verdict", "budget", "limit", "measured", "change", "95% CI", "n", "cv",
                            "budget file"], rows))
    lines.append("")
    for r in t.bad:
        if r.reason:
            lines.append(f"> `{r.metric}`: {_md(r.reason)}  ")
    lines.append("")
    if t.moves:
        lines.append("Top moved operators:")
        lines.append("")
        lines.extend(_md_table(["operator", "metric", "budget", "measured", "change", "verdict"],
                               ([f"`{m.op}`", m.family, fmt_value(m.budget, m.unit), fmt_value(m.measured, m.unit),
                                 f"{m.change:+.1%}" if math.isfinite(m.change) else "new", m.outcome]
                                for m in t.moves)))
        lines.append("")
    if t.attribution:
        lines.append("Attribution:")
        lines.append("")
        lines.extend(f"- `{a}`" for a in t.attribution)
        lines.append("")
    if t.artifacts:
        lines.append("Artifacts: " + ", ".join(f"{k} `{v}`" for k, v in t.artifacts.items()))
        lines.append("")
    return lines


# --------------------------------------------------------------------------- junit


def _p(x: Any) -> str:
    """A property value: numbers to 6 significant digits, anything else as text."""
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def junit_properties(records: Iterable[Record]) -> list[tuple[str, str]]:
    """Per-test JUnit properties: ``perf.<key>.<metric>`` = outcome, then its numbers.

    ``.measured``, ``.budget``, ``.tolerance``, ``.limit``, ``.ci``, ``.unit``, ``.source``
    follow when known; failing records add ``.moved`` (the operators that moved) or
    ``.attribution``.
    """
    recs = list(records)
    out: list[tuple[str, str]] = []
    for r in recs:
        base = f"perf.{r.key}.{r.metric}"
        out.append((base, r.outcome))
        if r.value is not None:
            out.append((f"{base}.measured", _p(r.value)))
        if r.budget:
            out.append((f"{base}.budget", _p(r.budget["value"])))
            out.append((f"{base}.tolerance", _p(r.budget["tolerance"])))
        if r.limit is not None:
            out.append((f"{base}.limit", _p(r.limit)))
        if r.ci:
            out.append((f"{base}.ci", f"{_p(r.ci[0])},{_p(r.ci[1])}"))
        if r.unit and r.unit != "1":
            out.append((f"{base}.unit", r.unit))
        if _source(r):
            out.append((f"{base}.source", _source(r)))
        if r.outcome in REGRESSION_OUTCOMES:
            if r.reason:
                out.append((f"{base}.reason", r.reason))
            if not _op_of(r.metric):
                moves = moved_operators(_same_test(recs, r))
                if moves:
                    out.append((f"{base}.moved", "; ".join(m.line() for m in moves)))
            if r.attribution:
                out.append((f"{base}.attribution", "; ".join(r.attribution)))
    return out


def _split_nodeid(nodeid: str) -> tuple[str, str]:
    """pytest's JUnit naming: ``a/b/test_x.py::Cls::test_y[p]`` -> (``a.b.test_x.Cls``, ``test_y[p]``)."""
    parts = nodeid.split("::")
    path = parts[0].removesuffix(".py").replace("/", ".").replace("\\", ".")
    return ".".join([path, *parts[1:-1]]), parts[-1] if len(parts) > 1 else nodeid


def junit_xml(results: Results | Iterable[Record], *, suite: str = "perfbudget") -> str:
    """A JUnit XML document with one test case per test and device, built from results alone.

    A test with an error record gets ``<error>``, one with a failing record ``<failure>``
    (message: the failing budgets; text: the budget table and the regressions explained),
    one that is only unbudgeted/unmeasurable ``<skipped>``. Every test carries
    :func:`junit_properties`.
    """
    records = _ordered(results.records if isinstance(results, Results) else results)
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((device_label(r), r.nodeid), []).append(r)
    multi = len(_devices(records)) > 1
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=suite)
    n: dict[str, int] = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for (dev, nodeid), recs in groups.items():
        n["tests"] += 1
        classname, name = _split_nodeid(nodeid)
        tc = ET.SubElement(ts, "testcase", classname=classname, name=f"{name} [{dev}]" if multi else name,
                           time="0")
        props = ET.SubElement(tc, "properties")
        ET.SubElement(props, "property", name="perf.device", value=dev)
        for k, v in junit_properties(recs):
            ET.SubElement(props, "property", name=k, value=v)
        errors = [r for r in recs if r.outcome == "error"]
        fails = [r for r in recs if r.outcome == "fail"]
        if errors or fails:
            bad = errors + fails
            tag = "error" if errors else "failure"
            n["errors" if errors else "failures"] += 1
            msg = "; ".join(f"{r.key} {r.metric}: {r.outcome} ({fmt_value(r.value, r.unit)} vs budget "
                            f"{_budget_text(r)})" for r in bad)
            el = ET.SubElement(tc, tag, message=msg, type="perfbudget")
            body = [records_table(recs), ""]
            for t in failing_tests(recs):
                body.extend(_detail_lines(t))
            el.text = "\n".join(body)
        elif all(r.outcome in ("unbudgeted", "unmeasurable") for r in recs):
            n["skipped"] += 1
            ET.SubElement(tc, "skipped", message="; ".join(f"{r.metric}: {r.outcome}" for r in recs))
    for attr, count in n.items():
        ts.set(attr, str(count))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
