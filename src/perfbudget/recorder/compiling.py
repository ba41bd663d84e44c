"""torch.compile's health: graph breaks, unique graphs, compile time by cache state, recompiles."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

from ..measure import compile_health
from ..measure.measurement import Measurement
from .core import RecorderCore

__all__ = ["Compiling"]


class Compiling(RecorderCore):
    """``perf.compile_health`` and ``perf.no_recompiles``."""

    METRICS: ClassVar[tuple[str, ...]] = ("graph_breaks", "unique_graphs", "compile_s", "recompiles")

    def compile_health(self, report: Any) -> None:
        """Record ``graph_breaks`` (with reasons), ``unique_graphs`` and ``compile_s[cold|warm]``.

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
        """Record ``recompiles`` of the block under ``fail_on_recompile``: one stops it, naming the guard."""
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
