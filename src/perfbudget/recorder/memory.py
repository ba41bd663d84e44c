"""Peak memory of each phase of a training step (forward, backward, optimizer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ..measure import memory as peaks_of
from ..measure.measurement import Measurement
from ..verdict.judge import Verdict
from .core import RecorderCore

__all__ = ["Memory"]


class Memory(RecorderCore):
    """``perf.memory``."""

    METRICS: ClassVar[tuple[str, ...]] = ("peak_allocated_mib",)

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

        Pass the timed workload's own phases (precision, batch) so the budget describes what is timed.

        Args:
            forward: returns the loss.
            backward: takes the loss (default ``loss.backward()``).
            optimizer: an optimizer, a zero-argument callable, or ``None`` (no optimizer phase).
            warmup: unmeasured steps first (the first step allocates optimizer state).
            names: phase renames for the metric argument (``{"backward": "backward_and_optimizer"}``).
        """
        self._fails_with(peaks_of.training_step(forward, backward=backward, optimizer=optimizer))
        peaks = peaks_of.peak_by_phase(forward, backward=backward, optimizer=optimizer, device=self._dev,
                                     warmup=warmup, threads=self._timing_threads())
        phases = {(names or {}).get(phase, phase): mib for phase, mib in peaks.by_phase().items()}
        return {phase: self._record(f"peak_allocated_mib[{phase}]", Measurement(samples=mib))
                for phase, mib in phases.items()}
