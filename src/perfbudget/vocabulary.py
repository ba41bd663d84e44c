"""The instrument's vocabulary: what became of a check, of a test, and what a run does, as string enums."""

from __future__ import annotations

import enum
import sys
from collections import Counter
from collections.abc import Iterable, Mapping

__all__ = ["OUTCOMES", "Outcome", "RunMode", "StrEnum", "TestOutcome", "count_outcomes", "tally_text"]

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # pragma: no cover - exercised on Python 3.10 only

    class StrEnum(str, enum.Enum):
        """A ``str`` whose ``str()`` and format are its value, as ``enum.StrEnum`` in 3.11."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


class Outcome(StrEnum):
    """What became of one check, for verdicts, records and reports; the values are the results file's."""

    PASS = "pass"
    """Judged against its budget (or the base) and within it."""
    STALE = "stale"
    """Judged, and better than its budget beyond the tolerance: the budget should be tightened."""
    FAIL = "fail"
    """Judged, and worse than its budget (or the base) beyond the tolerance."""
    ADVISORY = "advisory"
    """Timing against a stored budget on a machine not declared stable: would-be outcome in ``advice``."""
    INCONCLUSIVE = "inconclusive"
    """A lockstep A/B check whose interval still straddles the tolerance at the last pair."""
    UNBUDGETED = "unbudgeted"
    """Measured, with no budget for it on this device."""
    NOT_JUDGED = "not_judged"
    """Measured, and set aside: timing cannot be trusted now (busy CPU, shared GPU, slow reference)."""
    UNMEASURABLE = "unmeasurable"
    """Cannot be measured here (no counter, no GPU), with the reason."""
    NOT_MEASURED = "not_measured"
    """Budgeted for this key and device, but no test recorded it."""
    ERROR = "error"
    """The budget or the measurement is broken (a bad budget file, bad samples)."""


OUTCOMES: tuple[Outcome, ...] = tuple(Outcome)
"""Every outcome, in declaration order."""


def count_outcomes(outcomes: Iterable[str]) -> dict[str, int]:
    """``{outcome: count}`` in the order the outcomes first come (``count_outcomes(r.outcome for r in records)``)."""
    return dict(Counter(outcomes))


def tally_text(counts: Mapping[str, int]) -> str:
    """``2 fail, 5 pass``: the counts by outcome name, for a summary line (empty for no counts)."""
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))


class RunMode(StrEnum):
    """What a run does with its measurements (``meta["mode"]`` in the results)."""

    STORED = "stored"
    """Judge against the stored budgets (the default; results of schema 3 and older said ``check``)."""
    UPDATE = "update"
    """Write budgets (``--update-budgets``): budget verdicts fail nothing."""
    COLLECT = "collect"
    """One side of a lockstep A/B run (``--perf-collect``): record samples, judge nothing."""
    AB = "ab"
    """A lockstep A/B run's merged results (``perfbudget ab``): timing judged head/base."""


class TestOutcome(StrEnum):
    """What a test's verdicts mean for the test (pytest's own outcome follows it)."""

    __test__ = False  # not a test class, whatever pytest's name pattern says

    PASS = "pass"
    SKIP = "skip"
    """Nothing failed, but something was not judged."""
    FAIL = "fail"
