"""What a test measured, collected under its budget key: the public measuring API behind ``perf``.

Every method measures through :mod:`perfbudget.measure` (whose timers take turns in a
lockstep A/B run), hands the samples to the :class:`~perfbudget.judge.Judge` and keeps
the verdict. Usable without pytest: ``PerfRecorder(Judge(key, device, budgets))``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .budgets.verdict import Outcome, Verdict
from .judge import OP_FAMILIES, Decision, Judge
from .measure import stats
from .metrics import UnknownMetricError, parse_name
from .results import Record

__all__ = ["AB_OPERATORS_ENV", "NEW_OP_SHARE_CHECK", "NEW_OP_SHARE_UPDATE", "OPERATOR_FAMILIES", "OP_ROUNDS", "PerfRecorder", "ServeRound",
           "pinned_operators"]

#: Profiled rounds behind each per-operator sample set (one sample per round).
OP_ROUNDS = 16
#: Operators above this share of the step get budgets when budgets are written...
NEW_OP_SHARE_UPDATE = 0.05
#: ...and a new operator must pass this share before a check run calls it unbudgeted.
#: The gap keeps an operator hovering at 5 % from flipping between runs.
NEW_OP_SHARE_CHECK = 0.07
#: The per-operator families: their budgets name the operators a test must record.
OPERATOR_FAMILIES = ("op_self_ms", "op_share", "op_count")


#: Set by ``perfbudget ab`` for its sides after the first pair: a JSON file
#: ``{nodeid: {key: [operator, ...]}}`` naming the operators each test records from then on.
AB_OPERATORS_ENV = "PERFBUDGET_AB_OPERATORS"


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
        raise ValueError(f"{AB_OPERATORS_ENV}={path}: cannot be read: {exc}") from None
    ops = data.get(nodeid, {}).get(key) if isinstance(data, dict) and isinstance(data.get(nodeid, {}), dict) else None
    if ops is None:
        return None
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ValueError(f"{AB_OPERATORS_ENV}={path}: [{nodeid!r}][{key!r}]: expected a list of operator names, "
                         f"got {ops!r}")
    return tuple(ops)


@dataclass(frozen=True, kw_only=True)
class ServeRound:
    """Latencies of one round of streamed requests, each paired with its reference time."""

    samples: dict[str, tuple[list[float], list[float]]]
    """metric -> (samples, paired machine-speed reference times)."""


class PerfRecorder:
    """Records a test's measurements under its budget key.

    Args:
        judge: decides each metric against the budgets (it knows key, device, budgets).
        nodeid: the test's id (for records and the update command).
        update_command: the command that creates missing budgets, for skip messages.
        threads: torch threads for CPU timing (``None``: leave the process's setting).
    """

    def __init__(self, judge: Judge, *, nodeid: str = "", update_command: str = "", threads: int | None = 1) -> None:
        self.judge = judge
        self.nodeid = nodeid
        self.update_command = update_command
        self.threads = threads
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
        return self.judge.config.update

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
        try:
            name = parse_name(metric)
        except UnknownMetricError as exc:
            return self._keep(Verdict(key=self.key, metric=str(metric), outcome=Outcome.ERROR, reason=str(exc)), extra)
        v = self.judge.judge(name, samples, more=more, reference=reference)
        if explain is not None and v.outcome == "fail":
            try:
                attribution = (*attribution, *explain())
            except Exception as exc:  # attribution must never hide the verdict itself
                attribution = (*attribution, f"attribution failed: {type(exc).__name__}: {exc}")
        if attribution:
            v = v.with_(attribution=tuple(attribution))
        return self._keep(v, extra)

    def unmeasurable(self, metric: str, reason: str) -> Verdict:
        """Note that ``metric`` cannot be measured here (e.g. no energy counter), with why."""
        return self._keep(Verdict(key=self.key, metric=metric, outcome=Outcome.UNMEASURABLE, reason=reason), None)

    def _keep(self, v: Verdict, extra: dict[str, Any] | None) -> Verdict:
        self.verdicts.append(v)
        if extra:
            self.extras[v.metric] = extra
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
        from .measure.timing import bench

        bench_kwargs.setdefault("device", self._dev)
        bench_kwargs.setdefault("threads", self._timing_threads())
        if self.failure_step is None:
            self.failure_step = fn
        ref = self._reference(reference)
        if ref is None:

            def sample() -> list[float]:
                return list(bench(fn, **bench_kwargs).samples_ms)

            return self.record(metric, sample(), more=sample, explain=explain)
        pair = self._paired(fn, ref, **bench_kwargs)
        first, refs = pair()
        return self.record(metric, first, reference=refs, more=pair, explain=explain)

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
    ) -> tuple[Verdict, Verdict]:
        """Record ``step_ms`` and ``throughput_samples_per_s`` of a warm training/inference step.

        Unprofiled samples (CUDA events on a GPU). A failing step time is explained by
        profiling the step against the key's ``op_self_ms`` budgets (which operators moved).

        Reference normalisation is opt-in (``reference=True``): measured on these VMs, it
        absorbed 25-45 % of a planted +10 % step slowdown against stored budgets and most of
        it in lockstep, while the machines that keep stored budgets (a pinned runner of one
        SKU) drift little; a drifting machine should use ``perfbudget ab`` instead.

        Args:
            step: one full step (zero-argument callable).
            samples_per_step: samples per step, for samples/s.
            reference: as in :meth:`time` (default: none).
            explain_operators: profile the step on failure to name the operators that moved.
            min_samples, max_ms, warmup_ms: as in :func:`~perfbudget.measure.timing.bench`.

        Returns:
            The ``(step_ms, throughput_samples_per_s)`` verdicts.
        """
        if samples_per_step < 1:
            raise ValueError(f"samples_per_step must be >= 1, got {samples_per_step!r}")
        if self.failure_step is None:
            self.failure_step = step
        kw = dict(min_samples=min_samples, max_ms=max_ms, warmup_ms=warmup_ms)

        def rate(ms: Sequence[float]) -> list[float]:
            return [samples_per_step * 1e3 / x for x in ms]

        explain = self._explain_operators(step) if explain_operators else None
        ref = self._reference(reference)
        if ref is None:
            from .measure.timing import bench

            def sample() -> list[float]:
                return list(bench(step, device=self._dev, threads=self._timing_threads(), **kw).samples_ms)  # type: ignore[arg-type]

            first = sample()
            return (self.record("step_ms", first, more=sample, explain=explain),
                    self.record("throughput_samples_per_s", rate(first), more=lambda: rate(sample())))
        pair = self._paired(step, ref, **kw)

        def rate_pair() -> tuple[list[float], list[float]]:
            a, b = pair()
            return rate(a), b

        first, refs = pair()
        return (self.record("step_ms", first, reference=refs, more=pair, explain=explain),
                self.record("throughput_samples_per_s", rate(first), reference=refs, more=rate_pair))

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
        from .measure.timing import bench_paired

        if rounds < 2:
            raise ValueError(f"rounds must be >= 2, got {rounds!r}")

        def ratios() -> list[float]:
            a, b = bench_paired(baseline, lever, device=self._dev, threads=self._timing_threads(), warmup_ms=0,
                                min_samples=rounds, max_ms=0, min_warmup_calls=1)
            return [x / y for x, y in zip(a.samples_ms, b.samples_ms, strict=True)]

        return self.record(f"speedup[{what}]", ratios(), more=ratios, attribution=attribution)

    def serve(
        self,
        requests: Callable[[], Iterable[Callable[[], Iterable[Any]]]],
        *,
        reference: Callable[[], Any] | bool | None = None,
    ) -> dict[str, Verdict]:
        """Record serving latencies of streamed requests: ``ttft_ms``, ``token_ms``,
        ``e2e_ms_p50``, ``e2e_ms_p90`` and ``tokens_per_s``.

        Args:
            requests: returns one round of requests, each a callable that starts the
                request and returns its tokens as they are produced (a generator). A round
                should hold >= 64 requests so a p90 has samples above it.
            reference: as in :meth:`time` (default: none); timed after every request, and
                every latency is paired with its request's reference time.

        Returns:
            metric -> verdict.
        """
        from .measure.timing import time_streams

        ref = self._reference(reference)
        metrics = ("ttft_ms", "token_ms", "e2e_ms_p50", "e2e_ms_p90", "tokens_per_s")

        def one_round() -> ServeRound:
            out: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in metrics}
            for t in time_streams(requests(), device=self._dev, threads=self._timing_threads(), reference=ref):
                values = {"ttft_ms": [t.first_ms], "token_ms": list(t.item_ms), "e2e_ms_p50": [t.total_ms],
                          "e2e_ms_p90": [t.total_ms], "tokens_per_s": [t.items_per_s]}
                for metric, xs in values.items():
                    out[metric][0].extend(xs)
                    out[metric][1].extend([t.reference_ms or 1.0] * len(xs))
            return ServeRound(samples=out)

        first = one_round()
        fresh: list[ServeRound] = []

        def more_for(metric: str) -> Callable[[], Any]:
            asked = [0]  # the n-th extra round of every metric reads the same n-th fresh round

            def again() -> Any:
                while len(fresh) <= asked[0]:
                    fresh.append(one_round())
                asked[0] += 1
                xs, refs = fresh[asked[0] - 1].samples[metric]
                return (xs, refs) if ref is not None else xs

            return again

        out = {}
        for metric, (xs, refs) in first.samples.items():
            out[metric] = self.record(metric, xs, reference=refs if ref is not None else None, more=more_for(metric))
        return out

    # -- operators ------------------------------------------------------------------------

    def operators(
        self,
        step: Callable[[], Any],
        *,
        rounds: int = OP_ROUNDS,
        steps: int = 2,
        families: Sequence[str] = OPERATOR_FAMILIES,
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
        from .measure.operators import OpRounds, profile_rounds
        from .measure.reference import machine_reference

        unknown = set(families) - set(OPERATOR_FAMILIES)
        if unknown or not families:
            raise ValueError(f"families must be some of {OPERATOR_FAMILIES}, got {tuple(families)!r}")
        ref = machine_reference(self._dev) if reference else None

        def profiled() -> OpRounds:
            return profile_rounds(step, rounds=rounds, steps=steps, device=self._dev, reference=ref)

        first = profiled()
        passes: list[OpRounds] = []

        def more_for(pick: Callable[[OpRounds], Any]) -> Callable[[], Any]:
            asked = [0]  # the n-th extra round of every operator reads the same n-th fresh pass

            def again() -> Any:
                while len(passes) <= asked[0]:
                    passes.append(profiled())
                asked[0] += 1
                return pick(passes[asked[0] - 1])

            return again

        if self.failure_step is None:
            self.failure_step = step
        ops = self._operator_names(first)
        def self_ms_of(op: str) -> Callable[[OpRounds], Any]:
            return (lambda r: (r.self_ms(op), list(r.ref_ms))) if reference else (lambda r: r.self_ms(op))

        def share_of(op: str) -> Callable[[OpRounds], Any]:
            return lambda r: r.share(op)

        for op in sorted(ops, key=lambda o: -first.mean_share(o)):
            if "op_self_ms" in families:
                self.record(f"op_self_ms[{op}]", first.self_ms(op),
                            reference=list(first.ref_ms) if reference else None, more=more_for(self_ms_of(op)))
            if "op_share" in families:
                self.record(f"op_share[{op}]", first.share(op), more=more_for(share_of(op)))
            if "op_count" in families:
                calls = [row.calls if (row := t.get(op)) is not None else 0.0 for t in first.tables]
                self.record(f"op_count[{op}]", stats.median(calls))
        return first

    def flops(self, step: Callable[[], Any]) -> Verdict:
        """Record ``flops`` of one call of ``step`` (attention counted; the step runs once)."""
        from .measure.operators import count_flops

        return self.record("flops", count_flops(step).total_flops)

    def _operator_names(self, first: Any) -> set[str]:
        """The operators :meth:`operators` records: every budgeted one, and new ones above the
        share threshold of this run's first pass.

        In the later pairs of a lockstep A/B run the driver names, per test, the operators
        either side recorded so far (:data:`AB_OPERATORS_ENV`); both sides then record exactly
        those and the budgeted ones, so an operator near the threshold is compared in every
        pair instead of being listed by one process and not by the other.
        """
        budgeted = set(self._budgeted_ops())
        if self.judge.config.collect:
            pinned = pinned_operators(os.environ.get(AB_OPERATORS_ENV, ""), self.nodeid, self.key)
            if pinned is not None:
                return budgeted | set(pinned)
        threshold = NEW_OP_SHARE_UPDATE if self.update else NEW_OP_SHARE_CHECK
        return budgeted | set(first.top(threshold))

    def _budgeted_ops(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for metric, b in self.budgeted().items():
            family, _, rest = metric.partition("[")
            if family in OPERATOR_FAMILIES and rest.endswith("]"):
                out.setdefault(rest[:-1], b.value)
        return out

    def _explain_operators(self, step: Callable[[], Any]) -> Callable[[], list[str]]:
        """Profile the step and name the operators that moved most against ``op_self_ms`` budgets."""

        def explain() -> list[str]:
            from .measure.operators import profile_rounds

            rounds = profile_rounds(step, rounds=3, steps=2, device=self._dev)
            budget_ms = {m[len("op_self_ms["):-1]: b.value for m, b in self.budgeted().items()
                         if m.startswith("op_self_ms[")}
            lines = rounds.moved_against(budget_ms)
            return ["operators (profiled now vs op_self_ms budgets):", *(f"  {x}" for x in lines)]

        return explain

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
            optimizer: an optimizer, a zero-argument callable, or ``None``.
            warmup: unmeasured steps first (the first step allocates optimizer state).
            names: phase renames for the metric argument, e.g. ``{"backward":
                "backward_and_optimizer"}`` when one callable does both.
        """
        from .measure import memory

        peaks = memory.peak_by_phase(forward, backward=backward, optimizer=optimizer, device=self._dev,
                                     warmup=warmup, threads=self._timing_threads())
        names = names or {}
        return {
            names.get(phase, phase): self.record(f"peak_allocated_mib[{names.get(phase, phase)}]", mib)
            for phase, mib in peaks.by_phase().items()
        }

    # -- torch.compile --------------------------------------------------------------------

    def compile_health(self, report: Any) -> None:
        """Record a compile warm-up: ``graph_breaks`` (reasons attached), ``unique_graphs``
        and ``compile_s[cold|warm]`` (one sample per run; caches budgeted apart).

        Args:
            report: the :class:`~perfbudget.measure.compile_health.WarmupReport` of
                :func:`~perfbudget.measure.compile_health.warm_until_stable`.
        """
        grown = report.counters
        self.record("graph_breaks", grown.graph_breaks,
                    attribution=[f"{n} x {why}" for why, n in grown.break_reasons.items()])
        self.record("unique_graphs", grown.unique_graphs)
        cache = getattr(report, "cache", None)
        if cache in ("cold", "warm"):
            self.record(f"compile_s[{cache}]", report.compile_s)

    @contextlib.contextmanager
    def no_recompiles(self) -> Iterator[None]:
        """Measure inside ``torch.compiler.set_stance("fail_on_recompile")`` and record
        ``recompiles``: a recompile stops the block and is recorded (the check fails
        against its budget of 0), with the guard that failed as attribution."""
        from .measure import compile_health

        before = compile_health.read_counters()
        failure: BaseException | None = None
        try:
            with compile_health.no_recompiles():
                yield
        except compile_health.RecompileError as exc:
            failure = exc
        grown = (compile_health.read_counters() - before).recompiles
        if failure is not None:
            first = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
            self.record("recompiles", max(1, grown), attribution=[f"recompiled while measuring: {first}"])
        else:
            self.record("recompiles", grown)

    # -- numerics -------------------------------------------------------------------------

    def grads(self, step: Callable[[], Any], model: Any, *, steps: int = 20) -> Verdict:
        """Record ``nonfinite_grads`` over ``steps`` steps, naming the first bad parameter."""
        from .measure import numerics

        got = numerics.check_grads(step, model, steps=steps, stop_at_first=False)
        return self.record("nonfinite_grads", got.nonfinite_grads, attribution=got.lines())

    def loss_drift(self, candidate: Callable[[], Any], reference: Callable[[], Any], *, steps: int = 20) -> Verdict:
        """Record ``loss_drift``: the largest relative loss difference between ``candidate``
        and ``reference`` steps (e.g. mixed precision vs fp32) on the same data."""
        from .measure import numerics

        drift = numerics.compare_to_reference(candidate, reference, steps=steps)
        return self.record("loss_drift", drift.max_rel)

    # -- GPU utilisation ------------------------------------------------------------------

    def occupancy(self, step: Callable[[], Any], *, rounds: int = 5, steps: int = 2) -> None:
        """Record ``kernel_count`` (per step) and ``sm_occupancy``: the duration-weighted mean
        of the profiler's per-kernel "est. achieved occupancy", one sample per profiled round.
        Unmeasurable where the trace carries no estimate (CPU, or a profiler without it)."""
        import tempfile
        from pathlib import Path

        from .measure import occupancy
        from .measure.operators import profile_steps

        def profiled() -> tuple[list[float], int]:
            occ: list[float] = []
            kernels = 0
            with tempfile.TemporaryDirectory(prefix="perfbudget-occupancy-") as tmp:
                for i in range(rounds):
                    path = Path(tmp) / f"round{i}.json"
                    profile_steps(step, steps=steps, warmup=1, device=self._dev, trace_path=path, with_flops=False,
                                  peaks=None)
                    got = occupancy.achieved_occupancy(path)
                    if got.occupancy is not None:
                        occ.append(got.occupancy)
                    kernels = got.kernels // steps
            return occ, kernels

        occ, kernels = profiled()
        self.record("kernel_count", kernels)
        if not occ:
            self.unmeasurable("sm_occupancy", "the profiler's kernel records carry no occupancy estimate")
        else:
            self.record("sm_occupancy", occ, more=lambda: profiled()[0])

    def gpm(self, window: Callable[[], Any], *, windows: int = 5) -> None:
        """Record NVML GPM's measured ``gpm_sm_occupancy`` and ``tensor_util``, one sample per
        ``window()`` (which should keep the GPU busy for a second or so and synchronise)."""
        from .measure import nvml

        def sampled() -> dict[str, list[float]] | nvml.Unmeasurable:
            out: dict[str, list[float]] = {"sm_occupancy": [], "tensor_util": []}
            for _ in range(windows):
                got = nvml.gpm_metrics(window, metrics=tuple(out))
                if isinstance(got, nvml.Unmeasurable):
                    return got
                for k in out:
                    out[k].append(got.values_pct[k] / 100.0)
            return out

        first = sampled()
        if isinstance(first, nvml.Unmeasurable):
            self.unmeasurable("gpm_sm_occupancy", first.reason)
            self.unmeasurable("tensor_util", first.reason)
            return
        def again(name: str) -> Callable[[], list[float]]:
            def more() -> list[float]:
                got = sampled()
                if isinstance(got, nvml.Unmeasurable):
                    raise RuntimeError(f"NVML GPM went away: {got.reason}")
                return got[name]
            return more

        self.record("gpm_sm_occupancy", first["sm_occupancy"], more=again("sm_occupancy"))
        self.record("tensor_util", first["tensor_util"], more=again("tensor_util"))

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
        from .measure import energy

        if unit not in ("sample", "token"):
            raise ValueError(f"unit must be 'sample' or 'token', got {unit!r}")
        metric = f"energy_j_per_{unit}"

        def measure() -> Any:
            return energy.energy_per_sample(fn, samples_per_call=per_call, device=self._dev, windows=windows)

        got = measure()
        if isinstance(got, energy.Unmeasurable):
            return self.unmeasurable(metric, got.reason)

        def again() -> list[float]:
            fresh = measure()
            if isinstance(fresh, energy.Unmeasurable):
                raise RuntimeError(f"{metric}: the energy counter went away: {fresh.reason}")
            return list(fresh.j_per_sample)

        return self.record(metric, list(got.j_per_sample), more=again, attribution=[f"counter: {got.source} {got.domain}"])

    # -- helpers --------------------------------------------------------------------------

    def _timing_threads(self) -> int | None:
        return self.threads if self._dev == "cpu" else None

    def _reference(self, reference: Callable[[], Any] | bool | None) -> Callable[[], Any] | None:
        if reference is True:
            from .measure.reference import machine_reference

            return machine_reference(self._dev)
        if reference is False or reference is None:
            return None
        if not callable(reference):
            raise TypeError(f"reference must be True, None or a callable, got {reference!r}")
        return reference

    def _paired(self, fn: Callable[[], Any], ref: Callable[[], Any], **kw: Any) -> Callable[[], tuple[list[float], list[float]]]:
        from .measure.timing import bench_paired

        kw.setdefault("device", self._dev)
        kw.setdefault("threads", self._timing_threads())

        def pair() -> tuple[list[float], list[float]]:
            a, b = bench_paired(fn, ref, **kw)
            return list(a.samples_ms), list(b.samples_ms)

        return pair

    # -- results --------------------------------------------------------------------------

    def records(self) -> list[Record]:
        """Records of every verdict, with the moved operators attached to failing step metrics."""
        moved = self._moved_operators()
        out = []
        for v in self.verdicts:
            if v.outcome == "fail" and not v.attribution and moved and not v.metric.startswith(OP_FAMILIES):
                v = v.with_(attribution=tuple(moved))
            out.append(Record.from_verdict(v, nodeid=self.nodeid, device=self.device, extra=self.extras.get(v.metric)))
        return out

    def _moved_operators(self, k: int = 5) -> list[str]:
        """Per-operator verdicts of this test, largest relative move first: where the time went."""
        ops = [v for v in self.verdicts if v.metric.startswith(OP_FAMILIES) and v.ratio is not None]
        ops.sort(key=lambda v: -(v.ratio or 0.0))
        lines = []
        for v in ops[:k]:
            assert v.budget is not None and v.ratio is not None
            unit = "" if v.info.unit == "1" else f" {v.info.unit}"
            lines.append(f"{v.metric}: {v.value:.4g}{unit} vs budget {v.budget.value:.4g}{unit} "
                         f"({v.ratio - 1:+.1%}, {v.outcome})")
        return lines

    def decision(self) -> Decision:
        """What the recorded verdicts mean for the test (data; the report renders it)."""
        return self.judge.decision(self.verdicts)

