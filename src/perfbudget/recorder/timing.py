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
    after ``warmup`` uncounted ones; set for a test marked ``instructions`` under callgrind."""

    steps: int = 20
    warmup: int = 10

    def __post_init__(self) -> None:
        for name, least in (("steps", 1), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


class Timing(Operators, Instructions, Gpu):
    """``perf.time``, ``perf.step`` and ``perf.speedup``."""

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
            reference: ``True`` (the machine-speed reference) or a callable timed alternately
                with ``fn`` to normalise samples; ``None``: plain timing.
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

        A failing step time is explained by the operators that moved. On a GPU a profiled pass
        also records ``kernel_count`` and ``step_device_ms``, which gates there (docs/gpu-runners.md).
        In a test marked ``instructions`` under callgrind the step is counted, not timed
        (:class:`CountedSteps`, docs/writing-tests.md).

        Args:
            step: one full step (zero-argument callable).
            samples_per_step: samples per step, for samples/s.
            reference: as in :meth:`time` (default: none).
            explain_operators: profile the step on failure to name the operators that moved.
            min_samples, max_ms, warmup_ms: as in :func:`~perfbudget.measure.timing.bench`.

        Returns:
            The ``step_ms`` and ``throughput_samples_per_s`` verdicts, on a GPU then ``kernel_count``
            and ``step_device_ms``; when counted, the one ``instructions[callgrind]`` verdict.
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

        The two alternate, so the machine's drift hits both; each round gives one ratio.

        Args:
            what: the bracket argument (``speedup[bucketing]``).
            baseline, lever: zero-argument callables doing the same work two ways.
            rounds: ratios per sample set (one warm-up round runs first).
        """
        if rounds < 2:
            raise ValueError(f"rounds must be >= 2, got {rounds!r}")

        def ratios() -> list[float]:
            a, b = bench_paired(baseline, lever, device=self._dev, threads=self._timing_threads(), warmup_ms=0,
                                min_samples=rounds, max_ms=0, min_warmup_calls=1)
            return [x / y for x, y in zip(a.samples_ms, b.samples_ms, strict=True)]

        return self._record(f"speedup[{what}]", Passes(ratios).measurement(_itself, attribution=attribution))
