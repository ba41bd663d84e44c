"""Timing a call or a step, on a GPU its device time too, and a lever's speed-up measured in one run."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..measure.measurement import Passes
from ..measure.timing import bench_paired
from ..verdict.judge import Verdict
from .core import Timed, explainer, ref_ms, samples_ms
from .gpu import Gpu
from .instructions import Instructions
from .operators import Operators

__all__ = ["CountedSteps", "Timing"]


def _itself(xs: list[float]) -> list[float]:
    return xs


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


class Timing(Operators, Instructions, Gpu):
    """``perf.time``, ``perf.step`` and ``perf.speedup``. A failing step is explained by its
    operators (:class:`~perfbudget.recorder.operators.Operators`); a counted step is recorded by
    :class:`~perfbudget.recorder.instructions.Instructions`; a GPU step's device side by
    :class:`~perfbudget.recorder.gpu.Gpu`."""

    METRICS: ClassVar[tuple[str, ...]] = ("step_ms", "throughput_samples_per_s", "latency_ms", "speedup")

    counted_steps: CountedSteps | None = None
    """:meth:`step` counts instructions instead of timing (see :class:`CountedSteps`)."""

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
        v = self._record(metric, passes.measurement(samples_ms, reference=ref_ms, explain=explainer(explain)))
        # A call that needs fresh inputs (a setup) would not be the call timed if called again alone.
        return v if "setup" in bench_kwargs else self._allocation(v, fn)

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

        On a GPU the step's wall time follows the host as much as the device (a launch-bound
        step's GPU idles most of it), so a separate profiled pass also records the device side:
        ``step_device_ms`` (the GPU's busy time per step, the metric a stored GPU budget gates),
        and ``kernel_count`` (see :meth:`~perfbudget.recorder.gpu.Gpu._device_time`);
        stored budgets of ``step_ms`` and ``throughput_samples_per_s`` are advisory there.
        On a CPU the wall time is the device's time: none of these is recorded.

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
            On a GPU followed by ``kernel_count`` and ``step_device_ms`` (or, when the trace holds
            no device work, ``step_device_ms`` unmeasurable).
            When the step is counted instead: the one ``instructions[callgrind]`` verdict.
        """
        if samples_per_step < 1:
            raise ValueError(f"samples_per_step must be >= 1, got {samples_per_step!r}")
        if self.counted_steps is not None:
            counted = self.counted_steps
            return (self.instructions(step, steps=counted.steps, warmup=counted.warmup, counter="callgrind"),)
        self._fails_with(step)
        passes = Passes(self._timer(step, reference, min_samples=min_samples, max_ms=max_ms, warmup_ms=warmup_ms))

        def rate(t: Timed) -> list[float]:
            return [samples_per_step * 1e3 / x for x in t.samples_ms]

        # One profile explains both step_ms and step_device_ms when both fail.
        explain = functools.cache(self._operator_explanation(step)) if explain_operators else None
        wall = (self._allocation(self._record("step_ms", passes.measurement(samples_ms, reference=ref_ms, explain=explain)),
                                 step),
                self._record("throughput_samples_per_s", passes.measurement(rate, reference=ref_ms)))
        return wall + self._device_time(step, passes, explain=explain) if self._dev == "cuda" else wall

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
