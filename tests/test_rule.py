"""The one decision rule: states from an interval and its limits, evidence, family control, the tolerance chooser."""

from __future__ import annotations

import pytest

from perfbudget.budgets.schema import Budget
from perfbudget.metrics import METRICS
from perfbudget.verdict.judge import decide
from perfbudget.verdict.ratio import judge_ratios
from perfbudget.verdict.rule import (
    BYTES_FLOOR_MIB,
    Limits,
    classify,
    family_confidence,
    tolerance_for,
    with_evidence,
)

TIMES = Limits.around(10.0, 0.05, "lower")  # bad 10.5, good 9.5
RATES = Limits.around(100.0, 0.05, "higher")  # bad 95, good 105


@pytest.mark.parametrize(("lo", "hi", "final", "state"), [
    (10.6, 11.0, True, "fail"),        # entirely beyond the bad limit
    (10.0, 10.4, True, "pass"),        # entirely within
    (9.0, 9.4, True, "stale"),         # entirely better than the good limit
    (9.0, 9.6, True, "pass"),          # reaches back over the good limit: not stale
    (10.2, 10.8, False, "undecided"),  # straddles while more can come
    (10.2, 10.8, True, "inconclusive"),
    (10.5, 10.5, True, "pass"),        # an exact value on its limit is within it
    (10.5 * (1 + 1e-12), 10.5 * (1 + 1e-12), True, "pass"),  # floating point's last digits
])
def test_classify_times(lo: float, hi: float, final: bool, state: str) -> None:
    assert classify(lo, hi, TIMES, final=final) == state


@pytest.mark.parametrize(("lo", "hi", "state"), [
    (90.0, 94.0, "fail"), (96.0, 104.0, "pass"), (106.0, 110.0, "stale"), (94.0, 97.0, "inconclusive"),
])
def test_classify_rates_mirrors(lo: float, hi: float, state: str) -> None:
    assert classify(lo, hi, RATES) == state


def test_a_bytes_floor_keeps_a_zero_budget_usable() -> None:
    limits = Limits.around(0.0, 0.02, "lower", floor=BYTES_FLOOR_MIB)
    assert limits.bad == BYTES_FLOOR_MIB
    assert classify(0.001, 0.001, limits) == "pass" and classify(0.01, 0.01, limits) == "fail"


@pytest.mark.parametrize(("state", "n", "least", "final", "want"), [
    ("pass", 1, 2, False, "undecided"),      # too little evidence while more can come
    ("pass", 1, 2, True, "inconclusive"),    # at the end, too little evidence passes nothing either
    ("fail", 2, 2, False, "undecided"),      # a failure wants one piece more
    ("fail", 2, 2, True, "inconclusive"),
    ("fail", 3, 2, True, "fail"),
    ("undecided", 3, 2, False, "undecided"),
])
def test_with_evidence(state: str, n: int, least: int, final: bool, want: str) -> None:
    assert with_evidence(state, n=n, least=least, final=final) == want  # type: ignore[arg-type]


def test_a_check_the_pairs_left_cannot_decide_is_beyond_reach_from_two_pairs() -> None:
    assert with_evidence("undecided", n=2, least=1, final=False, reachable=False) == "beyond reach"
    assert with_evidence("undecided", n=1, least=1, final=False, reachable=False) == "undecided"  # one pair: no spread
    assert with_evidence("undecided", n=2, least=3, final=False, reachable=False) == "undecided"  # evidence first
    assert with_evidence("pass", n=2, least=1, final=False, reachable=False) == "pass"


def test_family_confidence_is_bonferroni_per_test() -> None:
    op = "op_self_ms[aten::mm]"
    assert family_confidence(op, 0.95, 0.05, 1) == 0.95
    assert family_confidence(op, 0.95, 0.05, 10) == pytest.approx(0.995)
    assert family_confidence(op, 0.999, 0.05, 2) == 0.999  # never below the run's own confidence
    assert family_confidence("step_ms", 0.95, 0.05, 10) == 0.95  # a step is no operator's family


def _budget(**kw: object) -> Budget:
    fields = {"key": "k", "metric": "step_ms", "value": 10.0, "tolerance": 0.2, "source": "budgets/cpu.yaml",
              "line": 12, **kw}
    return Budget(**fields)  # type: ignore[arg-type]


def test_tolerance_for_names_each_source() -> None:
    step, count = METRICS["step_ms"], METRICS["instructions"]
    assert tolerance_for(step) == tolerance_for(step, against="base")
    assert tolerance_for(step).source == "default for timing" and tolerance_for(step).value == 0.05
    # Stored: the budget's own tolerance, with its line.
    assert (tolerance_for(step, _budget()).value, tolerance_for(step, _budget()).source) == (0.2, "budgets/cpu.yaml:12")
    # Against the base, a timing check never takes the stored tolerance (it may carry a between-run floor) ...
    assert tolerance_for(step, _budget(), against="base").source == "default for timing"
    # ... but the budget's ab_tolerance, unless the run says not to.
    ab = _budget(ab_tolerance=0.025)
    assert tolerance_for(step, ab, against="base").value == 0.025
    assert tolerance_for(step, ab, against="base", from_budgets=False).value == 0.05
    # A count against its base: its measured A/A spread first, else as against its budget.
    measured = tolerance_for(count, _budget(metric="instructions", tolerance=0.01), against="base",
                             measured=(0.0004, "budgets/noise/x.yaml, 6 A/A runs"))
    assert measured.value == 0.0004 and measured.source.startswith("measured spread (budgets/noise/x.yaml")
    assert tolerance_for(count, _budget(metric="instructions", tolerance=0.01), against="base").value == 0.01


def test_stored_and_ab_verdicts_reach_the_same_state_on_the_same_interval() -> None:
    # A stored exact value of 1.06 against a budget of 1 (5 %) and a head/base CI lying entirely at 1.06:
    # the same rule fails both; at 1.04 both pass; at 0.9 the stored one is stale and the A/B one "improved".
    for value, stored, ab in ((1.06, "fail", "fail"), (1.04, "pass", "pass"), (0.9, "stale", "pass")):
        v = decide("k", "flops", value, _budget(metric="flops", value=1.0, tolerance=0.05))
        rv = judge_ratios([value] * 3, tolerance=0.05, direction="lower", prior_sd=1e-6, prior_df=100)
        assert (v.outcome, rv.state) == (stored, ab)
        assert rv.improved == (stored == "stale")


def test_a_metric_this_version_does_not_know_is_held_to_timings_tolerance_or_its_budgets() -> None:
    from types import SimpleNamespace

    from perfbudget.verdict.rule import tolerance_for

    unknown = tolerance_for(None)
    assert unknown.value == 0.05 and unknown.source == "default for an unknown metric (timing's)"
    assert tolerance_for(None, SimpleNamespace(tolerance=0.2, ab_tolerance=None)).value == 0.2  # type: ignore[arg-type]


def test_beyond_a_limit_takes_floating_points_last_digits_as_equal() -> None:
    from perfbudget.verdict.rule import beyond

    assert not beyond(10.0 * (1 + 1e-12), 10.0, "lower") and beyond(10.01, 10.0, "lower")
    assert not beyond(10.0 * (1 - 1e-12), 10.0, "higher") and beyond(9.99, 10.0, "higher")


@pytest.mark.parametrize(("lo", "hi", "estimate", "evidence", "state"), [
    (10.2, 10.8, 10.6, "stored", "fail"),          # straddles: the median beyond the limit decides
    (10.2, 10.8, 10.4, "stored", "pass"),
    (10.2, 10.8, 10.6, "pairs", "inconclusive"),   # never on the estimate
    (10.2, 10.8, 10.6, "history", "fail"),         # entirely worse than no change, estimate beyond
    (9.9, 10.8, 10.6, "history", "inconclusive"),  # reaches back to no change
    (10.2, 10.8, 10.4, "history", "inconclusive"), # estimate within
    (10.6, 11.0, 10.8, "pairs", "fail"),           # not straddling: the interval decides for every kind
    (9.0, 9.4, 9.2, "stored", "stale"),
])
def test_a_straddling_interval_ends_one_way_per_kind_of_evidence(lo: float, hi: float, estimate: float,
                                                                 evidence: str, state: str) -> None:
    from perfbudget.verdict.rule import settle

    assert settle(lo, hi, TIMES, evidence=evidence, estimate=estimate, reference=10.0) == state  # type: ignore[arg-type]


def test_float_noise_is_no_change_and_small_changes_are_not_named() -> None:
    from perfbudget.verdict.rule import changed_by, moved_beyond, same

    assert same(3.0, 3.0 * (1 + 1e-12)) and not same(3.0, 3.001)
    assert not moved_beyond(0.0 + 1e-12, 0.0) and moved_beyond(-0.02, 0.01) and not moved_beyond(0.01, 0.01)
    assert changed_by(4096, 0, least=4096, share=0.01) and not changed_by(4095, 0, least=4096, share=0.01)
    assert not changed_by(5000, 10**6, least=4096, share=0.01) and changed_by(-20000, 10**6, least=4096, share=0.01)


@pytest.mark.parametrize(("outcomes", "inconclusive", "failed", "strict", "fails"), [
    (["pass", "stale"], False, False, False, False),
    (["pass", "fail"], False, False, False, True),
    (["error"], False, False, False, True),
    ([], False, False, False, True),                  # no check at all
    (["pass"], False, True, False, True),             # the run could not measure what it was asked
    (["pass", "inconclusive"], True, False, False, False),
    (["pass", "inconclusive"], True, False, True, True),
])
def test_what_fails_an_ab_run(outcomes: list[str], inconclusive: bool, failed: bool, strict: bool, fails: bool) -> None:
    from perfbudget.verdict.judge import ab_run_fails
    from perfbudget.vocabulary import Outcome

    assert ab_run_fails([Outcome(o) for o in outcomes], inconclusive=inconclusive, failed=failed,
                        strict=strict) is fails
