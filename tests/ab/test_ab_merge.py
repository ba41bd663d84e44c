"""Merging process pairs into one A/B record per check, on constructed records (no processes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perfbudget.ab.merge import PairRecords, compare_pairs
from perfbudget.budgets.loader import BudgetSet, parse_text
from perfbudget.device import DeviceInfo
from perfbudget.extras import OperatorMoves
from perfbudget.measure.stats import t_quantile
from perfbudget.results import Record, Results

DEV = DeviceInfo(type="cpu", model="test cpu", count=2, threads=1)
NODE = "perf_tests/test_enc.py::test_train"

BUDGETS = """\
schema: 1
device:
  type: cpu
budgets:
  enc:
    step_ms:
      value: 10.0
      tolerance: 0.3
      ab_tolerance: 0.2
    flops:
      value: 1000
      tolerance: 0.0
  dec:
    tokens_per_s:
      value: 100.0
      tolerance: 0.05
"""


def budgets(text: str = BUDGETS) -> BudgetSet:
    return BudgetSet(root=Path("budgets"), files=[parse_text(text, "budgets/cpu.yaml")])


def rec(metric: str, samples: tuple[float, ...] = (), value: float | None = None, *, key: str = "enc",
        outcome: str = "pass", reason: str = "", nodeid: str = NODE) -> Record:
    kind = {"step_ms": "timing", "tokens_per_s": "rate", "flops": "exact"}.get(metric.split("[")[0], "timing")
    if value is None and samples:
        value = sorted(samples)[len(samples) // 2]
    return Record(nodeid=nodeid, key=key, metric=metric, outcome=outcome, value=value, samples=samples,
                  n=len(samples), device=DEV, kind=kind, reason=reason)


def pair(head: list[Record] | None, base: list[Record] | None, problem: str = "") -> PairRecords:
    return PairRecords(head=None if head is None else Results(records=head),
                       base=None if base is None else Results(records=base), base_problem=problem)


def steps(median: float) -> tuple[float, ...]:
    return (median * 0.98, median * 0.99, median, median * 1.01, median * 1.02)


def one(pairs: list[PairRecords], **kw: object) -> Record:
    (r,) = compare_pairs(pairs, budgets=budgets(), **kw).records  # type: ignore[arg-type]
    return r


def test_a_slower_head_fails_on_the_ratio_with_the_base_side_recorded() -> None:
    pairs = [pair([rec("step_ms", steps(13.0), key="other")], [rec("step_ms", steps(10.0), key="other")]),
             pair([rec("step_ms", steps(12.6), key="other")], [rec("step_ms", steps(10.0), key="other")])]
    r = one(pairs)
    assert r.outcome == "fail" and r.value == pytest.approx(12.8) and r.n == 10 and r.rounds == 2
    assert r.base is not None and r.base.value == pytest.approx(10.0) and r.base.pairs == 2
    assert r.base.pair_ratios == pytest.approx((1.3, 1.26)) and r.base.ratio == pytest.approx((1.3 * 1.26) ** 0.5)
    assert r.base.ratio_ci is not None and r.base.ratio_ci[0] > 1.05 and len(r.base.samples) == 10
    assert r.limit == pytest.approx(10.5)  # the base's value x (1 + the default 5 %)
    info = r.base
    assert info is not None and info.compared and info.tolerance == 0.05 and info.tolerance_from == "default for timing"
    assert "[tolerance from default for timing]" in r.reason and r.budget is None


def test_the_budgets_tolerance_applies_where_the_key_has_one() -> None:
    pairs = [pair([rec("step_ms", steps(11.0))], [rec("step_ms", steps(10.0))]),
             pair([rec("step_ms", steps(11.1))], [rec("step_ms", steps(10.0))])]
    r = one(pairs)
    info = r.base
    assert r.outcome == "pass" and info is not None and info.tolerance == 0.2
    assert info.tolerance_from == "budgets/cpu.yaml:6" and r.budget is not None and r.budget.ab_tolerance == 0.2


def test_the_stored_mode_tolerance_is_not_the_ab_tolerance() -> None:
    # 0.3 is a floor for noise between processes run apart; taking turns removes that noise.
    text = BUDGETS.replace("      ab_tolerance: 0.2\n", "")
    pairs = [pair([rec("step_ms", steps(11.5))], [rec("step_ms", steps(10.0))]) for _ in range(3)]
    (r,) = compare_pairs(pairs, budgets=budgets(text)).records
    info = r.base
    assert info is not None and info.tolerance == 0.05 and info.tolerance_from == "default for timing"
    assert r.outcome == "fail"


def test_undecided_checks_are_listed_and_inconclusive_after_the_last_pair() -> None:
    pairs = [pair([rec("step_ms", steps(10.8), key="x")], [rec("step_ms", steps(10.0), key="x")]),
             pair([rec("step_ms", steps(10.2), key="x")], [rec("step_ms", steps(10.0), key="x")])]
    provisional = compare_pairs(pairs, budgets=budgets())
    assert provisional.undecided == ((NODE, "x", "step_ms"),) and provisional.inconclusive == ()
    final = compare_pairs(pairs, budgets=budgets(), final=True)
    (r,) = final.records
    assert final.undecided == () and final.inconclusive == ((NODE, "x", "step_ms"),)
    assert r.outcome == "inconclusive" and "this run could resolve changes beyond +" in r.reason
    info = r.base
    assert info is not None and info.compared and info.detectable is not None and 0.05 < info.detectable < 0.5
    assert f"beyond +{info.detectable * 100:.3g} %" in r.reason and info.confidence == 0.95


def test_every_compared_check_stores_its_detectable_effect() -> None:
    pairs = [pair([rec("step_ms", steps(10.0), key="x")], [rec("step_ms", steps(10.0), key="x")]) for _ in range(2)]
    (r,) = compare_pairs(pairs, budgets=budgets(), final=True).records
    info = r.base
    assert r.outcome == "pass" and info is not None and info.detectable == pytest.approx(0.09559, abs=1e-5)
    assert "could resolve changes beyond +9.56 %" in r.reason


def test_min_pairs_keeps_a_check_undecided_until_it_has_them() -> None:
    quiet = [pair([rec("step_ms", steps(9.0), key="x")], [rec("step_ms", steps(10.0), key="x")])]
    assert compare_pairs(quiet, budgets=budgets()).undecided == ()  # its CI is decided already
    held = compare_pairs(quiet, budgets=budgets(), min_pairs=2)
    assert held.undecided == ((NODE, "x", "step_ms"),) and held.records[0].outcome == "pass"  # provisional
    final = compare_pairs(quiet, budgets=budgets(), min_pairs=2, final=True)
    assert final.undecided == () and final.records[0].outcome == "inconclusive"  # one pair passes nothing


def test_a_failure_is_confirmed_by_one_more_pair_than_min_pairs() -> None:
    slow = [pair([rec("step_ms", steps(r), key="x")], [rec("step_ms", steps(10.0), key="x")]) for r in (13.0, 12.6, 12.8)]
    node = (NODE, "x", "step_ms")
    # Beyond the tolerance after min_pairs pairs: provisional, another pair is wanted.
    assert compare_pairs(slow[:1], budgets=budgets()).undecided == (node,)
    held = compare_pairs(slow[:2], budgets=budgets(), min_pairs=2)
    assert held.undecided == (node,) and held.records[0].outcome == "fail"  # provisional
    # The run ended first: inconclusive, never a failure on two pairs that may share a speed mode.
    ended = compare_pairs(slow[:2], budgets=budgets(), min_pairs=2, final=True)
    (r,) = ended.records
    assert ended.inconclusive == (node,) and r.outcome == "inconclusive"
    assert "not confirmed: a failure needs 3 pairs" in r.reason
    # Confirmed by the third.
    confirmed = compare_pairs(slow, budgets=budgets(), min_pairs=2, final=True)
    assert confirmed.records[0].outcome == "fail" and confirmed.undecided == confirmed.inconclusive == ()


def test_checks_of_tests_not_rerun_keep_their_earlier_pairs() -> None:
    # Pair 1 ran both tests; pair 2 re-ran only the undecided one: the other keeps pair 1.
    quiet, noisy = "t.py::test_quiet", "t.py::test_noisy[a b-1]"
    both = [rec("step_ms", steps(10.0), key="q", nodeid=quiet), rec("flops", value=1000.0, nodeid=quiet),
            rec("step_ms", steps(10.0), key="n", nodeid=noisy)]
    pairs = [pair(both, both),
             pair([rec("step_ms", steps(11.0), key="n", nodeid=noisy)], [rec("step_ms", steps(10.0), key="n", nodeid=noisy)])]
    cmp = compare_pairs(pairs, budgets=budgets(), final=True)
    by = {(r.nodeid, r.metric): r for r in cmp.records}
    assert [r.nodeid for r in cmp.records] == [quiet, quiet, noisy]
    q, n = by[(quiet, "step_ms")], by[(noisy, "step_ms")]
    assert q.base is not None and q.base.pairs == 1 and "not compared in" not in q.reason
    assert n.base is not None and n.base.pairs == 2 and n.base.pair_ratios == pytest.approx((1.0, 1.1))
    assert by[(quiet, "flops")].reason == "vs base: same as the base (1000)"


def test_a_later_pairs_report_of_budgets_its_tests_did_not_record_is_moot() -> None:
    # Pair 2 re-ran only the noisy test; its session reports the quiet test's budget as "budgeted,
    # not recorded" (no nodeid). Pair 1 recorded it: the merged run does not report it not measured.
    # A budget no pair recorded stays reported.
    quiet, noisy = "t.py::test_quiet", "t.py::test_noisy"
    unrecorded = [rec("flops", outcome="not_measured", nodeid="", reason="budgeted but no test of this run recorded it"),
                  rec("step_ms", key="gone", outcome="not_measured", nodeid="", reason="budgeted, not recorded")]
    first = [rec("flops", value=1000.0, nodeid=quiet), rec("step_ms", steps(10.0), key="n", nodeid=noisy),
             unrecorded[1]]
    again = [rec("step_ms", steps(10.0), key="n", nodeid=noisy), *unrecorded]
    cmp = compare_pairs([pair(first, first), pair(again, again)], budgets=budgets(), final=True)
    assert [(r.nodeid, r.key, r.metric, r.outcome) for r in cmp.records] == [
        (quiet, "enc", "flops", "pass"), (noisy, "n", "step_ms", "pass"), ("", "gone", "step_ms", "not_measured")]
    assert cmp.base_only == ()  # the base's pair 2 reported the same: not a check only the base has


def test_a_check_one_side_lists_in_some_pairs_only_is_not_compared_there() -> None:
    # An operator at the top-N cut: the base listed it in pair 1 and 3, not in pair 2.
    op = "op_self_ms[aten::add]"
    pairs = [pair([rec(op, steps(1.0))], [rec(op, steps(1.0))]),
             pair([rec(op, steps(1.0)), rec("step_ms", steps(10.0))], [rec("step_ms", steps(10.0))]),
             pair([rec(op, steps(1.01))], [rec(op, steps(1.0))])]
    cmp = compare_pairs(pairs, budgets=budgets(), final=True)
    r = next(r for r in cmp.records if r.metric == op)
    assert r.outcome == "pass" and r.base is not None and r.base.pairs == 2
    assert "not compared in pair 2 (the base did not record it there)" in r.reason
    assert cmp.not_compared == () and cmp.base_only == ()
    # Never in the same pair: not compared, and not "the base lacks it".
    apart = [pair([rec(op, steps(1.0))], [rec("step_ms", steps(10.0))]),
             pair([rec("step_ms", steps(10.0))], [rec(op, steps(1.0))])]
    r = next(r for r in compare_pairs(apart, budgets=budgets()).records if r.metric == op)
    info = r.base
    assert info is not None and not info.compared
    assert info.note == "the head and the base never recorded it in the same pair"


def test_a_tests_per_operator_checks_share_one_false_alarm_budget() -> None:
    ops = [f"op_self_ms[aten::op{i}]" for i in range(4)]
    head = [rec(m, steps(1.0)) for m in ops] + [rec("step_ms", steps(10.0)), rec("op_self_ms[aten::x]", steps(1.0),
                                                                              nodeid="other.py::test")]
    cmp = compare_pairs([pair(head, head), pair(head, head)], budgets=budgets())
    conf = {(r.nodeid, r.metric): r.base.confidence for r in cmp.records}  # type: ignore[union-attr]
    assert all(conf[(NODE, m)] == pytest.approx(1 - 0.05 / 4) for m in ops)
    assert conf[(NODE, "step_ms")] == 0.95 and conf[("other.py::test", "op_self_ms[aten::x]")] == 0.95


def test_per_operator_checks_compare_the_sides_round_by_round() -> None:
    # The machine drifts over a pair's rounds (d); each side's round i ran beside the other's
    # round i, so the head's 3 % is read round by round though two of its rounds were hit by a
    # hiccup; a ratio of the sides' medians lands on other rounds and reads 1.17.
    drift = (1.0, 1.3, 0.8, 1.25, 0.85, 1.2, 0.9)
    per_round = (1.03, 1.02, 1.04, 1.03, 1.03, 1.3, 1.3)
    base = tuple(2.0 * d for d in drift)
    head = tuple(b * r for b, r in zip(base, per_round, strict=True))
    assert sorted(head)[3] / sorted(base)[3] == pytest.approx(1.17)
    for metric in ("op_self_ms[aten::mm]", "op_share[aten::mm]"):
        r = one([pair([rec(metric, head)], [rec(metric, base)])] * 2)
        assert r.base is not None and r.base.pair_ratios == pytest.approx((1.03, 1.03)), metric


def test_rates_fail_when_the_head_is_slower() -> None:
    pairs = [pair([rec("tokens_per_s", steps(80.0), key="dec")], [rec("tokens_per_s", steps(100.0), key="dec")])
             for _ in range(3)]
    r = one(pairs)
    assert r.outcome == "fail" and r.base is not None and r.base.ratio == pytest.approx(0.8)


KEYED = DeviceInfo(type="cpu", model="test cpu", count=2, threads=1, cpuid="25/17/1", isa_class="avx2")


def keyed(r: Record) -> Record:
    return r.with_(device=KEYED)


def test_a_check_the_base_lacks_is_judged_against_the_stored_budget_where_stored_timing_gates() -> None:
    ident = KEYED.identity
    assert ident is not None
    mine = budgets(BUDGETS.replace("  type: cpu\n", f"  type: cpu\n  identity: {ident}\n"))
    pairs = [pair([keyed(rec("step_ms", steps(10.5)))], [keyed(rec("step_ms", steps(10.0), nodeid="elsewhere"))])
             for _ in range(2)]
    cmp = compare_pairs(pairs, budgets=mine, stable_machine=ident)
    r = cmp.records[0]
    assert cmp.not_compared == ((NODE, "enc", "step_ms"),) and cmp.base_only == (("elsewhere", "enc", "step_ms"),)
    assert r.outcome == "pass" and r.vs_base is None and r.budget is not None and r.n == 10
    assert r.reason.startswith("not compared with the base: the base lacks it; against the stored budget:")
    info = r.base
    assert info is not None and not info.compared and info.note == "the base lacks it"
    slow = [pair([keyed(rec("step_ms", steps(13.5)))], [])]
    assert compare_pairs(slow, budgets=mine, stable_machine="yes").records[0].outcome == "fail"  # 10 ms +30 %
    # As in a stored run, nowhere else: a machine not declared stable, a budget another machine's
    # file holds (cpu.yaml names no identity), a declaration naming another machine.
    for declared, held, why in (("", mine, "gate only on a machine declared stable"),
                                ("yes", budgets(), "is not keyed by this machine's identity"),
                                ("cpu-other", mine, "declares a stable machine, but this cpu device is")):
        got = compare_pairs(slow, budgets=held, stable_machine=declared).records[0]
        assert got.outcome == "advisory" and got.advice == "fail", declared
        assert "not compared with the base: the base lacks it; against the stored budget: advisory (would fail)" \
            in got.reason and why in got.reason, got.reason


def test_a_base_that_could_not_run_is_named_with_its_problem() -> None:
    r = one([pair([rec("step_ms", steps(10.5))], None, "pytest exited 2; no records")])
    assert "the base could not run under this instrument (pytest exited 2; no records)" in r.reason
    unbudgeted = one([pair([rec("step_ms", steps(1.0), key="nobudget")], None, "pytest exited 4")])
    assert unbudgeted.outcome == "unbudgeted"


def test_a_required_base_that_could_not_run_makes_timing_checks_errors() -> None:
    pairs = [pair([rec("step_ms", steps(10.5)), rec("flops", value=1000.0, reason="within budget")], None,
                  "pytest exited 1; no records")]
    step, flops = compare_pairs(pairs, budgets=budgets(), require_base=True, final=True).records
    assert step.outcome == "error" and "--allow-missing-base" in step.reason
    assert "the base could not run under this instrument (pytest exited 1; no records)" in step.reason
    assert flops.outcome == "pass" and "not compared with the base" in flops.reason


def test_a_base_error_is_not_compared_and_says_why() -> None:
    r = one([pair([rec("step_ms", steps(10.5))], [rec("step_ms", outcome="error", reason="ImportError: x")])])
    assert "not compared with the base: base error: ImportError: x" in r.reason


def test_pairs_without_a_base_value_are_skipped_and_counted() -> None:
    pairs = [pair([rec("step_ms", steps(10.0))], [rec("step_ms", steps(10.0))]),
             pair([rec("step_ms", steps(10.0))], [rec("step_ms", outcome="error", reason="boom")]),
             pair([rec("step_ms", steps(10.0))], [rec("step_ms", steps(10.0))])]
    r = one(pairs)
    assert r.outcome == "pass" and r.base is not None and r.base.pairs == 2
    assert "not compared in pair 2 (base error: boom)" in r.reason
    numbered = [PairRecords(head=p.head, base=p.base, index=k) for p, k in zip(pairs, (1, 3, 4), strict=True)]
    assert "not compared in pair 3 (base error: boom)" in one(numbered).reason


def test_exact_checks_keep_the_heads_verdict_and_show_the_change() -> None:
    same = one([pair([rec("flops", value=1000.0, reason="within budget")], [rec("flops", value=1000.0)])])
    assert same.outcome == "pass" and same.reason == "within budget; vs base: same as the base (1000)"
    assert same.base is not None and same.base.value == 1000.0 and same.base.ratio == 1.0
    grew = one([pair([rec("flops", value=1100.0, outcome="fail", reason="1100 is worse than the limit 1000")],
                     [rec("flops", value=1000.0)])])
    assert grew.outcome == "fail" and "vs base: base 1000 -> head 1100 (+10.0 %)" in grew.reason
    lacking = one([pair([rec("flops", value=1000.0, reason="within budget")], [])])
    assert lacking.vs_base is None and "not compared with the base: the base lacks it" in lacking.reason


def test_head_errors_are_kept_as_they_are() -> None:
    head = rec("step_ms", outcome="error", reason="RuntimeError: boom")
    assert one([pair([head], [rec("step_ms", steps(10.0))])]) == head


def test_a_broken_budget_file_is_an_error_for_every_check() -> None:
    broken = budgets("schema: 1\ndevice: {type: cpu}\nbudgets: [oops]\n")
    r = compare_pairs([pair([rec("step_ms", steps(10.0))], [rec("step_ms", steps(10.0))])], budgets=broken).records[0]
    assert r.outcome == "error" and r.reason.startswith("budget file error: budgets/cpu.yaml")


def test_records_keep_the_heads_order_and_json_round_trip(tmp_path: Path) -> None:
    head = [rec("step_ms", steps(10.0), key="b"), rec("step_ms", steps(10.0), key="a"), rec("flops", value=1.0, key="a")]
    base = [rec("step_ms", steps(10.0), key="a"), rec("step_ms", steps(10.0), key="b"), rec("flops", value=1.0, key="a")]
    cmp = compare_pairs([pair(head, base), pair(head, base)], budgets=budgets())
    assert [(r.key, r.metric) for r in cmp.records] == [("b", "step_ms"), ("a", "step_ms"), ("a", "flops")]
    from perfbudget.results import load_results

    back = load_results(Results(records=cmp.records).write(tmp_path / "r.json")).records
    assert [r.base for r in back] == [r.base for r in cmp.records]
    assert [r.base.tolerance for r in back if r.base is not None] == [0.05, 0.05, None]


def test_records_without_a_measurement_are_kept_as_they_are() -> None:
    not_measured = Record(nodeid="", key="enc", metric="step_ms", outcome="not_measured", device=DEV, kind="timing")
    unmeasurable = rec("step_ms", outcome="unmeasurable", reason="energy counters are not readable")
    for head in (not_measured, unmeasurable):
        assert one([pair([head], [rec("step_ms", steps(10.0), nodeid=head.nodeid)])]) == head


def test_samples_a_sides_preflight_did_not_judge_are_still_compared() -> None:
    # A busy machine is what lockstep turn-taking is for: both sides saw the same load.
    busy = "preflight: CPU load average 3.10 on 2 cores exceeds 1.5 per core"
    pairs = [pair([rec("step_ms", steps(13.0), key="x", outcome="not_judged", reason=busy)],
                  [rec("step_ms", steps(10.0), key="x", outcome="not_judged", reason=busy)]) for _ in range(2)]
    r = one(pairs)
    assert r.outcome == "fail" and r.base is not None and r.base.ratio == pytest.approx(1.3)
    alone = one([pair([rec("step_ms", steps(13.0), key="x", outcome="not_judged", reason=busy)], [])])
    assert alone.outcome == "not_judged" and alone.reason == f"not compared with the base: the base lacks it; {busy}"


def test_the_comparison_round_trips_on_the_record_and_a_schema_1_file_is_migrated(tmp_path: Path) -> None:
    import json

    from perfbudget.results import BaseSide, load_results

    base = BaseSide(value=10.0, ratio=1.04, ratio_ci=(1.0, 1.08), pairs=4, tolerance=0.05,
                    tolerance_from="default for timing", sd=0.02, df=5.0, prior="measured: budgets/noise/x.yaml, 9 df",
                    detectable=0.08, confidence=0.975)
    (back,) = load_results(Results(records=[rec("step_ms", steps(10.4)).with_(base=base)]).write(
        tmp_path / "r.json")).records
    assert back.base == base and back.vs_base == base and base.log_se == pytest.approx(0.01)
    # A results file of schema 1 kept the verdict's settings in extra["ab"]; it reads as today's.
    old = {"schema": 1, "meta": {"ab": {"policy": {"prior_df": 3.0}}}, "records": [
        {**rec("step_ms", steps(10.4)).as_dict(), "base": {"value": 10.0, "ratio": 1.04, "ratio_ci": [1.0, 1.08],
                                                           "pairs": 4},
         "extra": {"ab": {"compared": True, "tolerance": 0.05, "tolerance_from": "default for timing", "mde": 0.08,
                          "confidence": 0.95}, "other": 1}},
        {**rec("flops", value=1.0).as_dict(), "extra": {"ab": {"compared": False, "note": "the base lacks it"}}}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    moved, lacking = load_results(tmp_path / "old.json").records
    assert moved.extra == {"other": 1} and moved.vs_base is not None and moved.vs_base.tolerance == 0.05
    assert moved.vs_base.detectable == 0.08 and moved.vs_base.df == 6.0  # the flat prior's 3 df and 3 pairs'
    half = math.log(1.08 / 1.0) / 2
    assert moved.vs_base.sd == pytest.approx(half / t_quantile(0.975, 6.0) * 2)  # from its interval
    assert lacking.vs_base is None and lacking.base is not None and lacking.base.note == "the base lacks it"


def test_a_numeric_change_from_the_base_is_shown_and_judged_against_its_tolerance() -> None:
    def drift(head: float, base: float) -> Record:
        h = Record(nodeid=NODE, key="enc", metric="loss_drift", outcome="pass", value=head, n=1, device=DEV,
                   kind="exact", reason="within budget")
        b = Record(nodeid=NODE, key="enc", metric="loss_drift", outcome="pass", value=base, n=1, device=DEV,
                   kind="exact")
        return one([pair([h], [b])])

    # A kernel-path change (+0.2 %) is shown, not a failure: the stated bound is 25 %.
    small = drift(0.01002, 0.01)
    assert small.outcome == "pass" and "base 0.01 -> head 0.01002 (+0.2 %) (tolerance 25% from default for exact)" in small.reason
    # Losing precision (x2) fails against the base even where the budget still holds.
    lost = drift(0.02, 0.01)
    assert lost.outcome == "fail" and "worse than the base beyond its tolerance" in lost.reason
    info = lost.base
    assert info is not None and info.tolerance == 0.25


def test_failing_checks_carry_the_operators_that_moved_against_the_base() -> None:
    head = [rec("step_ms", steps(13.0)), rec("op_self_ms[aten::mm]", steps(6.0)),
            rec("op_self_ms[aten::relu]", steps(2.0))]
    base = [rec("step_ms", steps(10.0)), rec("op_self_ms[aten::mm]", steps(4.0)),
            rec("op_self_ms[aten::relu]", steps(2.0))]
    records = {r.metric: r for r in compare_pairs([pair(head, base), pair(head, base)], budgets=budgets()).records}
    assert records["step_ms"].outcome == "fail" and records["op_self_ms[aten::relu]"].outcome == "pass"
    moved = OperatorMoves.from_extra(records["step_ms"].extra)
    assert moved is not None
    (mm,) = moved.moves  # relu did not move: not named
    assert (mm.op, mm.against, mm.before, mm.after) == ("aten::mm", "base", pytest.approx(4.0), pytest.approx(6.0))
    assert mm.ratio == pytest.approx(1.5) and mm.failing and mm.outcome == "fail"
    assert OperatorMoves.from_extra(records["op_self_ms[aten::relu]"].extra) is None


def test_an_instruction_count_is_judged_against_the_base_and_names_the_functions_that_moved() -> None:
    from perfbudget.extras import InstructionProfile

    def count(value: float, mm: float) -> Record:
        profile = InstructionProfile.of("callgrind Ir", [("at::native::mm", 10.0, mm), ("gelu", 5.0, 5.0)])
        return Record(nodeid=NODE, key="enc", metric="instructions[callgrind]", outcome="unbudgeted", value=value,
                      n=1, device=DEV, kind="count", extra=profile.to_extra())

    same = one([pair([count(1_001_000, 900.0)], [count(1_000_000, 900.0)])])
    assert same.outcome == "unbudgeted" and "(tolerance 0.5% from default for count)" in same.reason and not same.attribution
    more = one([pair([count(1_020_000, 1300.0)], [count(1_000_000, 900.0)])])
    assert more.outcome == "fail" and "worse than the base beyond its tolerance" in more.reason
    assert any("at::native::mm: 900 -> 1,300 per step (+400)" in x for x in more.attribution)


def test_a_check_measured_on_another_device_by_the_base_is_not_compared() -> None:
    """A pull request that adds or drops a gpu mark: CUDA-event times over CPU wall times are no change of code."""
    from dataclasses import replace as with_

    gpu = DeviceInfo(type="cuda", model="NVIDIA H200", count=1, compute_capability="9.0")
    head = [with_(rec("step_ms", steps(2.0)), device=gpu)]
    r = one([pair(head, [rec("step_ms", steps(10.0))]), pair(head, [rec("step_ms", steps(10.0))]),
             pair(head, [rec("step_ms", steps(10.0))])], final=True)
    assert r.vs_base is None or not r.vs_base.compared
    assert "device cpu" in r.reason and "vs cuda" in r.reason


def test_at_the_end_a_check_with_fewer_pairs_than_it_needs_is_inconclusive_not_passed() -> None:
    """A run stopped for time after one pair: its single ratio passes nothing (--min-pairs 2)."""
    r = one([pair([rec("step_ms", steps(10.0))], [rec("step_ms", steps(10.0))])], final=True, min_pairs=2)
    assert r.outcome == "inconclusive" and "1 pair(s), fewer than the 2 a check needs (--min-pairs)" in r.reason
