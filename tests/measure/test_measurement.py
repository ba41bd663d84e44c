"""Tests of measure.measurement: first samples, fresh batches shared by several metrics, explanations."""

from __future__ import annotations

import pytest

from perfbudget.measure.measurement import Explanation, Measurement, Passes
from perfbudget.measure.unmeasurable import Unmeasurable


class Counter:
    """A measuring routine whose n-th pass returns samples around n (and counts its runs)."""

    def __init__(self, *, lost_after: int | None = None) -> None:
        self.runs = 0
        self.lost_after = lost_after

    def __call__(self) -> dict[str, list[float]] | Unmeasurable:
        self.runs += 1
        if self.lost_after is not None and self.runs > self.lost_after:
            return Unmeasurable(reason="the counter was reset")
        n = float(self.runs)
        return {"a": [n, n], "b": [10 * n], "ref": [n / 2, n / 2]}


def test_a_single_value_has_no_fresh_batch_and_explains_nothing() -> None:
    m = Measurement(samples=42.0)
    assert not m.repeatable and m.explain() == Explanation()
    with pytest.raises(RuntimeError, match="cannot be taken again"):
        m.more()


def test_metrics_of_one_routine_read_the_same_fresh_passes() -> None:
    take = Counter()
    passes = Passes(take)
    a, b = passes.measurement(lambda p: p["a"]), passes.measurement(lambda p: p["b"])
    assert take.runs == 1 and a.samples == [1.0, 1.0] and b.samples == [10.0]
    assert a.more() == [2.0, 2.0] and a.more() == [3.0, 3.0]
    assert take.runs == 3
    # b's first and second extra batches are the passes a already took: nothing runs again.
    assert b.more() == [20.0] and b.more() == [30.0] and take.runs == 3
    assert b.more() == [40.0] and take.runs == 4


def test_paired_reference_comes_with_every_batch() -> None:
    passes = Passes(Counter())
    m = passes.measurement(lambda p: p["a"], reference=lambda p: p["ref"])
    assert m.reference == [0.5, 0.5]
    assert m.more() == ([2.0, 2.0], [1.0, 1.0])
    unpaired = passes.measurement(lambda p: p["a"], reference=lambda p: None)
    assert unpaired.reference is None and unpaired.more() == [2.0, 2.0]


def test_an_unmeasurable_first_pass_is_kept_and_a_later_one_raises() -> None:
    nothing = Passes(Counter(lost_after=0), what="the energy counter")
    assert nothing.unmeasurable == Unmeasurable(reason="the counter was reset")
    with pytest.raises(ValueError, match="the energy counter is unmeasurable: the counter was reset"):
        nothing.measurement(lambda p: p["a"])
    lost = Passes(Counter(lost_after=1), what="the energy counter")
    assert lost.unmeasurable is None
    m = lost.measurement(lambda p: p["a"])
    with pytest.raises(RuntimeError, match="the energy counter went away: the counter was reset"):
        m.more()


def test_explanation_is_computed_only_when_asked_and_never_raises() -> None:
    asked: list[int] = []

    def explain() -> Explanation:
        asked.append(1)
        return Explanation(lines=("aten::mm moved",), extra={"k": 1})

    m = Passes(Counter()).measurement(lambda p: p["a"], explain=explain, attribution=["counter: rapl"])
    assert asked == [] and m.attribution == ("counter: rapl",)
    assert m.explain() == Explanation(lines=("aten::mm moved",), extra={"k": 1}) and asked == [1]

    def broken() -> Explanation:
        raise OSError("profiler busy")

    got = Measurement(samples=[1.0], explainer=broken).explain()
    assert got.lines == ("attribution failed: OSError: profiler busy",) and not got.extra
