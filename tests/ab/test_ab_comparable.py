"""Comparability and outlying pairs: sides that measured differently are not compared, and a pair far
from the others is set aside; on constructed sides and ratios (no processes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from perfbudget.ab.merge import Comparison, PairRecords, compare_pairs
from perfbudget.ab.ratios import outlying_pair
from perfbudget.budgets.loader import BudgetSet
from perfbudget.device import DeviceInfo
from perfbudget.report.comment import pr_comment
from perfbudget.results import HowMeasured, Record, Results, RunInfo, load_results
from perfbudget.session import PerfSession
from perfbudget.settings import Settings
from perfbudget.verdict.judge import Stored
from perfbudget.verdict.ratio import judge_ratios

DEV = DeviceInfo(type="cpu", model="test cpu", count=2, threads=1)
ALIKE = HowMeasured(settings={"threads": "1", "burst_ms": "100.0", "lease": "False"}, machine="cpu-test-6-1-1-avx2",
                    versions={"torch": "2.5.1", "triton": "3.1.0", "numpy": "2.1.0", "python": "3.11.9"}, way="wall")
NOISY = [0.80, 0.91, 0.31, 0.80, 0.78, 0.81]


def steps(median: float) -> tuple[float, ...]:
    return (median * 0.98, median * 0.99, median, median * 1.01, median * 1.02)


def sides(head_ms: float, base_ms: float, *, head: HowMeasured = ALIKE, base: HowMeasured = ALIKE) -> PairRecords:
    def side(ms: float, how: HowMeasured) -> Results:
        records = [Record(nodeid="t.py::test", key="enc", metric="step_ms", outcome="pass", value=ms,
                          samples=steps(ms), device=DEV, kind="timing"),
                   Record(nodeid="t.py::test", key="enc", metric="flops", outcome="unbudgeted", value=1000.0,
                          device=DEV, kind="exact")]
        return Results(records=records, meta=RunInfo(measured=how))
    return PairRecords(head=side(head_ms, head), base=side(base_ms, base))


def compare(pairs: list[PairRecords]) -> Comparison:
    return compare_pairs(pairs, budgets=BudgetSet(root=Path("budgets")), final=True)


@pytest.mark.parametrize(("head", "reason"), [
    (replace(ALIKE, settings={**ALIKE.settings, "threads": "2"}), "threads 1 vs 2"),
    (replace(ALIKE, settings={**ALIKE.settings, "burst_ms": "30.0"}), "burst_ms 100.0 vs 30.0"),
    (replace(ALIKE, settings={**ALIKE.settings, "lease": "True"}), "lease False vs True"),
    (replace(ALIKE, machine="cpu-other-6-2-1-avx512"),
     "machine cpu-test-6-1-1-avx2 vs cpu-other-6-2-1-avx512"),
    (replace(ALIKE, versions={**ALIKE.versions, "torch": "2.6.0"}), "torch 2.5.1 vs 2.6.0"),
    (replace(ALIKE, versions={**ALIKE.versions, "triton": "3.2.0"}), "triton 3.1.0 vs 3.2.0"),
    (replace(ALIKE, versions={**ALIKE.versions, "numpy": "1.26.4"}), "numpy 2.1.0 vs 1.26.4"),
    (replace(ALIKE, versions={**ALIKE.versions, "python": "3.12.1"}), "python 3.11.9 vs 3.12.1"),
    (replace(ALIKE, way="callgrind"), "way wall vs callgrind"),
])
def test_sides_that_measured_differently_are_not_comparable_naming_the_field(head: HowMeasured, reason: str) -> None:
    c = compare([sides(10.0, 10.0, head=head), sides(10.0, 10.0, head=head)])
    step, flops = c.records
    assert step.outcome == "error" and step.reason.startswith(f"not comparable: {reason} (base vs head)")
    assert "measure both sides with the base's settings, or accept the change with a reason" in step.reason
    assert step.base is not None and not step.base.compared and step.base.not_comparable == reason
    assert c.not_comparable == (("t.py::test", "enc", "step_ms"),) and not c.undecided
    # An exact check keeps its own verdict against the budgets; only its comparison with the base is refused.
    assert flops.outcome == "unbudgeted" and flops.base is not None and flops.base.not_comparable == reason


def test_alike_sides_are_compared_and_a_library_one_side_never_loaded_is_no_difference() -> None:
    no_triton = replace(ALIKE, versions={k: v for k, v in ALIKE.versions.items() if k != "triton"})
    c = compare([sides(10.0, 10.0, head=no_triton), sides(10.1, 10.0, head=no_triton)])
    step, flops = c.records
    assert step.outcome == "pass" and step.base is not None and step.base.compared and step.base.pairs == 2
    assert flops.base is not None and flops.base.compared and not c.not_comparable


def test_a_pair_that_measured_differently_is_left_out_and_named_where_others_compare() -> None:
    threads2 = replace(ALIKE, settings={**ALIKE.settings, "threads": "2"})
    step, _ = compare([sides(10.0, 10.0), sides(10.0, 10.0, head=threads2), sides(10.1, 10.0)]).records
    assert step.outcome == "pass" and step.base is not None and step.base.pairs == 2
    assert "not compared in pair 2 (not comparable: threads 1 vs 2)" in step.reason


def test_how_a_side_measured_survives_the_results_file(tmp_path: Path) -> None:
    path = Results(meta=RunInfo(measured=ALIKE)).write(tmp_path / "r.json")
    assert load_results(path).meta.measured == ALIKE


def test_a_side_records_its_threads_from_its_settings(tmp_path: Path) -> None:
    session = PerfSession(rootdir=tmp_path, settings=Settings(threads=2), judging=Stored(), allow_loosen=False,
                          json_path=tmp_path / "r.json", is_worker=False)
    how = session.how_measured()
    assert how.settings == {"threads": "2", "burst_ms": "100.0", "lease": "False", "allocator": "as-is"} and how.way == "wall"
    assert set(how.versions) >= {"torch", "python"} and how.machine


def test_a_disturbed_pair_is_set_aside_and_the_rest_decide() -> None:
    aside = outlying_pair(NOISY, floor_sd=0.025)
    assert aside is not None and aside[0] == 2 and aside[1].startswith("head/base 0.31 lies 38 robust SDs")
    pairs = [sides(10.0 * r, 10.0) for r in NOISY]
    step, _ = compare(pairs).records
    assert step.outcome == "pass" and step.base is not None and step.base.pairs == 5
    assert step.base.ratio_ci is not None and step.base.ratio_ci[1] < 0.95  # decided: better beyond 5 %
    (p,) = step.base.set_aside
    assert p.pair == 3 and p.ratio == pytest.approx(0.31) and "robust SDs" in p.why
    assert "not compared in pair 3 (set aside: head/base 0.31" in step.reason
    # All six averaged in (sd 40 % per pair), the same pairs straddled the tolerance: inconclusive.
    assert judge_ratios(NOISY, tolerance=0.05, direction="lower", prior_sd=0.025, final=True).state == "inconclusive"


@pytest.mark.parametrize("ratios", [[1.0, 1.03, 0.98, 1.01, 0.97, 1.02], [0.9, 1.1, 1.0, 0.95],
                                    [0.80, 0.91, 0.86, 0.80, 0.78, 0.81]])
def test_an_ordinary_spread_sets_nothing_aside(ratios: list[float]) -> None:
    assert outlying_pair(ratios, floor_sd=0.025) is None
    step, _ = compare([sides(10.0 * r, 10.0) for r in ratios]).records
    assert step.base is not None and step.base.set_aside == () and step.base.pairs == len(ratios)


def test_fewer_than_four_pairs_set_nothing_aside() -> None:
    assert outlying_pair([0.80, 0.31, 0.80], floor_sd=0.025) is None


def test_pairs_without_spread_or_with_a_non_positive_ratio_set_nothing_aside() -> None:
    # Identical others and no prior spread: no distance to measure (no division by zero either).
    assert outlying_pair([1.0, 1.0, 1.0, 1.2], floor_sd=0.0) is None
    assert outlying_pair([1.0, 1.01, 0.99, -0.5], floor_sd=0.025) is None


def test_a_set_aside_pair_is_run_again_while_the_run_has_pairs() -> None:
    # 3 ordinary pairs remain of 4 and 4 are the minimum: the check wants another pair, as after an invalid one.
    pairs = [sides(10.0 * r, 10.0) for r in (1.0, 1.01, 0.31, 0.99)]
    c = compare_pairs(pairs, budgets=BudgetSet(root=Path("budgets")), final=False, min_pairs=4)
    assert c.undecided == (("t.py::test", "enc", "step_ms"),)
    assert c.records[0].base is not None and [p.pair for p in c.records[0].base.set_aside] == [3]


def test_the_comment_says_what_was_not_comparable_and_what_to_do() -> None:
    threads2 = replace(ALIKE, settings={**ALIKE.settings, "threads": "2"})
    text = pr_comment(Results(records=compare([sides(10.0, 10.0, head=threads2)]).records))
    assert ("**Not comparable with the base**: the sides measured differently (threads 1 vs 2, base vs head). "
            "Measure both sides with the base's settings to compare them, or accept the change with a reason.") in text
    assert "Not comparable" not in pr_comment(Results(records=compare([sides(10.0, 10.0)]).records))


def test_a_pair_set_aside_is_replaced_while_the_run_has_one_to_give() -> None:
    """Deciding on the others alone would narrow the interval after looking at the data: like an invalid pair,
    the one set aside wants another while pairs are left; at the end (or with none left) the others decide."""
    pairs = [sides(10.0 * r, 10.0) for r in NOISY]
    running = compare_pairs(pairs, budgets=BudgetSet(root=Path("budgets")), final=False, pairs_left=2)
    assert running.undecided == (("t.py::test", "enc", "step_ms"),)
    none_left = compare_pairs(pairs, budgets=BudgetSet(root=Path("budgets")), final=False, pairs_left=0)
    assert none_left.undecided == ()
