"""What a test measured, collected under its budget key: the public measuring API behind ``perf``.

Every method builds a :class:`~perfbudget.measure.measurement.Measurement` through
:mod:`perfbudget.measure` (whose timers take turns in a lockstep A/B run) and records it: the
:class:`~perfbudget.judge.Judge` decides and the verdict is kept. Usable without pytest:
``PerfRecorder(Judge(key, device, budgets))``.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Literal

from .budgets.schema import Budget
from .budgets.verdict import Verdict
from .extras import InstructionProfile, OperatorMoves
from .judge import Decision, Judge
from .measure import compile_health, energy, instructions, memory, numerics, nvml, occupancy, stats
from .measure.measurement import Explanation, Measurement, Passes
from .measure.operators import (
    OpMove,
    OpRounds,
    count_flops,
    profile_rounds,
    profile_steps,
)
from .measure.reference import machine_reference
from .measure.timing import bench, bench_paired, time_streams
from .measure.unmeasurable import Unmeasurable
from .metrics import OP_METRIC_FAMILIES, UnknownMetricError, op_metric, parse_name
from .results import Record
from .vocabulary import Outcome

__all__ = ["NEW_OP_SHARE_CHECK", "NEW_OP_SHARE_UPDATE", "OP_ROUNDS", "OP_ROUND_STEPS", "SERVE_ROUNDS", "CountedSteps",
           "PerfRecorder", "ServeRound"]

#: Profiled rounds behind each per-operator sample set (one sample per round, of
#: :data:`OP_ROUND_STEPS` steps). A round's self times vary ~10 % as a whole whether it profiles
#: one step or eight, and each profiled step costs ~10x the step (the profiler's events): twice
#: the rounds of one step each take the time of 16 rounds of two and halve a pair's sampling
#: variance (benchmarks/op-pairing-cpu.md).
OP_ROUNDS = 32
OP_ROUND_STEPS = 1
#: Rounds of requests behind each serving sample set. One round of 64 requests left a pair's
#: median per-request ratio uncertain by 3-5 % (its own sampling, a user's tiny GPT-2:
#: benchmarks/user-repo-cpu.md), as much as the pairs differed.
SERVE_ROUNDS = 4
#: Operators above this share of the step get budgets when budgets are written...
NEW_OP_SHARE_UPDATE = 0.05
#: ...and a new operator must pass this share before a check run calls it unbudgeted.
#: The gap keeps an operator hovering at 5 % from flipping between runs.
NEW_OP_SHARE_CHECK = 0.07
#: A failing step is explained by the operators above this share of it, with the budgeted ones.
_EXPLAIN_MIN_SHARE = 0.02
_SERVE_METRICS = ("ttft_ms", "token_ms", "e2e_ms_p50", "e2e_ms_p90", "tokens_per_s")

@dataclass(frozen=True, kw_only=True)
class ServeRound:
    """Latencies of one sample set of streamed requests (its rounds in order), each paired with its reference time."""

    samples: dict[str, tuple[list[float], list[float]]]
    """metric -> (samples, paired machine-speed reference times)."""


@dataclass(frozen=True, kw_only=True)
class CountedSteps:
    """:meth:`PerfRecorder.step` counts instructions instead of timing: ``steps`` counted calls
    after ``warmup`` uncounted ones, as :meth:`PerfRecorder.instructions` counts them.

    The pytest plugin sets it for a test marked ``instructions`` (``@pytest.mark.instructions``,
    or ``@pytest.mark.instructions(steps=..., warmup=...)``) in a session that runs under
    callgrind (``perfbudget instructions``, ``perfbudget ab --instructions``), where timing
    would measure valgrind's synthetic CPU.
    """

    steps: int = 20
    warmup: int = 10

    def __post_init__(self) -> None:
        for name, least in (("steps", 1), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True)
class _Timed:
    """One timed batch: samples and, when timed alternately with a reference, its times."""

    samples_ms: list[float]
    ref_ms: list[float] | None = None


_samples_ms = attrgetter("samples_ms")
_ref_ms = attrgetter("ref_ms")


def _itself(xs: list[float]) -> list[float]:
    return xs


def _explainer(explain: Callable[[], Sequence[str]] | None) -> Callable[[], Explanation] | None:
    """A caller's ``explain`` (attribution lines) as a measurement's explainer."""
    return None if explain is None else lambda: Explanation(lines=tuple(explain()))


class PerfRecorder:
    """Records a test's measurements under its budget key.

    Args:
        judge: decides each metric against the budgets (it knows key, device, budgets).
        nodeid: the test's id (for records and the update command).
        update_command: the command that creates missing budgets, for skip messages.
        threads: torch threads for CPU timing (``None``: leave the process's setting).
        counted_steps: :meth:`step` counts instructions instead of timing (see :class:`CountedSteps`).
    """

    def __init__(self, judge: Judge, *, nodeid: str = "", update_command: str = "", threads: int | None = 1,
                 counted_steps: CountedSteps | None = None) -> None:
        self.judge = judge
        self.nodeid = nodeid
        self.update_command = update_command
        self.threads = threads
        self.counted_steps = counted_steps
        self.verdicts: list[Verdict] = []
        self.extras: dict[str, dict[str, Any]] = {}
        self.failure_step: Callable[[], Any] | None = None
        """Re-run for failure artifacts (chrome trace, flame graph, memory snapshot) if the
        test fails; set by :meth:`on_failure`, or by the first timed step."""

    # -- what is being judged ---------------------------------------------------------------

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

    # -- the primitive --------------------------------------------------------------------

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
                :func:`perfbudget.measure.timing.bench_paired`).
            attribution: readable lines explaining the measurement (shown on failure).
            explain: called only when the verdict fails; returns attribution lines
                (e.g. which operators moved), so passing runs pay nothing for it.
            extra: JSON-serialisable data kept with the record (see :mod:`perfbudget.extras`).

        Returns:
            The verdict; its outcome is also applied to the test when it ends.
        """
        return self._record(metric, Measurement(samples=samples, reference=reference, fresh=more,
                                                explainer=_explainer(explain), attribution=tuple(attribution),
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

    # -- timing ---------------------------------------------------------------------------

    def time(
        self,
        metric: str,
        fn: Callable[[], Any],
        *,
        reference: Callable[[], Any] | bool | None = None,
        explain: Callable[[], Sequence[str]] | None = None,
        **bench_kwargs: Any,
    ) -> Verdict:
        """Time ``fn`` and record ``metric`` in ms; extra rounds and confirmation re-run it.

        Args:
            metric: a millisecond timing metric (``step_ms``, ``latency_ms[forward]``).
            fn: zero-argument callable, warm or not (the bench warms it up).
            reference: ``True`` for the device's machine-speed reference
                (:func:`perfbudget.measure.reference.machine_reference`), or a reference
                callable, timed alternately with ``fn``; samples are normalised by it.
                ``None``: plain :func:`~perfbudget.measure.timing.bench`.
            explain: attribution lines computed only on failure (see :meth:`record`).
            bench_kwargs: passed to the bench (``warmup_ms``, ``min_samples``, ``max_ms``...).
        """
        self._fails_with(fn)
        passes = Passes(self._timer(fn, reference, **bench_kwargs))
        return self._record(metric, passes.measurement(_samples_ms, reference=_ref_ms, explain=_explainer(explain)))

    def step(
        self,
        step: Callable[[], Any],
        *,
        samples_per_step: int,
        reference: Callable[[], Any] | bool | None = None,
        explain_operators: bool = True,
        min_samples: int = 40,
        max_ms: float = 2000,
        warmup_ms: float = 100,
    ) -> tuple[Verdict, ...]:
        """Record ``step_ms`` and ``throughput_samples_per_s`` of a warm training/inference step.

        Unprofiled samples (CUDA events on a GPU). A failing step time is explained by
        profiling the step against the key's ``op_self_ms`` budgets (which operators moved).

        Reference normalisation is opt-in (``reference=True``): it absorbs part of a real
        slowdown along with the machine's drift, while the machines that keep stored budgets
        (a pinned runner of one SKU) drift little; a drifting machine should use
        ``perfbudget ab`` instead.

        Instruction counts, opt-in: in a test marked ``instructions`` (``@pytest.mark.instructions``,
        or ``@pytest.mark.instructions(steps=20, warmup=10)``), a session under callgrind
        (``perfbudget instructions -- <tests> -m instructions``, ``perfbudget ab --base REF
        --instructions -- <tests> -m instructions``) counts the step instead of timing it: it records
        ``instructions[callgrind]`` under the same key, exactly as :meth:`instructions` does
        (``steps`` counted calls after ``warmup`` uncounted ones), and no timing metric, since a
        time on valgrind's synthetic CPU means nothing; the session does not report the key's
        timing budgets as not measured either. Every other session times the marked step as
        usual. So one test gives a step both channels: time, and the CPU work that decides a
        change timing cannot resolve (a dropped cache, a few % more Python per step).

        Args:
            step: one full step (zero-argument callable).
            samples_per_step: samples per step, for samples/s.
            reference: as in :meth:`time` (default: none).
            explain_operators: profile the step on failure to name the operators that moved.
            min_samples, max_ms, warmup_ms: as in :func:`~perfbudget.measure.timing.bench`.

        Returns:
            The ``(step_ms, throughput_samples_per_s)`` verdicts; both read the same timed batches.
            When the step is counted instead: the one ``instructions[callgrind]`` verdict.
        """
        if samples_per_step < 1:
            raise ValueError(f"samples_per_step must be >= 1, got {samples_per_step!r}")
        if self.counted_steps is not None:
            counted = self.counted_steps
            return (self.instructions(step, steps=counted.steps, warmup=counted.warmup, counter="callgrind"),)
        self._fails_with(step)
        passes = Passes(self._timer(step, reference, min_samples=min_samples, max_ms=max_ms, warmup_ms=warmup_ms))

        def rate(t: _Timed) -> list[float]:
            return [samples_per_step * 1e3 / x for x in t.samples_ms]

        explain = self._operator_explanation(step) if explain_operators else None
        return (self._record("step_ms", passes.measurement(_samples_ms, reference=_ref_ms, explain=explain)),
                self._record("throughput_samples_per_s", passes.measurement(rate, reference=_ref_ms)))

    def speedup(
        self,
        what: str,
        baseline: Callable[[], Any],
        lever: Callable[[], Any],
        *,
        rounds: int = 6,
        attribution: Sequence[str] = (),
    ) -> Verdict:
        """Record ``speedup[what]``: time of ``baseline`` / time of ``lever``, interleaved.

        The two run alternately (``baseline, lever, baseline, ...``), so the machine's
        drift hits both; each round gives one ratio.

        Args:
            what: the bracket argument (``speedup[bucketing]``).
            baseline, lever: zero-argument callables doing the same work two ways (e.g. one
                epoch with static padding and one with length buckets).
            rounds: ratios per sample set (one warm-up round runs first).
        """
        if rounds < 2:
            raise ValueError(f"rounds must be >= 2, got {rounds!r}")

        def ratios() -> list[float]:
            a, b = bench_paired(baseline, lever, device=self._dev, threads=self._timing_threads(), warmup_ms=0,
                                min_samples=rounds, max_ms=0, min_warmup_calls=1)
            return [x / y for x, y in zip(a.samples_ms, b.samples_ms, strict=True)]

        return self._record(f"speedup[{what}]", Passes(ratios).measurement(_itself, attribution=attribution))

    def serve(
        self,
        requests: Callable[[], Iterable[Callable[[], Iterable[Any]]]],
        *,
        reference: Callable[[], Any] | bool | None = None,
        rounds: int = SERVE_ROUNDS,
    ) -> dict[str, Verdict]:
        """Record serving latencies of streamed requests: ``ttft_ms``, ``token_ms``,
        ``e2e_ms_p50``, ``e2e_ms_p90`` and ``tokens_per_s``.

        Args:
            requests: returns one round of requests, each a callable that starts the
                request and returns its tokens as they are produced (a generator). A round
                should hold >= 64 requests so a p90 has samples above it.
            reference: as in :meth:`time` (default: none); timed after every request, and
                every latency is paired with its request's reference time.
            rounds: rounds of requests per sample set (``requests()`` called once per round);
                an A/B run pairs each request with itself on the other side, round by round.

        Returns:
            metric -> verdict.
        """
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds!r}")
        ref = self._reference(reference)
        passes = Passes(lambda: self._serve_rounds(requests, ref, rounds))

        def of(metric: str, part: int) -> Callable[[ServeRound], list[float]]:
            return lambda r: r.samples[metric][part]

        return {m: self._record(m, passes.measurement(of(m, 0), reference=of(m, 1) if ref is not None else None))
                for m in _SERVE_METRICS}

    def _serve_rounds(self, requests: Callable[[], Iterable[Callable[[], Iterable[Any]]]],
                     ref: Callable[[], Any] | None, rounds: int) -> ServeRound:
        out: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in _SERVE_METRICS}
        timed = (t for _ in range(rounds)
                 for t in time_streams(requests(), device=self._dev, threads=self._timing_threads(), reference=ref))
        for t in timed:
            values = {"ttft_ms": [t.first_ms], "token_ms": list(t.item_ms), "e2e_ms_p50": [t.total_ms],
                      "e2e_ms_p90": [t.total_ms], "tokens_per_s": [t.items_per_s]}
            for metric, xs in values.items():
                out[metric][0].extend(xs)
                out[metric][1].extend([t.reference_ms or 1.0] * len(xs))
        return ServeRound(samples=out)

    # -- operators ------------------------------------------------------------------------

    def operators(
        self,
        step: Callable[[], Any],
        *,
        rounds: int = OP_ROUNDS,
        steps: int = OP_ROUND_STEPS,
        families: Sequence[str] = OP_METRIC_FAMILIES,
        reference: bool = False,
    ) -> Any:
        """Record per-operator self time, share of the step and call counts.

        Operators recorded: every one budgeted for the key (in any per-operator family),
        plus new ones above a share threshold — lower when writing budgets
        (:data:`NEW_OP_SHARE_UPDATE`), higher when checking (:data:`NEW_OP_SHARE_CHECK`), so
        an operator hovering at the threshold does not flip between runs. Self times are
        normalised by a machine-speed reference timed before each profiled round.

        Args:
            step: one full step.
            rounds: profiled rounds per sample set (one sample per round).
            steps: steps per profiled round.
            families: which of ``op_self_ms``, ``op_share``, ``op_count`` to record (counts
                alone are exact and hold on any machine).
            reference: time the machine-speed reference before each round and normalise
                self times by it (opt-in, as in :meth:`step`).

        Returns:
            The first :class:`~perfbudget.measure.operators.OpRounds`.
        """
        unknown = set(families) - set(OP_METRIC_FAMILIES)
        if unknown or not families:
            raise ValueError(f"families must be some of {OP_METRIC_FAMILIES}, got {tuple(families)!r}")
        ref = machine_reference(self._dev) if reference else None
        self._fails_with(step)
        passes = Passes(lambda: profile_rounds(step, rounds=rounds, steps=steps, device=self._dev, reference=ref))
        for op in self._operator_names(passes.first):
            self._record_operator(op, passes, families=families, reference=reference)
        return passes.first

    def _record_operator(self, op: str, passes: Passes[OpRounds], *, families: Sequence[str], reference: bool) -> None:
        """Record ``op`` in each of ``families``, read from every profiled pass."""
        if "op_self_ms" in families:
            refs = (lambda r: list(r.ref_ms)) if reference else None
            self._record(f"op_self_ms[{op}]", passes.measurement(lambda r: r.self_ms(op), reference=refs))
        if "op_share" in families:
            self._record(f"op_share[{op}]", passes.measurement(lambda r: r.share(op)))
        if "op_count" in families:
            self._record(f"op_count[{op}]", Measurement(samples=stats.median(passes.first.calls(op))))

    def _operator_names(self, first: OpRounds) -> list[str]:
        """Which operators :meth:`operators` records, heaviest first: every one budgeted for the key
        (in any per-operator family), plus new ones above the share threshold of this run's mode.

        In the later pairs of a lockstep A/B run the driver names, per test, the operators
        either side recorded so far (:meth:`perfbudget.judging.Judging.pinned_operators`); both sides then record exactly
        those and the budgeted ones, so an operator near the threshold is compared in every
        pair instead of being listed by one process and not by the other.
        """
        ops = set(self._op_budgets(OP_METRIC_FAMILIES))
        pinned = self.judge.config.judging.pinned_operators(self.nodeid, self.key)
        if pinned is not None:
            ops |= set(pinned)
        else:
            ops |= set(first.top(NEW_OP_SHARE_UPDATE if self.update else NEW_OP_SHARE_CHECK))
        return sorted(ops, key=lambda o: -first.mean_share(o))

    def flops(self, step: Callable[[], Any]) -> Verdict:
        """Record ``flops`` of one call of ``step`` (attention counted; the step runs once)."""
        return self._record("flops", Measurement(samples=count_flops(step).total_flops))

    def _op_budgets(self, families: Sequence[str]) -> dict[str, Budget]:
        """Operator -> its budget in the first of ``families`` that budgets it, for this key."""
        out: dict[str, Budget] = {}
        for metric, b in self.budgeted().items():
            parsed = op_metric(metric)
            if parsed is not None and parsed[0] in families:
                out.setdefault(parsed[1], b)
        return out

    def _operator_explanation(self, step: Callable[[], Any]) -> Callable[[], Explanation]:
        """Profile the step (when it fails) and name the operators that moved against ``op_self_ms`` budgets."""

        def explain() -> Explanation:
            rounds = profile_rounds(step, rounds=3, steps=2, device=self._dev)
            budgets = self._op_budgets(("op_self_ms",))
            candidates = [
                OpMove(op=op, family="op_self_ms", before=b.value if b else None,
                       after=stats.median(rounds.self_ms(op)), unit="ms", tolerance=b.tolerance if b else 0.0)
                for op in sorted(set(budgets) | set(rounds.top(_EXPLAIN_MIN_SHARE))) for b in [budgets.get(op)]
            ]
            moves = OperatorMoves.of(candidates, note="profiled when step_ms failed, vs the op_self_ms budgets")
            return Explanation(extra=moves.to_extra())

        return explain

    # -- instructions ---------------------------------------------------------------------

    def instructions(self, step: Callable[[], Any], *, steps: int = 20, warmup: int = 10,
                     counter: Literal["auto", "callgrind", "hardware"] = "auto") -> Verdict:
        """Record ``instructions[callgrind]`` (or ``instructions[hardware]``) per call of ``step``.

        Only the ``steps`` counted calls are counted, after ``warmup`` uncounted ones: set-up,
        fixtures and warm-up are not. Counted by callgrind when the session runs under it
        (``perfbudget instructions -- <pytest args>``), else by the CPU's instructions counter
        where one opens; otherwise the metric is recorded unmeasurable with how to run it.
        The two counters are different metrics and are never compared with each other. A
        callgrind count leaves out the instructions of history-dependent functions (the memory
        allocators, CPython's dictionary and type-attribute lookups: their work depends on what
        the process did before, and the same step read up to 0.7 % apart in different sessions;
        :func:`perfbudget.measure.instructions.history_dependent`); the hardware counter cannot
        tell functions apart and counts everything. A callgrind count keeps its heaviest functions with the record
        (:class:`~perfbudget.extras.InstructionProfile`, which two records can be compared by
        function with), and a failure names them.
        """
        got = instructions.instructions(step, steps=steps, warmup=warmup, counter=counter)
        if isinstance(got, Unmeasurable):
            return self.unmeasurable(f"instructions[{'hardware' if counter == 'hardware' else 'callgrind'}]",
                                     got.reason)
        metric = f"instructions[{'callgrind' if got.dump is not None else 'hardware'}]"
        extra: dict[str, Any] = {}
        if got.dump is not None:
            dump = got.parsed or instructions.read_dump(got.dump)
            profile = InstructionProfile.of(got.counter, ((f.function, f.self_ir / got.steps, f.inclusive_ir / got.steps)
                                                          for f in dump.functions.values() if not f.straddles),
                                            history_dependent_per_step=got.history_dependent / got.steps)
            extra = profile.to_extra()

            def explain() -> Explanation:
                return Explanation(lines=(
                    f"{got.total / got.steps:,.0f} instructions per step counted; {got.history_dependent / got.steps:,.0f} "
                    "of them in history-dependent functions (allocators, dictionary and type lookups), left out "
                    "of the value",
                    "heaviest functions (inclusive instructions per step, callgrind):",
                    *(f"  {line}" for line in profile.top_lines())))
        else:
            def explain() -> Explanation:
                return Explanation(lines=(f"counted by {got.counter}: no per-function attribution; run under "
                                          "`perfbudget instructions` for callgrind's",))
        return self._record(metric, Measurement(samples=got.per_step, extra=extra, explainer=explain))

    # -- memory ---------------------------------------------------------------------------

    def memory(
        self,
        forward: Callable[[], Any],
        *,
        backward: Callable[[Any], Any] | None = None,
        optimizer: Any = None,
        warmup: int = 1,
        names: dict[str, str] | None = None,
    ) -> dict[str, Verdict]:
        """Record ``peak_allocated_mib[forward|backward|optimizer]`` of one training step.

        Measures the configuration it is given: pass the timed workload's own phases (its
        precision policy, its batch) so the memory budget describes what is timed. See
        :func:`perfbudget.measure.memory.peak_by_phase` for what is counted on each device.

        Args:
            forward: returns the loss.
            backward: takes the loss (default ``loss.backward()``).
            optimizer: an optimizer, a zero-argument callable, or ``None``: then no optimizer
                phase runs and nothing is recorded for it (a budget left for it is reported as
                not measured, never passed on a 0).
            warmup: unmeasured steps first (the first step allocates optimizer state).
            names: phase renames for the metric argument, e.g. ``{"backward":
                "backward_and_optimizer"}`` when one callable does both.
        """
        self._fails_with(memory.training_step(forward, backward=backward, optimizer=optimizer))
        peaks = memory.peak_by_phase(forward, backward=backward, optimizer=optimizer, device=self._dev,
                                     warmup=warmup, threads=self._timing_threads())
        phases = {(names or {}).get(phase, phase): mib for phase, mib in peaks.by_phase().items()}
        return {phase: self._record(f"peak_allocated_mib[{phase}]", Measurement(samples=mib))
                for phase, mib in phases.items()}

    # -- torch.compile --------------------------------------------------------------------

    def compile_health(self, report: Any) -> None:
        """Record a compile warm-up: ``graph_breaks`` (reasons attached), ``unique_graphs``
        and ``compile_s[cold|warm]`` (one sample per run; caches budgeted apart).

        Args:
            report: the :class:`~perfbudget.measure.compile_health.WarmupReport` of
                :func:`~perfbudget.measure.compile_health.warm_until_stable`.
        """
        grown = report.counters
        reasons = tuple(f"{n} x {why}" for why, n in grown.break_reasons.items())
        self._record("graph_breaks", Measurement(samples=grown.graph_breaks, attribution=reasons))
        self._record("unique_graphs", Measurement(samples=grown.unique_graphs))
        cache = getattr(report, "cache", None)
        if cache in ("cold", "warm"):
            self._record(f"compile_s[{cache}]", Measurement(samples=report.compile_s))

    @contextlib.contextmanager
    def no_recompiles(self) -> Iterator[None]:
        """Measure inside ``torch.compiler.set_stance("fail_on_recompile")`` and record
        ``recompiles``: a recompile stops the block and is recorded (the check fails
        against its budget of 0), with the guard that failed as attribution."""
        before = compile_health.read_counters()
        failure: BaseException | None = None
        try:
            with compile_health.no_recompiles():
                yield
        except compile_health.RecompileError as exc:
            failure = exc
        grown = (compile_health.read_counters() - before).recompiles
        if failure is None:
            self._record("recompiles", Measurement(samples=grown))
            return
        first = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
        self._record("recompiles", Measurement(samples=max(1, grown),
                                               attribution=(f"recompiled while measuring: {first}",)))

    # -- numerics -------------------------------------------------------------------------

    def grads(self, step: Callable[[], Any], model: Any, *, steps: int = 20) -> Verdict:
        """Record ``nonfinite_grads`` over ``steps`` steps, naming the first bad parameter."""
        got = numerics.check_grads(step, model, steps=steps, stop_at_first=False)
        return self._record("nonfinite_grads", Measurement(samples=got.nonfinite_grads, attribution=tuple(got.lines())))

    def loss_drift(self, candidate: Callable[[], Any], reference: Callable[[], Any], *, steps: int = 20) -> Verdict:
        """Record ``loss_drift``: the largest relative loss difference between ``candidate``
        and ``reference`` steps (e.g. mixed precision vs fp32) on the same data."""
        drift = numerics.compare_to_reference(candidate, reference, steps=steps)
        return self._record("loss_drift", Measurement(samples=drift.max_rel))

    # -- GPU utilisation ------------------------------------------------------------------

    def occupancy(self, step: Callable[[], Any], *, rounds: int = 5, steps: int = 2) -> None:
        """Record ``kernel_count`` (per step) and ``sm_occupancy``: the duration-weighted
        occupancy each kernel's launch resources (registers, shared memory, block, grid) allow on
        the profiled GPU, one sample per profiled round; the kernel time it leaves out (kernels
        without those resources in the trace) is kept as attribution. Unmeasurable where no
        kernel's occupancy can be computed (CPU, or a trace without launch resources)."""
        passes = Passes(lambda: self._occupancy_pass(step, rounds=rounds, steps=steps))
        occ, kernels, left_out = passes.first
        self._record("kernel_count", Measurement(samples=kernels))
        if not occ:
            self.unmeasurable("sm_occupancy", "no kernel in the profiler trace carries the launch resources "
                                              "(registers, shared memory, block, grid) occupancy is computed from")
        else:
            self._record("sm_occupancy", passes.measurement(lambda p: p[0], attribution=left_out))

    def _occupancy_pass(self, step: Callable[[], Any], *, rounds: int,
                        steps: int) -> tuple[list[float], int, tuple[str, ...]]:
        """Occupancy of each profiled round where it could be computed, kernels per step, and
        the line saying how much kernel time the first such round left out (if any)."""
        occ: list[float] = []
        kernels = 0
        left_out: tuple[str, ...] = ()
        with tempfile.TemporaryDirectory(prefix="perfbudget-occupancy-") as tmp:
            for i in range(rounds):
                path = Path(tmp) / f"round{i}.json"
                profile_steps(step, steps=steps, warmup=1, device=self._dev, trace_path=path, with_flops=False,
                              peaks=None)
                got = occupancy.achieved_occupancy(path)
                if got.occupancy is not None:
                    if not occ and (line := got.left_out_line()) is not None:
                        left_out = (line,)
                    occ.append(got.occupancy)
                kernels = got.kernels // steps
        return occ, kernels, left_out

    def gpm(self, window: Callable[[], Any], *, windows: int = 5) -> None:
        """Record NVML GPM's measured ``gpm_sm_occupancy`` and ``tensor_util``, one sample per
        ``window()`` (which should keep the GPU busy for a second or so and synchronise)."""
        read = {"gpm_sm_occupancy": "sm_occupancy", "tensor_util": "tensor_util"}
        passes = Passes(lambda: _gpm_pass(window, windows=windows, metrics=tuple(read.values())), what="NVML GPM")
        for metric, gpm_name in read.items():
            if passes.unmeasurable is not None:
                self.unmeasurable(metric, passes.unmeasurable.reason)
            else:
                self._record(metric, passes.measurement(itemgetter(gpm_name)))

    # -- energy ---------------------------------------------------------------------------

    def energy(self, fn: Callable[[], Any], *, per_call: int, unit: str = "sample", windows: int = 5) -> Verdict:
        """Record ``energy_j_per_<unit>`` over windows of >= 1 s (NVML on GPUs, RAPL on CPUs);
        where no counter is readable, the metric is recorded unmeasurable with the reason.

        Args:
            fn: processes ``per_call`` units per call (a training step, a few requests).
            per_call: samples or tokens per call.
            unit: ``"sample"`` or ``"token"``.
            windows: windows per sample set (one value each).
        """
        if unit not in ("sample", "token"):
            raise ValueError(f"unit must be 'sample' or 'token', got {unit!r}")
        metric = f"energy_j_per_{unit}"
        passes = Passes(lambda: energy.energy_per_sample(fn, samples_per_call=per_call, device=self._dev,
                                                         windows=windows), what=f"{metric}: the energy counter")
        if passes.unmeasurable is not None:
            return self.unmeasurable(metric, passes.unmeasurable.reason)
        counter = f"counter: {passes.first.source} {passes.first.domain}"
        return self._record(metric, passes.measurement(lambda got: list(got.j_per_sample), attribution=[counter]))

    # -- helpers --------------------------------------------------------------------------

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
               **kw: Any) -> Callable[[], _Timed]:
        """One timed batch of ``fn`` per call: plain, or alternating with the reference."""
        kw.setdefault("device", self._dev)
        kw.setdefault("threads", self._timing_threads())
        ref = self._reference(reference)
        if ref is None:
            return lambda: _Timed(list(bench(fn, **kw).samples_ms))

        def paired() -> _Timed:
            a, b = bench_paired(fn, ref, **kw)
            return _Timed(list(a.samples_ms), list(b.samples_ms))

        return paired

    # -- results --------------------------------------------------------------------------

    def records(self) -> list[Record]:
        """Records of every verdict; failing ones carry the operators that moved
        (:class:`~perfbudget.extras.OperatorMoves`) unless their own explanation named them."""
        moved = OperatorMoves.of(self._op_checks())
        out = []
        for v in self.verdicts:
            extra = dict(self.extras.get(v.metric, {}))
            if v.outcome == Outcome.FAIL and moved.moves and OperatorMoves.from_extra(extra) is None:
                extra.update(moved.to_extra())
            out.append(Record.from_verdict(v, nodeid=self.nodeid, device=self.device, extra=extra))
        return out

    def _op_checks(self) -> list[OpMove]:
        """This test's budgeted per-operator checks, each as the move it made against its budget."""
        out = []
        for v in self.verdicts:
            parsed = op_metric(v.metric)
            if parsed is None or v.budget is None or v.value is None or not math.isfinite(v.value):
                continue
            out.append(OpMove(op=parsed[1], family=parsed[0], before=v.budget.value, after=v.value,
                              unit=v.info.unit, tolerance=v.budget.tolerance, failing=v.outcome in (Outcome.FAIL, Outcome.ERROR),
                              outcome=v.outcome))
        return out

    def decision(self) -> Decision:
        """What the recorded verdicts mean for the test (data; the report renders it)."""
        return self.judge.decision(self.verdicts)


def _gpm_pass(window: Callable[[], Any], *, windows: int, metrics: tuple[str, ...]) -> dict[str, list[float]] | Unmeasurable:
    """GPM metrics (fractions 0-1) of ``windows`` windows, or why GPM cannot be read."""
    out: dict[str, list[float]] = {k: [] for k in metrics}
    for _ in range(windows):
        got = nvml.gpm_metrics(window, metrics=metrics)
        if isinstance(got, Unmeasurable):
            return got
        # NVML answers each metric with its own status: one refused makes the pass unmeasurable,
        # with its name, rather than a KeyError.
        missing = [k for k in out if k not in got.values_pct]
        if missing:
            return Unmeasurable(reason=f"NVML GPM returned no value for {missing} (got {sorted(got.values_pct)})")
        for k in out:
            out[k].append(got.values_pct[k] / 100.0)
    return out
