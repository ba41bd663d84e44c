"""Per-operator attribution: self time, share, calls and FLOPs of each operator, and what moved."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from ..budgets.schema import Budget
from ..extras import OperatorMoves
from ..lease import LEASE_OP_ROUNDS
from ..measure import stats
from ..measure.measurement import Explanation, Measurement, Passes
from ..measure.operators import OpMove, OpRounds, count_flops, profile_rounds
from ..measure.reference import machine_reference
from ..metrics import METRICS, OP_METRIC_FAMILIES, op_metric
from ..verdict.judge import Verdict
from ..verdict.rule import tolerance_for
from ..vocabulary import Outcome
from .core import RecorderCore

__all__ = ["NEW_OP_SHARE_CHECK", "NEW_OP_SHARE_UPDATE", "OP_ROUNDS", "OP_ROUND_STEPS", "Operators"]

#: Profiled rounds behind each per-operator sample set, of :data:`OP_ROUND_STEPS` steps each: many
#: rounds of one step halve a pair's variance at the cost of fewer longer ones (benchmarks/op-pairing-cpu.md).
OP_ROUNDS = 32
OP_ROUND_STEPS = 1
#: Operators above this share of the step get budgets when budgets are written...
NEW_OP_SHARE_UPDATE = 0.05
#: ...and a new operator must pass this share before a check run calls it unbudgeted (no flipping at 5 %).
NEW_OP_SHARE_CHECK = 0.07
#: A failing step is explained by the operators above this share of it, with the budgeted ones.
_EXPLAIN_MIN_SHARE = 0.02


class Operators(RecorderCore):
    """``perf.operators`` and ``perf.flops``; names the operators behind any failure."""

    METRICS: ClassVar[tuple[str, ...]] = (*OP_METRIC_FAMILIES, "flops")

    def operators(
        self,
        step: Callable[[], Any],
        *,
        rounds: int | None = None,
        steps: int = OP_ROUND_STEPS,
        families: Sequence[str] = OP_METRIC_FAMILIES,
        reference: bool = False,
    ) -> Any:
        """Record per-operator self time, share of the step and call counts.

        Records every operator budgeted for the key, plus new ones above :data:`NEW_OP_SHARE_UPDATE`
        when writing budgets, :data:`NEW_OP_SHARE_CHECK` when checking.

        Args:
            step: one full step.
            rounds: profiled rounds per sample set (default :data:`OP_ROUNDS`; fewer under the lease).
            steps: steps per profiled round.
            families: which of ``op_self_ms``, ``op_share``, ``op_count`` to record.
            reference: normalise self times by a machine-speed reference timed before each round.

        Returns:
            The first :class:`~perfbudget.measure.operators.OpRounds`.
        """
        unknown = set(families) - set(OP_METRIC_FAMILIES)
        if unknown or not families:
            raise ValueError(f"families must be some of {OP_METRIC_FAMILIES}, got {tuple(families)!r}")
        ref = machine_reference(self._dev) if reference else None
        self._fails_with(step)
        n = rounds if rounds is not None else LEASE_OP_ROUNDS if self.lease else OP_ROUNDS
        passes = Passes(lambda: profile_rounds(step, rounds=n, steps=steps, device=self._dev, reference=ref))
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
        """Which operators :meth:`operators` records, heaviest first: the budgeted ones plus new ones."""
        ops = set(self._op_budgets(OP_METRIC_FAMILIES))
        pinned = self.judge.config.judging.pinned_operators(self.nodeid, self.key)
        if pinned is not None:  # an A/B run's sides record the same operators in every pair
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
                       after=stats.median(rounds.self_ms(op)), unit="ms",
                       tolerance=tolerance_for(METRICS["op_self_ms"], b).value)
                for op in sorted(set(budgets) | set(rounds.top(_EXPLAIN_MIN_SHARE))) for b in [budgets.get(op)]
            ]
            moves = OperatorMoves.of(candidates, note="profiled when step_ms failed, vs the op_self_ms budgets")
            return Explanation(extra=moves.to_extra())

        return explain

    def _operator_moves(self) -> OperatorMoves:
        """This test's budgeted per-operator checks as moves against their budgets."""
        out = []
        for v in self.verdicts:
            parsed = op_metric(v.metric)
            if parsed is None or v.budget is None or v.value is None or not math.isfinite(v.value):
                continue
            out.append(OpMove(op=parsed[1], family=parsed[0], before=v.budget.value, after=v.value,
                              unit=v.info.unit, tolerance=tolerance_for(v.info, v.budget).value,
                              failing=v.outcome in (Outcome.FAIL, Outcome.ERROR), outcome=v.outcome))
        return OperatorMoves.of(out)
