"""What a test measured, collected under its budget key: the public measuring API behind ``perf``."""

from __future__ import annotations

from ..extras import OperatorMoves
from ..results import Record
from ..verdict.judge import Decision, Judge
from ..vocabulary import Outcome
from .compiling import Compiling
from .core import RecorderCore
from .energy import Energy
from .gpu import Gpu
from .instructions import Instructions
from .memory import Memory
from .numerics import Numerics
from .operators import NEW_OP_SHARE_CHECK, NEW_OP_SHARE_UPDATE, OP_ROUND_STEPS, OP_ROUNDS, Operators
from .serving import SERVE_ROUNDS, ServeRound, Serving
from .timing import CountedSteps, Timing

__all__ = ["FAMILIES", "NEW_OP_SHARE_CHECK", "NEW_OP_SHARE_UPDATE", "OP_ROUNDS", "OP_ROUND_STEPS", "SERVE_ROUNDS",
           "CountedSteps", "PerfRecorder", "RecorderCore", "ServeRound"]

class PerfRecorder(Timing, Serving, Operators, Instructions, Memory, Compiling, Numerics, Gpu, Energy):
    """Records a test's measurements under its budget key (the ``perf`` fixture).

    Args:
        judge: decides each metric against the budgets (it knows key, device, budgets).
        nodeid: the test's id (for records and the update command).
        update_command: the command that creates missing budgets, for skip messages.
        threads: torch threads for CPU timing (``None``: leave the process's setting).
        counted_steps: :meth:`step` counts instructions instead of timing (see :class:`CountedSteps`).
        lease: lease-sized work (:mod:`perfbudget.lease`).
    """

    def __init__(self, judge: Judge, *, nodeid: str = "", update_command: str = "", threads: int | None = 1,
                 counted_steps: CountedSteps | None = None, lease: bool = False) -> None:
        super().__init__(judge, nodeid=nodeid, update_command=update_command, threads=threads, lease=lease)
        self.counted_steps = counted_steps

    def records(self) -> list[Record]:
        """Records of every verdict; failing ones carry the operators that moved unless already named."""
        moved = self._operator_moves()
        out = []
        for v in self.verdicts:
            extra = dict(self.extras.get(v.metric, {}))
            if v.outcome == Outcome.FAIL and moved.moves and OperatorMoves.from_extra(extra) is None:
                extra.update(moved.to_extra())
            out.append(Record.from_verdict(v, nodeid=self.nodeid, device=self.device, extra=extra))
        return out

    def decision(self) -> Decision:
        """What the recorded verdicts mean for the test (data; the report renders it)."""
        return self.judge.decision(self.verdicts)


#: The measurement families a :class:`PerfRecorder` offers: its bases, in order.
FAMILIES: tuple[type[RecorderCore], ...] = PerfRecorder.__bases__
