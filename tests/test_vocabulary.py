"""Counting outcomes on literal lists: one count for the results file, the reports and every summary line."""

from __future__ import annotations

from perfbudget.vocabulary import Outcome, count_outcomes, tally_text


def test_count_outcomes_counts_in_first_seen_order() -> None:
    counts = count_outcomes([Outcome.PASS, Outcome.FAIL, "pass", Outcome.STALE, Outcome.PASS])
    assert counts == {"pass": 3, "fail": 1, "stale": 1}
    assert list(counts) == ["pass", "fail", "stale"]
    assert count_outcomes([]) == {}


def test_tally_text_names_the_outcomes_in_alphabetical_order() -> None:
    assert tally_text({Outcome.PASS: 3, Outcome.FAIL: 1, Outcome.NOT_JUDGED: 2}) == "1 fail, 2 not_judged, 3 pass"
    assert tally_text({}) == ""
