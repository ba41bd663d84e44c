"""What an A/B record says of a check's allocation and of pairs that split in two modes, on constructed records."""

from __future__ import annotations

import pytest
from test_ab_merge import one, pair, rec, steps

from perfbudget.ab.ratios import process_modes
from perfbudget.measure.memory import ALLOCATION, Allocation
from perfbudget.results import Record

MIB = 1 << 20


def allocating(r: Record, mib: float, faults: float = 0.0) -> Record:
    return r.with_(extra={ALLOCATION: Allocation(bytes_per_call=mib * MIB, minor_faults_per_call=faults).to_extra()})


def test_a_slower_check_that_allocates_more_names_the_bytes_in_its_reason() -> None:
    pairs = [pair([allocating(rec("step_ms", steps(13.0), key="other"), 31.0)],
                  [allocating(rec("step_ms", steps(10.0), key="other"), 6.0)]) for _ in range(3)]
    r = one(pairs)
    assert r.outcome == "fail"
    assert "+25.0 MiB allocated per call (6.0 -> 31.0 MiB)" in r.reason


def test_page_faults_that_moved_are_named_and_an_unchanged_allocation_is_not() -> None:
    pairs = [pair([allocating(rec("step_ms", steps(10.0), key="other"), 6.0, faults=1536)],
                  [allocating(rec("step_ms", steps(10.0), key="other"), 6.0, faults=0)]) for _ in range(3)]
    assert "+1536 minor page faults per call (0 -> 1536)" in one(pairs).reason
    assert "allocated" not in one(pairs).reason
    same = [pair([allocating(rec("step_ms", steps(10.0), key="other"), 6.0, 3)],
                 [allocating(rec("step_ms", steps(10.0), key="other"), 6.0, 0)]) for _ in range(3)]
    assert "per call" not in one(same).reason


def test_a_change_below_the_floor_is_not_named() -> None:
    head = Allocation(bytes_per_call=6 * MIB + 1000, minor_faults_per_call=10)
    assert head.change_from(Allocation(bytes_per_call=6 * MIB, minor_faults_per_call=0)) == ""
    assert head.change_from(Allocation(bytes_per_call=0, minor_faults_per_call=0)).startswith("+6.0 MiB")


@pytest.mark.parametrize("bad", [{"bytes_per_call": -1, "minor_faults_per_call": 0},
                                 {"bytes_per_call": float("nan"), "minor_faults_per_call": 0},
                                 {"bytes_per_call": 1}, "x", {"bytes_per_call": True, "minor_faults_per_call": 0}])
def test_a_malformed_allocation_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="allocation"):
        Allocation.from_extra({ALLOCATION: bad})
    assert Allocation.from_extra({}) is None


def test_pairs_in_two_clusters_are_named_as_two_process_modes() -> None:
    # The per-pair ratios of two checks of an image library's suite (one thread, default glibc).
    assert process_modes([0.30, 1.02, 1.24, 0.29, 1.20, 3.40]) == pytest.approx((0.295, 1.22), rel=0.01)
    assert process_modes([0.40, 0.98, 0.97, 0.39, 0.98, 1.25]) == pytest.approx((0.395, 0.98), rel=0.01)
    assert process_modes([0.97, 0.98, 1.02, 1.03, 1.03, 1.04]) is None  # ordinary spread
    assert process_modes([0.5, 1.0, 1.0]) is None  # too few pairs for two clusters of two
    assert process_modes([0.7, 0.8, 0.9, 1.0, 1.1, 1.2]) is None  # a wide spread, no gap in it


def test_a_bimodal_check_says_so_in_its_reason() -> None:
    ratios = [0.40, 0.98, 0.97, 0.39, 0.98, 1.25]
    pairs = [pair([rec("step_ms", steps(10.0 * x), key="other")], [rec("step_ms", steps(10.0), key="other")])
             for x in ratios]
    r = one(pairs, final=True)
    assert r.outcome == "inconclusive" and "bimodal between processes: 0.39 / 0.98" in r.reason


@pytest.mark.parametrize(("ratios", "modes"), [
    # An A/A of examples/image-colour-suite with the allocator as-is (benchmarks/large-tensors-cpu.json).
    ([8.864, 0.989, 1.005, 8.513, 0.876, 0.986], (0.99, 8.69)),
    ([0.085, 0.869, 0.997, 0.172, 0.232, 0.94], (0.17, 0.94)),
    ([0.746, 1.05, 0.796, 1.029, 0.823, 1.052], (0.80, 1.05)),
])
def test_the_recorded_as_is_pairs_of_large_tensors_are_named_bimodal(ratios: list[float],
                                                                     modes: tuple[float, float]) -> None:
    assert process_modes(ratios) == pytest.approx(modes, abs=0.01)


def test_the_recorded_settled_pairs_are_not() -> None:
    assert process_modes([1.042, 1.011, 1.005, 0.994]) is None
    assert process_modes([1.024, 1.026, 1.016, 1.005]) is None
