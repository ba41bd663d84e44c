"""Metric names on literal strings: the operator families and a name's family, registered or not."""

from __future__ import annotations

from perfbudget import judge, recorder
from perfbudget.measure import operators
from perfbudget.metrics import (
    OP_METRIC_FAMILIES,
    OP_TIMED_FAMILIES,
    family_of,
    op_metric,
    parse_name,
)
from perfbudget.report import common


def test_the_operator_families_are_defined_once() -> None:
    assert OP_METRIC_FAMILIES == ("op_self_ms", "op_share", "op_count")
    assert OP_TIMED_FAMILIES == ("op_self_ms", "op_share")
    assert all(parse_name(f"{f}[aten::mm]").metric.arg == "op" for f in OP_METRIC_FAMILIES)
    assert all(parse_name(f"{f}[aten::mm]").metric.statistical for f in OP_TIMED_FAMILIES)
    assert operators.OP_METRIC_FAMILIES is OP_METRIC_FAMILIES
    for module in (common, recorder, judge):  # no alias of their own
        assert not hasattr(module, "OP_FAMILIES") and not hasattr(module, "OPERATOR_FAMILIES")
    assert operators.op_metric is op_metric


def test_family_of_reads_any_name() -> None:
    assert family_of("op_self_ms[aten::mm]") == "op_self_ms"
    assert family_of("step_ms") == "step_ms"
    assert family_of("not_a_metric[x[y]]") == "not_a_metric"
    assert family_of("") == ""


def test_op_metric_splits_operator_metrics_only() -> None:
    assert op_metric("op_count[aten::add_]") == ("op_count", "aten::add_")
    assert op_metric("op_share[aten::mm") is None
    assert op_metric("bytes_peak[cuda]") is None
    assert op_metric("step_ms") is None
