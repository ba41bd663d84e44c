"""Numerical health: non-finite gradients (naming the first bad parameter) and loss drift."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ..measure import numerics
from ..measure.measurement import Measurement
from ..verdict.judge import Verdict
from .core import RecorderCore

__all__ = ["Numerics"]


class Numerics(RecorderCore):
    """``perf.grads`` and ``perf.loss_drift``."""

    METRICS: ClassVar[tuple[str, ...]] = ("nonfinite_grads", "loss_drift")

    def grads(self, step: Callable[[], Any], model: Any, *, steps: int = 20) -> Verdict:
        """Record ``nonfinite_grads`` over ``steps`` steps, naming the first bad parameter."""
        got = numerics.check_grads(step, model, steps=steps, stop_at_first=False)
        return self._record("nonfinite_grads", Measurement(samples=got.nonfinite_grads, attribution=tuple(got.lines())))

    def loss_drift(self, candidate: Callable[[], Any], reference: Callable[[], Any], *, steps: int = 20) -> Verdict:
        """Record ``loss_drift``: the largest relative loss difference of ``candidate`` vs ``reference`` steps."""
        drift = numerics.compare_to_reference(candidate, reference, steps=steps)
        return self._record("loss_drift", Measurement(samples=drift.max_rel))
