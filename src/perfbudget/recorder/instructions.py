"""Instructions per step: callgrind's count (or the CPU's counter), with the heaviest functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from ..extras import InstructionProfile
from ..measure import instructions as counting
from ..measure.measurement import Explanation, Measurement
from ..measure.unmeasurable import Unmeasurable
from ..verdict.judge import Verdict
from .core import RecorderCore

__all__ = ["Instructions"]


class Instructions(RecorderCore):
    """``perf.instructions``."""

    METRICS: ClassVar[tuple[str, ...]] = ("instructions",)

    def instructions(self, step: Callable[[], Any], *, steps: int = 20, warmup: int = 10,
                     counter: Literal["auto", "callgrind", "hardware"] = "auto") -> Verdict:
        """Record ``instructions[callgrind]`` (or ``instructions[hardware]``) per call of ``step``.

        Counted by callgrind when the session runs under it, else by the CPU's counter where one
        opens, else unmeasurable with how to run it (docs/writing-tests.md). A callgrind count
        leaves out history-dependent functions and keeps its heaviest functions with the record.

        Args:
            step: zero-argument callable counted per call.
            steps: counted calls, after ``warmup`` uncounted ones.
            warmup: uncounted calls first.
            counter: ``auto``, ``callgrind`` or ``hardware``.
        """
        got = counting.instructions(step, steps=steps, warmup=warmup, counter=counter)
        if isinstance(got, Unmeasurable):
            return self.unmeasurable(f"instructions[{'hardware' if counter == 'hardware' else 'callgrind'}]",
                                     got.reason)
        metric = f"instructions[{'callgrind' if got.dump is not None else 'hardware'}]"
        extra: dict[str, Any] = {}
        if got.dump is not None:
            dump = got.parsed or counting.read_dump(got.dump)
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
