"""The decision rule: an estimate meets its limits and gets a state; decides, never measures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from ..fileio import shown_path
from ..metrics import OP_TIMED_FAMILIES, Direction, Kind, Metric, family_of

__all__ = ["BYTES_FLOOR_MIB", "DEFAULT_TOLERANCE", "DEVICE_TIME_TOLERANCE", "EXACT_EPS", "FAMILY_ALPHA",
           "METRIC_TOLERANCE", "NUMERIC_TOLERANCE", "SERIES_TOLERANCE", "Evidence", "Limits", "State",
           "Tolerance", "beyond", "changed_by", "classify", "family_confidence", "moved_beyond", "same",
           "settle", "tolerance_for", "with_evidence"]

# Every verdict of the instrument is reached here: a stored budget's value or the CI of its median
# (verdict.judge), a head/base ratio's CI over process pairs (verdict.ratio), a count's change from its
# base (ab.merge), a history finding (history.analysis, history.trend). They differ in the estimate and
# its interval, never in the rule; an exact value is an interval of one point.

State = Literal["pass", "stale", "fail", "undecided", "inconclusive", "beyond reach"]
Evidence = Literal["stored", "pairs", "history"]
"""What an interval rests on: a stored check's sample rounds, an A/B check's process pairs, a history
series' chained ratios (:func:`settle`)."""

#: Default relative tolerance per kind, used when a budget gives none.
DEFAULT_TOLERANCE: dict[Kind, float] = {
    "exact": 0.0,
    # Step instruction counts repeat within a few hundredths of a percent across processes
    # (benchmarks/instructions-history-cpu.md); 0.5 % still sees an extra small op per step
    # (benchmarks/instructions-plants-cpu.md).
    "count": 0.005,
    "bytes": 0.02,
    "timing": 0.05,
    "rate": 0.05,
    "energy": 0.10,
}

#: Relative worsening of a low-precision numeric result that fails its budget: a new kernel path moves
#: it less, a loss of precision (bf16 statistics, a block leaving fp32) by multiples.
NUMERIC_TOLERANCE = 0.25

#: Default tolerance of ``step_device_ms``: on an H200 device time repeated within 0.1 % where wall time
#: read 51.2 to 74.4 ms (docs/gpu-runners.md); 2 % stays clear of that and fails a 5 % slowdown.
DEVICE_TIME_TOLERANCE = 0.02

#: A metric's own default tolerance where it differs from its kind's.
METRIC_TOLERANCE: dict[str, float] = {
    "loss_drift": NUMERIC_TOLERANCE,
    "max_abs_error": NUMERIC_TOLERANCE,
    "step_device_ms": DEVICE_TIME_TOLERANCE,
    # One compile per run: a single sample, no interval, so a wide bound.
    "compile_s": 0.5,
}

#: A bytes budget (in MiB) fails only beyond both ``value x (1 + tolerance)`` and ``value + BYTES_FLOOR_MIB``:
#: a 0 budget ("holds nothing") would otherwise fail on one kept scalar (512 B, the CUDA allocator's smallest
#: block); 4 KiB absorbs a few and stays below a test MLP's 32 KiB forward move.
BYTES_FLOOR_MIB = 4 / 1024

#: Relative slack for exact comparisons of values computed in floating point.
EXACT_EPS = 1e-9
#: The tolerance a history series is judged against when none is given: timing's default.
SERIES_TOLERANCE = DEFAULT_TOLERANCE["timing"]
#: The false-alarm rate one test's per-operator timing checks share (:func:`family_confidence`).
FAMILY_ALPHA = 0.05


@dataclass(frozen=True)
class Limits:
    """Beyond ``bad`` an estimate is worse than allowed; beyond ``good`` it beats its reference by
    more than the tolerance (``direction``: ``lower`` is better, or ``higher``)."""

    bad: float
    good: float
    direction: Direction

    @classmethod
    def around(cls, reference: float, tolerance: float, direction: Direction, *, floor: float = 0.0) -> Limits:
        """``reference x (1 +- tolerance)``; a lower-is-better bad limit at least ``floor`` above the
        reference (a bytes budget: :data:`BYTES_FLOOR_MIB`)."""
        if direction == "lower":
            return cls(max(reference * (1 + tolerance), reference + floor), reference * (1 - tolerance), direction)
        return cls(reference * (1 - tolerance), reference * (1 + tolerance), direction)

    def worse(self, x: float) -> bool:
        """Beyond the bad limit (:func:`beyond`)."""
        return beyond(x, self.bad, self.direction)

    def better(self, x: float) -> bool:
        """Beyond the good limit (by more than floating point's last digits)."""
        if same(x, self.good):
            return False
        return x < self.good if self.direction == "lower" else x > self.good


def beyond(x: float, bad: float, direction: Direction) -> bool:
    """``x`` is worse than the limit ``bad`` by more than floating point's last digits."""
    slack = EXACT_EPS * max(abs(bad), 1e-12)
    return x > bad + slack if direction == "lower" else x < bad - slack


def same(a: float, b: float) -> bool:
    """``a`` and ``b`` differ by no more than floating point's last digits."""
    return a == b or math.isclose(a, b, rel_tol=EXACT_EPS, abs_tol=1e-12)


def moved_beyond(change: float, tolerance: float) -> bool:
    """A relative change, either way, beyond a relative ``tolerance`` by more than floating point's last
    digits (a per-step average of counts is a float)."""
    return abs(change) > tolerance + EXACT_EPS


def changed_by(delta: float, base: float, *, least: float, share: float) -> bool:
    """A change ``delta`` from ``base`` large enough to name: at least ``least`` and ``share`` of the base."""
    return abs(delta) >= max(least, share * abs(base))


def classify(lo: float, hi: float, limits: Limits, *, final: bool = True) -> State:
    """The state of an estimate whose interval is ``lo``-``hi`` (an exact value: ``lo == hi``);
    straddling the bad limit, ``undecided`` while not ``final``, else ``inconclusive``."""
    best, worst = (lo, hi) if limits.direction == "lower" else (hi, lo)
    if limits.worse(best):
        return "fail"
    if not limits.worse(worst):
        return "stale" if limits.better(worst) else "pass"
    return "inconclusive" if final else "undecided"


def settle(lo: float, hi: float, limits: Limits, *, evidence: Evidence, estimate: float | None = None,
           reference: float = 1.0) -> State:
    """The final state of an interval, with no more evidence to come; one ending per kind of evidence for
    an interval that still straddles the bad limit:

    - ``stored``: decided on the point ``estimate`` (the median of every round): a stored budget
      already took its extra rounds, and a budget is a stated bound, not a comparison;
    - ``pairs``: ``inconclusive``, never decided on the estimate: inside a straddling interval it is no
      evidence either way, and deciding on it would fail pull requests or wave regressions through by
      chance;
    - ``history``: a ``fail`` when the interval lies entirely worse than ``reference`` (no change) and
      the ``estimate`` is beyond the bad limit (a cumulative ratio over many merges), else
      ``inconclusive``.
    """
    state = classify(lo, hi, limits)
    if state != "inconclusive" or evidence == "pairs":
        return state
    assert estimate is not None, f"{evidence} evidence ends a straddle on its estimate"
    if evidence == "history":
        changed = classify(lo, hi, Limits(reference, reference, limits.direction)) == "fail"
        return "fail" if changed and limits.worse(estimate) else "inconclusive"
    return "fail" if limits.worse(estimate) else "pass"


def with_evidence(state: State, *, n: int, least: int, final: bool, reachable: bool = True) -> State:
    """``state`` once its evidence is counted (``n`` pieces: process pairs).

    With fewer than ``least`` a check stays undecided while more can come, whatever its interval
    (a first pair may be one side's start-up luck), and is inconclusive at the end (a run stopped for
    time after one pair passes nothing on it). A failure needs one piece more than ``least``, as a
    stored failure is confirmed by a fresh round: without it, undecided, and inconclusive at the end.
    An undecided check with two pieces or more that the evidence still to come would not decide at
    the spread it shows (``reachable`` false) is ``beyond reach``: no more is spent on it.
    """
    if n < least:
        return "inconclusive" if final else "undecided"
    if state == "fail" and n <= least:
        return "inconclusive" if final else "undecided"
    if state == "undecided" and n >= 2 and not reachable:
        return "beyond reach"
    return state


def family_confidence(metric: str, confidence: float, alpha: float, size: int) -> float:
    """The CI coverage of ``metric``'s check: for one of ``size`` per-operator timing checks of one
    test, Bonferroni (together they false-alarm at most ``alpha``); else ``confidence``.

    The family is the test, in stored and A/B runs alike, not the suite: a test's operators answer
    one question (did this step's operators move?), while a suite-wide family would make every
    operator check's sensitivity depend on how many other tests exist, so a pull request adding a
    test would blunt the checks of all the others.
    """
    if size <= 1 or family_of(metric) not in OP_TIMED_FAMILIES:
        return confidence
    return max(confidence, 1.0 - alpha / size)


class _BudgetLike(Protocol):
    """What the chooser reads of a budget (a loaded :class:`~perfbudget.budgets.schema.Budget` or a
    record's :class:`~perfbudget.results.BudgetRef`)."""

    @property
    def tolerance(self) -> float: ...
    @property
    def ab_tolerance(self) -> float | None: ...
    @property
    def source(self) -> str: ...
    @property
    def line(self) -> int | None: ...


@dataclass(frozen=True)
class Tolerance:
    """The relative change a check accepts in the bad direction, and where it came from."""

    value: float
    origin: str | _BudgetLike
    """What :attr:`source` names: a text, or the budget it was read from."""

    @property
    def source(self) -> str:
        """``budgets/cpu.yaml:12``, ``default for timing`` or ``measured spread (...)`` (a budget's
        place is found only when asked: most callers want the value)."""
        o = self.origin
        return o if isinstance(o, str) else shown_path(o.source, o.line)


def tolerance_for(metric: Metric | None, budget: _BudgetLike | None = None, *,
                  against: Literal["budget", "base"] = "budget", from_budgets: bool = True,
                  measured: tuple[float, str] | None = None) -> Tolerance:
    """The tolerance a check is judged with: the one place it is chosen.

    - Against its budget: the budget's ``tolerance`` (the metric's default when the file gives
      none), else the metric's default.
    - Against the base (A/B), a statistical check: the budget's ``ab_tolerance`` when it sets one
      (and ``from_budgets``), else the metric's default; the stored ``tolerance`` may carry a floor
      for the noise between runs in different processes, which taking turns removes.
    - Against the base, a count or a low-precision numeric result: its spread between A/A sides on
      this machine when measured (``measured``: the tolerance and where it was measured), else as
      against its budget (a stated bound, not the last digit).

    A metric this version does not know (``None``, from another version's results) is judged as timing.
    """
    if metric is None:
        default = Tolerance(DEFAULT_TOLERANCE["timing"], "default for an unknown metric (timing's)")
        return Tolerance(budget.tolerance, budget) if budget is not None else default
    value = METRIC_TOLERANCE.get(metric.name, DEFAULT_TOLERANCE[metric.kind])
    default = Tolerance(value, f"default for {metric.kind}")
    if against == "base" and metric.statistical:
        if budget is not None and budget.ab_tolerance is not None and from_budgets:
            return Tolerance(budget.ab_tolerance, budget)
        return default
    if against == "base" and measured is not None:
        return Tolerance(measured[0], f"measured spread ({measured[1]})")
    return Tolerance(budget.tolerance, budget) if budget is not None else default
