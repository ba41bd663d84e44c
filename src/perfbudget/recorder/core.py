"""The recorder's primitive: judge one measurement under the test's budget key and keep the verdict."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar

from ..measure.measurement import Explanation, Measurement
from ..measure.memory import ALLOCATION, allocation
from ..measure.reference import machine_reference
from ..measure.timing import bench, bench_paired
from ..metrics import UnknownMetricError, parse_name
from ..verdict.judge import Judge, Verdict
from ..vocabulary import Outcome

__all__ = ["RecorderCore", "Timed", "explainer"]


@dataclass(frozen=True)
class Timed:
    """One timed batch: samples and, when timed alternately with a reference, its times."""

    samples_ms: list[float]
    ref_ms: list[float] | None = None


samples_ms = attrgetter("samples_ms")
ref_ms = attrgetter("ref_ms")


def explainer(explain: Callable[[], Sequence[str]] | None) -> Callable[[], Explanation] | None:
    """A caller's ``explain`` (attribution lines) as a measurement's explainer."""
    return None if explain is None else lambda: Explanation(lines=tuple(explain()))


class RecorderCore:
    """What every measurement family stands on: the judge, the kept verdicts, the timer.

    Args:
        judge: decides each metric against the budgets (it knows key, device, budgets).
        nodeid: the test's id (for records and the update command).
        update_command: the command that creates missing budgets, for skip messages.
        threads: torch threads for CPU timing (``None``: leave the process's setting).
        lease: lease-sized work (:mod:`perfbudget.lease`): fewer rounds where a family's default has them.
    """

    #: Base names of the registered metrics this family records; each has one owner (tests/test_recorder.py).
    METRICS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, judge: Judge, *, nodeid: str = "", update_command: str = "", threads: int | None = 1,
                 lease: bool = False) -> None:
        self.judge = judge
        self.lease = lease
        self.nodeid = nodeid
        self.update_command = update_command
        self.threads = threads
        self.verdicts: list[Verdict] = []
        self.extras: dict[str, dict[str, Any]] = {}
        self.failure_step: Callable[[], Any] | None = None
        """Re-run for failure artifacts if the test fails: :meth:`on_failure`'s, or the first timed step."""

    @property
    def key(self) -> str:
        return self.judge.key

    @property
    def device(self) -> Any:
        return self.judge.device

    @property
    def update(self) -> bool:
        return self.judge.config.judging.writes_budgets

    @property
    def _dev(self) -> Any:
        return self.judge.device.type

    def budgeted(self) -> dict[str, Any]:
        """Every metric budgeted for this key on this device (empty when budgets are broken)."""
        return self.judge.budgeted()

    def on_failure(self, step: Callable[[], Any]) -> None:
        """Re-run ``step`` for failure artifacts if this test fails (replaces the timed step)."""
        if not callable(step):
            raise TypeError(f"on_failure expects a zero-argument callable, got {step!r}")
        self.failure_step = step

    def _fails_with(self, step: Callable[[], Any]) -> None:
        """The first timed step is the one re-run for failure artifacts, unless :meth:`on_failure` chose."""
        if self.failure_step is None:
            self.failure_step = step

    def record(
        self,
        metric: str,
        samples: float | Sequence[float],
        *,
        more: Callable[[], Any] | None = None,
        reference: Sequence[float] | None = None,
        attribution: Sequence[str] = (),
        explain: Callable[[], Sequence[str]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Verdict:
        """Judge ``samples`` of ``metric`` against this key's budget and keep the verdict.

        Args:
            metric: registered metric name (``step_ms``, ``op_self_ms[aten::mm]``).
            samples: one value (exact kinds) or raw samples (statistical kinds).
            more: returns a fresh batch of samples (with ``reference``: a ``(samples, reference)`` pair).
            reference: machine-speed reference times paired with ``samples``.
            attribution: readable lines explaining the measurement (shown on failure).
            explain: called only when the verdict fails; returns attribution lines.
            extra: JSON-serialisable data kept with the record (see :mod:`perfbudget.extras`).

        Returns:
            The verdict; its outcome is also applied to the test when it ends.
        """
        return self._record(metric, Measurement(samples=samples, reference=reference, fresh=more,
                                                explainer=explainer(explain), attribution=tuple(attribution),
                                                extra=extra or {}))

    def unmeasurable(self, metric: str, reason: str) -> Verdict:
        """Note that ``metric`` cannot be measured here (e.g. no energy counter), with why."""
        return self._keep(Verdict(key=self.key, metric=metric, outcome=Outcome.UNMEASURABLE, reason=reason), {})

    def _record(self, metric: str, m: Measurement) -> Verdict:
        """Judge a measurement of ``metric`` and keep the verdict, explained when it fails."""
        try:
            name = parse_name(metric)
        except UnknownMetricError as exc:
            return self._keep(Verdict(key=self.key, metric=str(metric), outcome=Outcome.ERROR, reason=str(exc)), m.extra)
        v = self.judge.judge(name, m.samples, more=m.more if m.repeatable else None, reference=m.reference)
        attribution, extra = m.attribution, dict(m.extra)
        if v.outcome == Outcome.FAIL:
            why = m.explain()
            attribution, extra = (*attribution, *why.lines), {**extra, **why.extra}
        if attribution:
            v = v.with_(attribution=tuple(attribution))
        return self._keep(v, extra)

    def _keep(self, v: Verdict, extra: Mapping[str, Any]) -> Verdict:
        self.verdicts.append(v)
        if extra:
            self.extras[v.metric] = dict(extra)
        return v

    def _allocation(self, v: Verdict, fn: Callable[[], Any]) -> Verdict:
        """Keep what one call of the warm ``fn`` allocates beside its timing verdict ``v``."""
        if v.outcome not in (Outcome.ERROR, Outcome.UNMEASURABLE):
            got = allocation(fn, device=self._dev, calls=1, threads=self._timing_threads())
            self.extras.setdefault(v.metric, {})[ALLOCATION] = got.to_extra()
        return v

    def _timing_threads(self) -> int | None:
        return self.threads if self._dev == "cpu" else None

    def _reference(self, reference: Callable[[], Any] | bool | None) -> Callable[[], Any] | None:
        if reference is True:
            return machine_reference(self._dev)
        if reference is False or reference is None:
            return None
        if not callable(reference):
            raise TypeError(f"reference must be True, None or a callable, got {reference!r}")
        return reference

    def _timer(self, fn: Callable[[], Any], reference: Callable[[], Any] | bool | None,
               **kw: Any) -> Callable[[], Timed]:
        """One timed batch of ``fn`` per call: plain, or alternating with the reference."""
        kw.setdefault("device", self._dev)
        kw.setdefault("threads", self._timing_threads())
        ref = self._reference(reference)
        if ref is None:
            return lambda: Timed(list(bench(fn, **kw).samples_ms))

        def paired() -> Timed:
            a, b = bench_paired(fn, ref, **kw)
            return Timed(list(a.samples_ms), list(b.samples_ms))

        return paired
