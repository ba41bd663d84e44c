"""JUnit from records: per-test properties, and a whole JUnit XML document built from results alone."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from ..results import Record, Results
from ..vocabulary import Outcome
from .common import (
    REGRESSION_OUTCOMES,
    budget_text,
    budget_where,
    device_label,
    devices,
    failing_tests,
    fmt_value,
    move_line,
    moved_operators,
    op_of,
    ordered,
    ratio_text,
)
from .terminal import detail_lines, records_table

__all__ = ["junit_properties", "junit_xml"]


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffe\uffff]")


def _prop(x: object) -> str:
    """A property value: floats to 6 significant digits, an interval as ``low,high``, anything else as text."""
    if isinstance(x, tuple):
        return ",".join(_prop(v) for v in x)
    return f"{x:.6g}" if isinstance(x, float) else str(x)  # plain str: xdist serialises properties


def junit_properties(records: Iterable[Record]) -> list[tuple[str, str]]:
    """Per-test JUnit properties: ``perf.<key>.<metric>`` = outcome, then its numbers when known
    (``.measured``, ``.budget``, ``.ci``, ...), the A/B comparison (``.base``, ``.ratio``, ``.pairs``,
    ``.detectable``, ...) and, failing, the reason and what moved (``.moved``, ``.attribution``)."""
    out: list[tuple[str, str]] = []
    for r in records:
        name = f"perf.{r.key}.{r.metric}"
        props: dict[str, object] = {  # None: not known, left out
            "advice": r.advice or None,
            "measured": r.value,
            "budget": r.budget.value if r.budget else None,
            "tolerance": r.budget.tolerance if r.budget else None,
            "limit": r.limit,
            "ci": r.ci or None,
            "unit": r.unit if r.unit not in ("", "1") else None,
            "source": budget_where(r) or None,
        }
        if (b := r.vs_base) is not None:
            props |= {"base": b.value, "ratio": b.ratio, "ratio_ci": b.ratio_ci or None, "pairs": b.pairs,
                      "detectable": b.detectable}
        if r.outcome in REGRESSION_OUTCOMES:
            moves = [] if op_of(r.metric) else moved_operators([r])
            props |= {"reason": r.reason or None, "moved": "; ".join(move_line(m) for m in moves) or None,
                      "attribution": "; ".join(r.attribution) or None}
        out += [(name, str(r.outcome)), *((f"{name}.{k}", _prop(v)) for k, v in props.items() if v is not None)]
    return out


def _split_nodeid(nodeid: str) -> tuple[str, str]:
    """pytest's JUnit naming: ``a/b/test_x.py::Cls::test_y[p]`` -> (``a.b.test_x.Cls``, ``test_y[p]``)."""
    parts = nodeid.split("::")
    path = parts[0].removesuffix(".py").replace("/", ".").replace("\\", ".")
    return ".".join([path, *parts[1:-1]]), parts[-1] if len(parts) > 1 else nodeid


def _failure_message(r: Record) -> str:
    text = f"{r.key} {r.metric}: {r.outcome} ({fmt_value(r.value, r.unit)} vs budget {budget_text(r)}"
    if r.vs_base is not None:
        text += f", vs base {fmt_value(r.vs_base.value, r.unit)}: head/base {ratio_text(r.vs_base)}"
    return text + ")"


def junit_xml(results: Results | Iterable[Record], *, suite: str = "perfbudget") -> str:
    """A JUnit XML document with one test case per test and device, with :func:`junit_properties`: an
    ``<error>`` or ``<failure>`` explaining the failing checks, ``<skipped>`` for an inconclusive test or
    one with nothing judged (an advisory record passes)."""
    records = ordered(results.records if isinstance(results, Results) else results)
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((device_label(r), r.nodeid), []).append(r)
    multi = len(devices(records)) > 1
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
        errors = [r for r in recs if r.outcome == Outcome.ERROR]
        fails = [r for r in recs if r.outcome == Outcome.FAIL]
        if errors or fails:
            tag = "error" if errors else "failure"
            n["errors" if errors else "failures"] += 1
            el = ET.SubElement(tc, tag, message="; ".join(_failure_message(r) for r in errors + fails),
                               type="perfbudget")
            body = [records_table(recs), ""]
            for t in failing_tests(recs):
                body.extend(detail_lines(t))
            el.text = "\n".join(body)
        elif any(r.outcome == Outcome.INCONCLUSIVE for r in recs):
            # Not a failure, but not a pass either: the run could not tell.
            n["skipped"] += 1
            ET.SubElement(tc, "skipped", message="; ".join(f"{r.metric}: inconclusive: {r.reason}" for r in recs
                                                            if r.outcome == Outcome.INCONCLUSIVE))
        elif all(r.outcome in (Outcome.UNBUDGETED, Outcome.NOT_JUDGED, Outcome.UNMEASURABLE) for r in recs):
            n["skipped"] += 1
            ET.SubElement(tc, "skipped", message="; ".join(f"{r.metric}: {r.outcome}" for r in recs))
    for attr, count in n.items():
        ts.set(attr, str(count))
    ET.indent(root)
    # XML 1.0 has no form for most control characters: a name or reason holding one is shown with a space.
    return '<?xml version="1.0" encoding="utf-8"?>\n' + _NOT_XML.sub(" ", ET.tostring(root, encoding="unicode")) + "\n"
