"""Typed extras: built from measurements, written to and read back from a record's ``extra``; bad shapes named."""

from __future__ import annotations

import json

import pytest

from perfbudget.extras import (
    FAILURE_ARTIFACTS,
    MOVED_OPERATORS,
    OPERATOR_TABLE,
    PADDING_BY_WIDTH,
    ExtraError,
    FailureArtifacts,
    OperatorMoves,
    OperatorTable,
    PaddingByWidth,
)
from perfbudget.measure.operators import OpRow, OpTable
from perfbudget.measure.padding import padding_stats


def test_padding_by_width_groups_batches_by_their_padded_width() -> None:
    # Two batches padded to 8 (real 5+8 and 3 of 16+8 tokens), one to 4 (real 2+4 of 8).
    p = PaddingByWidth.from_batches([[5, 8], [2, 4], [3]], [8, 4, 8], sorted_rate=0.1)
    assert p.widths == (4, 8)
    assert p.rates == (pytest.approx(2 / 8), pytest.approx(1 - 16 / 24))
    assert p.rates[1] == padding_stats([[5, 8], [3]], [8, 8]).rate
    assert p.to_extra() == {PADDING_BY_WIDTH: {"widths": [4, 8], "rates": list(p.rates), "sorted_rate": 0.1}}
    assert PaddingByWidth.from_extra(p.to_extra()) == p
    assert PaddingByWidth.from_extra({}) is None


def test_padding_by_width_refuses_bad_shapes_naming_key_and_value() -> None:
    with pytest.raises(ValueError, match="exceeds the padded length 4"):
        PaddingByWidth.from_batches([[5]], [4])  # truncation must not pass silently
    with pytest.raises(ValueError, match="2 batches of lengths but 1 padded lengths"):
        PaddingByWidth.from_batches([[1], [2]], [4])
    with pytest.raises(ExtraError, match=r"padding_by_width: 2 widths but 1 rates"):
        PaddingByWidth(widths=(4, 8), rates=(0.1,))
    with pytest.raises(ExtraError, match=r"distinct widths in ascending order, got \[8, 4\]"):
        PaddingByWidth(widths=(8, 4), rates=(0.1, 0.2))
    with pytest.raises(ExtraError, match=r"padding_by_width.rates\[4\].*in \[0, 1\], got 1.5"):
        PaddingByWidth(widths=(4,), rates=(1.5,))
    with pytest.raises(ExtraError, match=r"extra\['padding_by_width'\]: expected a mapping, got \[1\]"):
        PaddingByWidth.from_extra({PADDING_BY_WIDTH: [1]})
    with pytest.raises(ExtraError, match=r"expected lists 'widths' and 'rates', got \{'64': 0.2\}"):
        PaddingByWidth.from_extra({PADDING_BY_WIDTH: {"64": 0.2}})  # an untyped {width: rate} form
    with pytest.raises(ExtraError, match=r"widths: expected positive integers, got \['4'\]"):
        PaddingByWidth.from_extra({PADDING_BY_WIDTH: {"widths": ["4"], "rates": [0.1]}})


def test_operator_table_keeps_the_heaviest_rows_of_an_op_table() -> None:
    def row(name: str, self_ms: float) -> OpRow:
        return OpRow(name=name, calls=2.0, self_ms=self_ms, total_ms=self_ms, flops=10.0, share=0.5)

    table = OpTable(rows=(row("aten::mm", 3.0), row("aten::add", 1.0)), steps=3, device="cpu")
    ops = OperatorTable.of(table, k=1)
    assert [r.name for r in ops.rows] == ["aten::mm"]
    assert ops.to_extra() == {OPERATOR_TABLE: [{"name": "aten::mm", "self_ms": 3.0, "calls": 2.0, "share": 0.5,
                                                "total_ms": 3.0, "flops": 10.0}]}
    assert OperatorTable.from_extra(ops.to_extra()) == ops
    short = OperatorTable.from_extra({OPERATOR_TABLE: [{"name": "aten::mm", "self_ms": 2.0}]})
    assert short is not None and short.rows[0].calls == 0 and short.rows[0].share == 0
    with pytest.raises(ExtraError, match=r"extra\['ops'\]: expected a list of operator rows, got 'nonsense'"):
        OperatorTable.from_extra({OPERATOR_TABLE: "nonsense"})
    with pytest.raises(ExtraError, match=r"extra\['ops\[0\].self_ms'\]: expected a number, got None"):
        OperatorTable.from_extra({OPERATOR_TABLE: [{"name": "aten::mm"}]})


def test_failure_artifacts_round_trip() -> None:
    art = FailureArtifacts.of({"chrome trace": "a/trace.json"})
    assert art.to_extra() == {FAILURE_ARTIFACTS: {"chrome trace": "a/trace.json"}}
    assert FailureArtifacts.from_extra(art.to_extra()) == art
    with pytest.raises(ExtraError, match=r"extra\['artifacts'\]: expected \{label: path\}, got \['x'\]"):
        FailureArtifacts.from_extra({FAILURE_ARTIFACTS: ["x"]})


def test_operator_moves_of_a_table_diff_round_trip_through_json() -> None:
    def row(name: str, self_ms: float) -> OpRow:
        return OpRow(name=name, calls=1.0, self_ms=self_ms, total_ms=self_ms, flops=0.0, share=0.0)

    base = OpTable(rows=(row("aten::mm", 4.0), row("aten::gone", 1.0)), steps=1, device="cpu")
    new = OpTable(rows=(row("aten::mm", 6.0), row("aten::new", 0.5)), steps=1, device="cpu")
    moved = OperatorMoves(moves=base.diff(new).moves(), note="base table vs this run")
    extra = moved.to_extra()
    assert [m["op"] for m in extra[MOVED_OPERATORS]["moves"]] == ["aten::mm", "aten::gone", "aten::new"]
    assert extra[MOVED_OPERATORS]["moves"][1]["after"] is None  # gone: JSON null, not a number
    back = OperatorMoves.from_extra(json.loads(json.dumps(extra)))
    assert back == moved and OperatorMoves.from_extra({}) is None
    # The rule keeps what moved, at most k: the noise never reaches the record.
    assert OperatorMoves.of(moved.moves, k=1).moves == moved.moves[:1]


def test_operator_moves_refuse_bad_shapes_naming_key_and_value() -> None:
    with pytest.raises(ExtraError, match=r"extra\['moved_ops'\]: expected \{'moves': \[...\], 'note': ...\}"):
        OperatorMoves.from_extra({MOVED_OPERATORS: ["aten::mm"]})
    with pytest.raises(ExtraError, match=r"extra\['moved_ops.moves\[0\]'\]: expected a mapping with 'op' and 'family'"):
        OperatorMoves.from_extra({MOVED_OPERATORS: {"moves": [{"op": "aten::mm"}]}})
    with pytest.raises(ExtraError, match=r"moved_ops.moves\[0\].before'\]: expected a number, got '8'"):
        OperatorMoves.from_extra({MOVED_OPERATORS: {"moves": [{"op": "aten::mm", "family": "op_self_ms", "before": "8"}]}})
    with pytest.raises(ExtraError, match=r"against: expected one of .*got 'yesterday'"):
        OperatorMoves.from_extra({MOVED_OPERATORS: {"moves": [{"op": "a", "family": "op_count", "against": "yesterday"}]}})


@pytest.mark.parametrize(("field", "value", "said"), [
    ("note", "n" * 201, r"moved_ops.note'\]: expected a string of at most 200 characters, got 'nnn.*\.\.\."),
    ("note", ["a list"], r"moved_ops.note'\]: expected a string of at most 200 characters, got \['a list'\]"),
    ("unit", "ms<img src=x>", r"moved_ops.moves\[0\].unit'\]: expected a string matching"),
    ("unit", 7, r"moved_ops.moves\[0\].unit'\]: expected a string matching .*got 7"),
    ("outcome", "</details># PWNED", r"moved_ops.moves\[0\]'\]\.outcome: expected an outcome \(pass, .*got '</details>"),
    ("op", "a" * 1_001, r"moved_ops.moves\[0\].op'\]: expected a string of at most 1000 characters"),
    ("family", "op self\rms", r"moved_ops.moves\[0\].family'\]: expected a string matching"),
])
def test_operator_moves_refuse_strings_a_report_could_not_show_as_they_are(field: str, value: object, said: str) -> None:
    move = {"op": "aten::mm", "family": "op_self_ms", "unit": "ms", "outcome": "fail", "before": 8.0, "after": 12.0}
    value_of = {"moves": [move], "note": "profiled when step_ms failed"}
    if field == "note":
        value_of["note"] = value
    else:
        move[field] = value
    with pytest.raises(ExtraError, match=said):
        OperatorMoves.from_extra({MOVED_OPERATORS: value_of})
    move.update(outcome="", unit="1")  # nothing judged it; a count's unit
    assert OperatorMoves.from_extra({MOVED_OPERATORS: {"moves": [move | {"op": "aten::mm", "family": "op_count"}]}})
