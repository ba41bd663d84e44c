"""Level shifts weighted by each run's standard error, and a one-run blip that the next run undid (not a finding)."""

from __future__ import annotations

import pytest

from perfbudget.history.changepoints import ChangeConfig, level_shifts

WIGGLE = [1.0, 1.003, 0.998, 1.002, 0.997, 1.001] * 3


def test_a_one_run_blip_that_the_next_run_undid_is_not_a_finding() -> None:
    blip = [40 * x for x in WIGGLE[:8]] + [48.0] + [40 * x for x in WIGGLE[9:16]]
    assert level_shifts(blip) == []
    # The same fit with one-run levels allowed reports the blip twice, up and back down.
    assert [s.index for s in level_shifts(blip, config=ChangeConfig(min_size=1))] == [8, 9]


def test_a_level_that_held_for_two_runs_and_one_that_holds_are_findings() -> None:
    held = [40 * x for x in WIGGLE[:8]] + [48 * x for x in WIGGLE[8:10]] + [40 * x for x in WIGGLE[10:16]]
    assert [(s.index, round(s.change, 2)) for s in level_shifts(held)] == [(8, 0.2), (10, -0.17)]
    last = [40 * x for x in WIGGLE[:15]] + [48.0]  # nothing after it has undone it yet
    assert [s.index for s in level_shifts(last)] == [15]


def test_runs_with_wide_standard_errors_weigh_less() -> None:
    step = [40 * x for x in WIGGLE[:10]] + [42.4 * x for x in WIGGLE[10:14]]
    assert [s.index for s in level_shifts(step)] == [10]
    assert [s.index for s in level_shifts(step, se=[0.001] * 14)] == [10]  # equal errors: as unweighted
    # The four later runs measured themselves 50x less precisely: the same values are no finding.
    assert level_shifts(step, se=[0.001] * 10 + [0.05] * 4) == []
    # A run that did not keep its error leaves the whole series unweighted.
    assert [s.index for s in level_shifts(step, se=[0.001] * 10 + [0.05] * 3 + [None])] == [10]


def test_min_size_is_checked() -> None:
    with pytest.raises(ValueError, match="min_size: expected an integer >= 1, got 0"):
        ChangeConfig(min_size=0)


def test_equal_weights_take_the_unweighted_fit() -> None:
    from perfbudget.history.changepoints import pelt_breakpoints

    series = [1.0, 1.1, 0.9, 1.0, 3.0, 3.1, 2.9, 3.0, 1.0, 1.05]
    # Equal weights c scale every segment's cost by c: the same segments as unweighted at penalty / c.
    assert pelt_breakpoints(series, 0.5, weights=[2.0] * 10) == pelt_breakpoints(series, 0.25) == [4, 8, 10]
    assert pelt_breakpoints(series, 0.5, weights=[1.0] * 10) == pelt_breakpoints(series, 0.5)
