"""Energy per sample or token over windows of >= 1 s (NVML on GPUs, RAPL on CPUs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ..measure import energy
from ..measure.measurement import Passes
from ..verdict.judge import Verdict
from .core import RecorderCore

__all__ = ["Energy"]


class Energy(RecorderCore):
    """``perf.energy``."""

    METRICS: ClassVar[tuple[str, ...]] = ("energy_j_per_sample", "energy_j_per_token")

    def energy(self, fn: Callable[[], Any], *, per_call: int, unit: str = "sample", windows: int = 5) -> Verdict:
        """Record ``energy_j_per_<unit>`` over windows of >= 1 s; unmeasurable where no counter reads.

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
