"""How a run judges its measurements: one object per run, chosen once from its command line.

- :class:`Stored`: judge against the stored budgets (the default). A stored timing budget
  gates only on a machine declared stable, in a file keyed by its identity; elsewhere its
  verdict is *advisory* (shown, never a failure). A busy machine (preflight) or another machine
  (the speed reference) sets timing aside.
- :class:`Update`: ``--update-budgets``: the same verdicts, shown; none fails the test, and the
  session writes the budgets afterwards.
- :class:`ABSide`: one side of a lockstep A/B run (``--perf-collect``): statistical checks are
  sampled (to a precision, when asked) and recorded, never judged here: ``perfbudget ab``
  judges head/base. The side takes turns with the other one and records the operators the
  driver pins.

:class:`perfbudget.judge.Judge` resolves a check's budget and hands it to the run's judging;
no other code asks which mode a run is in.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .budgets.verdict import Outcome, Verdict, VerdictPolicy
from .measure.stats import median, quantile_ci
from .metrics import MetricName
from .settings import RunSpec
from .vocabulary import RunMode, TestOutcome

__all__ = ["DEFAULT_AB_PRECISION", "ABSide", "Judging", "Samples", "Stored", "Update", "judging_for",
           "pinned_operators"]

Samples = float | Sequence[float]

#: Target half-width of a check's within-pair head/base ratio when one is asked for: +-1 %.
DEFAULT_AB_PRECISION = 0.01


ByOutcome = Mapping[Outcome, tuple[Verdict, ...]]


class Judging:
    """What differs between the ways a run judges (subclasses: :class:`Stored`, :class:`Update`,
    :class:`ABSide`); the defaults are :class:`Stored`'s."""

    mode: ClassVar[RunMode] = RunMode.STORED
    writes_budgets: ClassVar[bool] = False
    """The session writes budgets from the run's records (and an empty run still finishes)."""
    takes_turns: ClassVar[bool] = False
    """The process takes turns with the other side of an A/B run; its results are read by the
    driver only (no checkpoint after each test, no HTML report)."""
    screens: ClassVar[bool] = True
    """A busy machine or another machine sets timing aside, and stored timing is advisory off a
    machine declared stable; else a check's verdict is that of its samples as recorded."""

    def gather(self, name: MetricName, samples: Samples, more: Callable[[], Any] | None,
               reference: Sequence[float] | None, *, confidence: float) -> tuple[
            Samples, Callable[[], Any] | None, Sequence[float] | None]:
        """The samples to judge, the source of more, and the reference times to normalise by
        (``confidence``: of the checks' intervals)."""
        return samples, more, reference

    def policy(self, policy: VerdictPolicy) -> VerdictPolicy:
        """The statistical settings a check is decided with."""
        return policy

    def settle(self, by: ByOutcome, *, strict: bool, missing: bool, verdicts: Sequence[Verdict]) -> tuple[
            TestOutcome, tuple[Verdict, ...]]:
        """The test's outcome and the verdicts that fail it, from its verdicts by outcome;
        ``missing``: a budget of this test's families was not recorded."""
        failing = [*by[Outcome.ERROR], *by[Outcome.FAIL]]
        if strict:
            failing += [*by[Outcome.STALE], *by[Outcome.UNBUDGETED], *by[Outcome.NOT_JUDGED],
                        *by[Outcome.INCONCLUSIVE], *(v for v in by[Outcome.ADVISORY] if v.advice == Outcome.FAIL)]
        if failing or (strict and missing):
            return TestOutcome.FAIL, tuple(failing)
        unmeasurable = by[Outcome.UNMEASURABLE]
        something_missing = (by[Outcome.NOT_JUDGED] or by[Outcome.UNBUDGETED] or by[Outcome.INCONCLUSIVE]
                             or (unmeasurable and len(unmeasurable) == len(verdicts)))
        return (TestOutcome.SKIP if something_missing else TestOutcome.PASS), ()

    def pinned_operators(self, nodeid: str, key: str) -> tuple[str, ...] | None:
        """The operators this run records for ``nodeid``'s ``key`` whatever their share (``None``: any)."""
        return None


@dataclass(frozen=True)
class Stored(Judging):
    """Judge against the stored budgets (the default)."""


@dataclass(frozen=True)
class Update(Judging):
    """``--update-budgets``: verdicts are shown and fail nothing but errors; budgets are written after."""

    mode: ClassVar[RunMode] = RunMode.UPDATE
    writes_budgets: ClassVar[bool] = True

    def settle(self, by: ByOutcome, *, strict: bool, missing: bool, verdicts: Sequence[Verdict]) -> tuple[
            TestOutcome, tuple[Verdict, ...]]:
        errors = by[Outcome.ERROR]
        return (TestOutcome.FAIL if errors else TestOutcome.PASS), errors


@dataclass(frozen=True, kw_only=True)
class ABSide(Judging):
    """One side of a lockstep A/B run: record samples, judge nothing statistical.

    Attributes:
        precision: the half-width (a fraction) that a check's within-pair head/base ratio
            should reach: a check keeps taking fresh batches (each one in turns with the other
            side) while the CI of its own median is wider than ``precision / sqrt(2)`` (each
            side carries half the ratio's variance), up to ``max_batches`` extra batches or
            ``max_s`` seconds. Noisy checks get more samples, quiet ones none. ``None``: one
            fixed sample set.
        max_batches: see ``precision``.
        max_s: see ``precision`` (wall time of the extra batches, the other side's turns included).
        operators_file: the driver's file of pinned operators (named in the side's run spec,
            :class:`perfbudget.settings.RunSpec`); it writes the file after the first pair.
    """

    mode: ClassVar[RunMode] = RunMode.COLLECT
    takes_turns: ClassVar[bool] = True
    screens: ClassVar[bool] = False  # a busy machine is no reason to set samples aside: the other side shares it
    precision: float | None = None
    max_batches: int = 4
    max_s: float = 60.0
    operators_file: str = ""

    def __post_init__(self) -> None:
        if self.precision is not None and not 0 < self.precision < 1:
            raise ValueError(f"precision must be in (0, 1) or None, got {self.precision!r}")
        if self.max_batches < 0 or self.max_s < 0:
            raise ValueError(f"max_batches and max_s must be >= 0, got {self.max_batches!r}, {self.max_s!r}")

    def gather(self, name: MetricName, samples: Samples, more: Callable[[], Any] | None,
               reference: Sequence[float] | None, *, confidence: float) -> tuple[
            Samples, Callable[[], Any] | None, Sequence[float] | None]:
        # Both sides share the machine's state: the ratio is judged raw (normalising by a
        # reference measured beside each sample would cancel part of a real slowdown too).
        if name.metric.statistical:
            samples = self._to_precision(samples, more, confidence=confidence, paired=reference is not None)
        return samples, None, None

    def _to_precision(self, samples: Samples, more: Callable[[], Any] | None, *, confidence: float,
                      paired: bool) -> Samples:
        """The samples extended by fresh batches while the CI of their median is wider than
        the side's share of :attr:`precision`."""
        if self.precision is None or more is None or isinstance(samples, (int, float)):
            return samples
        target = self.precision / math.sqrt(2)
        xs = list(samples)
        t0 = time.monotonic()
        for _ in range(self.max_batches):
            if _half_width(xs, confidence) <= target or time.monotonic() - t0 > self.max_s:
                break
            fresh = more()
            xs += list(fresh[0] if paired else fresh)
        return xs

    def policy(self, policy: VerdictPolicy) -> VerdictPolicy:
        return VerdictPolicy(confidence=policy.confidence, max_extra_rounds=0, confirm=False)

    def settle(self, by: ByOutcome, *, strict: bool, missing: bool, verdicts: Sequence[Verdict]) -> tuple[
            TestOutcome, tuple[Verdict, ...]]:
        errors = by[Outcome.ERROR]
        return (TestOutcome.FAIL if errors or (strict and missing) else TestOutcome.PASS), errors

    def pinned_operators(self, nodeid: str, key: str) -> tuple[str, ...] | None:
        return pinned_operators(self.operators_file, nodeid, key)


def judging_for(*, collect: bool, update: bool, spec: RunSpec | None = None) -> Judging:
    """The run's way of judging from its command line (``--perf-collect``, ``--update-budgets``) and,
    on a side of an A/B run, its run spec (precision, pinned operators).

    Raises:
        ValueError: both at once.
    """
    if collect and update:
        raise ValueError("--perf-collect (one side of an A/B run) cannot be combined with --update-budgets")
    if collect:
        return ABSide(precision=spec.precision, operators_file=spec.operators_file) if spec else ABSide()
    return Update() if update else Stored()


def pinned_operators(path: str, nodeid: str, key: str) -> tuple[str, ...] | None:
    """The operators a lockstep A/B run pins for ``nodeid``'s ``key`` (``None``: not pinned).

    Raises:
        ValueError: the file cannot be read or is not of the form above (naming the file).
    """
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"pinned operators {path}: cannot be read: {exc}") from None
    ops = data.get(nodeid, {}).get(key) if isinstance(data, dict) and isinstance(data.get(nodeid, {}), dict) else None
    if ops is None:
        return None
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ValueError(f"pinned operators {path}: [{nodeid!r}][{key!r}]: expected a list of operator names, "
                         f"got {ops!r}")
    return tuple(ops)


def _half_width(xs: Sequence[float], confidence: float) -> float:
    """Relative half-width of the distribution-free CI of the median of ``xs`` (inf: too few)."""
    if len(xs) < 2:
        return math.inf
    lo, hi, coverage = quantile_ci(xs, 0.5, confidence)
    mid = median(xs)
    if coverage < confidence or mid == 0:
        return math.inf
    return (hi - lo) / 2 / abs(mid)
