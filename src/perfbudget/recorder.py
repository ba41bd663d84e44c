"""Per-test recording of measurements under a budget key, and the test's resulting outcome."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .budgets.loader import BudgetSet
from .budgets.schema import Budget, BudgetError
from .budgets.verdict import Verdict, VerdictPolicy, decide
from .device import DeviceInfo
from .measure.stats import median
from .metrics import UnknownMetricError, parse_name
from .report import fmt_value, records_table
from .results import Record

__all__ = ["Decision", "PerfRecorder"]

#: Families whose many per-operator checks share one false-alarm budget (Bonferroni).
_OP_FAMILIES = ("op_self_ms", "op_share")
_FAMILY_ALPHA = 0.05
#: Beyond this relative change of the machine-speed reference against the budget's, the
#: machine is not the one the budget describes: timing checks are not judged.
REFERENCE_MISMATCH = 0.30


@dataclass(frozen=True)
class Decision:
    """What a test's recorded verdicts mean for the test: pass, skip or fail, with the text."""

    outcome: Literal["pass", "skip", "fail"]
    message: str = ""


@dataclass
class PerfRecorder:
    """Records a test's measurements under its budget key and judges them.

    Made by the ``perf`` fixture; usable without pytest (pass ``budgets`` and
    ``device``). Each :meth:`record` decides at once, so a statistical check can
    take more samples or confirm a failure through its ``more`` callback.

    Attributes:
        key: workload key of the budgets.
        device: the device measured.
        budgets: the loaded budget set.
        nodeid: the test's id (for records and the update command).
        strict: stale and unbudgeted become failures.
        update: the run is writing budgets: budget verdicts don't fail the test.
        policy: statistical settings.
        update_command: the command that creates missing budgets, for skip messages.
        preflight: reasons timing cannot be trusted right now (busy CPU, shared or
            throttled GPU): statistical checks are then recorded as unmeasurable.
        failure_step: the step re-run for failure artifacts (chrome trace, flame graph,
            CUDA memory snapshot) if the test fails; set by :meth:`on_failure`, or by
            :meth:`time` with the step it timed.
    """

    key: str
    device: DeviceInfo
    budgets: BudgetSet
    nodeid: str = ""
    strict: bool = False
    update: bool = False
    policy: VerdictPolicy = field(default_factory=VerdictPolicy)
    update_command: str = ""
    preflight: tuple[str, ...] = ()
    verdicts: list[Verdict] = field(default_factory=list)
    unmeasured: list[tuple[str, str]] = field(default_factory=list)
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)
    failure_step: Callable[[], Any] | None = None

    def on_failure(self, step: Callable[[], Any]) -> None:
        """Re-run ``step`` for failure artifacts if this test fails (replaces the timed step)."""
        if not callable(step):
            raise TypeError(f"on_failure expects a zero-argument callable, got {step!r}")
        self.failure_step = step

    def budget(self, metric: str) -> Budget | None:
        """The budget that applies to ``metric`` here, or ``None``."""
        try:
            return self.budgets.resolve(self.key, metric, self.device)
        except BudgetError:
            return None

    def _policy_for(self, metric: str) -> VerdictPolicy:
        family = metric.split("[", 1)[0]
        if family not in _OP_FAMILIES:
            return self.policy
        n = sum(
            1 for m in self.budgets.budgets_for(self.key, self.device) if m.split("[", 1)[0] in _OP_FAMILIES
        ) if not self.budgets.errors_for(self.key, self.device) else 1
        if n <= 1:
            return self.policy
        conf = max(self.policy.confidence, 1.0 - _FAMILY_ALPHA / n)
        return VerdictPolicy(confidence=conf, max_extra_rounds=self.policy.max_extra_rounds,
                             confirm=self.policy.confirm)

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
            more: returns a fresh batch of samples, for extra rounds and confirmation
                (with ``reference``: a ``(samples, reference)`` pair).
            reference: machine-speed reference times paired with ``samples`` (see
                :func:`perfbudget.measure.timing.bench_paired`). Each sample is then
                expressed at the budget's reference time (provenance ``ref_ms``; for a
                new budget, this run's median reference): ``x * ref_ms / r`` for times,
                ``x * r / ref_ms`` for rates. Host drift cancels; the code's changes stay.
            attribution: readable lines explaining the measurement (shown on failure).
            explain: called only when the verdict fails; returns attribution lines
                (e.g. which operators moved), so passing runs pay nothing for it.
            extra: JSON-serialisable data kept with the record (tables, per-bucket numbers).

        Returns:
            The verdict; its outcome is also applied to the test when it ends.
        """
        base = Verdict(key=self.key, metric=metric, outcome="error")
        try:
            parse_name(metric)
        except UnknownMetricError as exc:
            return self._keep(base.with_(reason=str(exc)), extra)
        problem = ""
        budget = None
        errors = self.budgets.errors_for(self.key, self.device)
        if errors:
            more_n = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            problem = f"budget file error: {errors[0]}{more_n}"
        else:
            try:
                budget = self.budgets.resolve(self.key, metric, self.device)
            except BudgetError as exc:
                problem = str(exc)
        if problem:
            # Keep what was measured, so a broken budget file loses no data.
            v = decide(self.key, metric, samples, None, policy=self.policy)
            return self._keep(v.with_(outcome="error", reason=problem), extra)
        if self.preflight and parse_name(metric).metric.statistical:
            v = decide(self.key, metric, samples, None, policy=self.policy)
            reason = "preflight: " + "; ".join(self.preflight)
            return self._keep(v.with_(outcome="unmeasurable", budget=budget, reason=reason), extra)
        ref_ms: float | None = None
        if reference is not None:
            mismatch = self._reference_mismatch(reference, budget)
            if mismatch:
                v = decide(self.key, metric, samples, None, policy=self.policy)
                return self._keep(v.with_(outcome="unmeasurable", budget=budget, reason=mismatch), extra)
            samples, more, ref_ms = self._normalised(metric, samples, reference, more, budget)
        v = decide(self.key, metric, samples, budget, more=more, policy=self._policy_for(metric))
        if ref_ms is not None:
            v = v.with_(ref_ms=ref_ms)
        if explain is not None and v.outcome == "fail":
            try:
                attribution = (*attribution, *explain())
            except Exception as exc:  # attribution must never hide the verdict itself
                attribution = (*attribution, f"attribution failed: {type(exc).__name__}: {exc}")
        if attribution:
            v = v.with_(attribution=tuple(attribution))
        return self._keep(v, extra)

    @staticmethod
    def _reference_mismatch(reference: Sequence[float], budget: Budget | None) -> str:
        """Why this machine is not the one the budget describes, judged by the reference."""
        prov = budget.provenance if budget is not None else None
        if prov is None or not prov.ref_ms or not reference:
            return ""
        now = median(reference)
        change = now / prov.ref_ms - 1
        if abs(change) <= REFERENCE_MISMATCH:
            return ""
        return (
            f"preflight: the machine-speed reference ran {now:.3g} ms here vs {prov.ref_ms:.3g} ms when the "
            f"budget was measured ({change:+.0%}): a different or busier machine than the budget describes"
        )

    @staticmethod
    def _normalised(
        metric: str,
        samples: float | Sequence[float],
        reference: Sequence[float],
        more: Callable[[], Any] | None,
        budget: Budget | None,
    ) -> tuple[list[float], Callable[[], Sequence[float]] | None, float]:
        xs = [samples] if isinstance(samples, (int, float)) else list(samples)
        if len(xs) != len(reference) or not reference or min(reference) <= 0:
            raise ValueError(f"{metric}: reference must pair one positive time with each sample")
        prov = budget.provenance if budget is not None else None
        frame = prov.ref_ms if prov is not None and prov.ref_ms else median(reference)
        higher = parse_name(metric).metric.direction == "higher"

        def scale(values: Sequence[float], refs: Sequence[float]) -> list[float]:
            if higher:
                return [x * r / frame for x, r in zip(values, refs, strict=True)]
            return [x * frame / r for x, r in zip(values, refs, strict=True)]

        more_n = None
        if more is not None:
            def more_n() -> list[float]:
                fresh, refs = more()
                return scale(fresh, refs)

        return scale(xs, reference), more_n, frame

    def budgeted(self) -> dict[str, Budget]:
        """Every metric budgeted for this key on this device (empty when budgets are broken)."""
        if self.budgets.errors_for(self.key, self.device):
            return {}
        try:
            return self.budgets.budgets_for(self.key, self.device)
        except BudgetError:
            return {}

    def time(
        self,
        metric: str,
        fn: Callable[[], Any],
        *,
        reference: Callable[[], Any] | None = None,
        explain: Callable[[], Sequence[str]] | None = None,
        **bench_kwargs: Any,
    ) -> Verdict:
        """Time ``fn`` and record ``metric`` in ms; extra rounds and confirmation re-run it.

        Args:
            metric: a millisecond timing metric (``step_ms``, ``latency_ms[forward]``).
            fn: zero-argument callable, warm or not (the bench warms it up).
            reference: a fixed machine-speed reference workload timed alternately with
                ``fn`` (:func:`~perfbudget.measure.timing.bench_paired`); samples are
                normalised by it (see :meth:`record`). ``None``: plain
                :func:`~perfbudget.measure.timing.bench`.
            explain: attribution lines computed only on failure (see :meth:`record`).
            bench_kwargs: passed to the bench (``warmup_ms``, ``min_samples``, ``threads``...).
        """
        from .measure.timing import bench, bench_paired

        if self.failure_step is None:
            self.failure_step = fn
        if reference is None:

            def sample() -> list[float]:
                return list(bench(fn, **bench_kwargs).samples_ms)

            return self.record(metric, sample(), more=sample, explain=explain)

        def pair() -> tuple[list[float], list[float]]:
            a, b = bench_paired(fn, reference, **bench_kwargs)
            return list(a.samples_ms), list(b.samples_ms)

        first, refs = pair()
        return self.record(metric, first, reference=refs, more=pair, explain=explain)

    def unmeasurable(self, metric: str, reason: str) -> None:
        """Note that ``metric`` cannot be measured here (e.g. no energy counter), with why."""
        self.unmeasured.append((metric, reason))
        self.verdicts.append(Verdict(key=self.key, metric=metric, outcome="unmeasurable", reason=reason))

    def _keep(self, v: Verdict, extra: dict[str, Any] | None) -> Verdict:
        self.verdicts.append(v)
        if extra:
            self.extras[v.metric] = extra
        return v

    def records(self) -> list[Record]:
        """JSON records of every verdict, with attribution filled in for failures."""
        att = self._moved_operators()
        out = []
        for v in self.verdicts:
            if v.outcome == "fail" and not v.attribution and att and not v.metric.startswith(_OP_FAMILIES):
                v = v.with_(attribution=tuple(att))
            out.append(Record.from_verdict(v, nodeid=self.nodeid, device=self.device, extra=self.extras.get(v.metric)))
        return out

    def _moved_operators(self, k: int = 5) -> list[str]:
        """Per-operator verdicts of this test, largest relative move first: where the time went."""
        ops = [v for v in self.verdicts if v.metric.startswith(_OP_FAMILIES) and v.ratio is not None]
        ops.sort(key=lambda v: -(v.ratio or 0.0))
        lines = []
        for v in ops[:k]:
            unit = v.info.unit
            assert v.budget is not None and v.ratio is not None
            lines.append(
                f"{v.metric}: {fmt_value(v.value, unit)} vs budget {fmt_value(v.budget.value, unit)} "
                f"({v.ratio - 1:+.1%}, {v.outcome})"
            )
        return lines

    def decision(self) -> Decision:
        """What the recorded verdicts mean for the test."""
        if not self.verdicts:
            return Decision("fail", f"{self.key}: the test used `perf` but recorded no measurement")
        failing = {"error"}
        if not self.update:
            failing.add("fail")
            if self.strict:
                failing |= {"stale", "unbudgeted"}
        records = self.records()
        preflighted = [r for r in records if r.outcome == "unmeasurable" and r.reason.startswith("preflight:")]
        bad = [r for r in records if r.outcome in failing]
        if self.strict and not self.update:
            bad += preflighted
        if bad:
            return Decision("fail", self._failure_text(records, bad))
        if preflighted:
            others = [r.metric for r in records if r not in preflighted]
            ran = f"; checked anyway: {', '.join(others)}" if others else ""
            return Decision(
                "skip",
                f"timing checks of {self.key} not judged ({', '.join(r.metric for r in preflighted)}): "
                f"{preflighted[0].reason}{ran}",
            )
        unbudgeted = [r.metric for r in records if r.outcome == "unbudgeted"]
        if unbudgeted and not self.update:
            return Decision(
                "skip",
                f"unbudgeted: {self.key} has no budget for {', '.join(unbudgeted)} on {self.device.label}; "
                f"create it with: {self.update_command or 'pytest --update-budgets'}",
            )
        if self.unmeasured and len(self.unmeasured) == len(self.verdicts):
            return Decision("skip", "; ".join(f"{m} unmeasurable: {why}" for m, why in self.unmeasured))
        return Decision("pass")

    def _failure_text(self, records: list[Record], bad: list[Record]) -> str:
        lines = [f"perf budget check failed: {self.key} on {self.device.label}", "", records_table(records), ""]
        for r in bad:
            where = ""
            if r.budget:
                where = f" [{r.budget['source']}" + (f":{r.budget['line']}" if r.budget.get("line") else "") + "]"
            lines.append(f"{r.metric}: {r.outcome}: {r.reason}{where}")
            lines.extend(f"    {a}" for a in r.attribution)
        stale = [r.metric for r in records if r.outcome == "stale"]
        if stale:
            lines.append(f"stale (better than budget): {', '.join(stale)}; ratchet with --update-budgets")
        return "\n".join(lines)
