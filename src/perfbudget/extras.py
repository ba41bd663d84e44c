"""Typed ``extra`` payloads of records: one type per key, written and read through it, so a plot never reads nothing."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .measure.instructions import moves_between
from .measure.operators import OpMove, OpRow, moved_operators
from .measure.padding import padding_rate_by_width
from .metrics import UNIT
from .vocabulary import Outcome

if TYPE_CHECKING:
    from .measure.operators import OpTable

__all__ = [
    "FAILURE_ARTIFACTS",
    "INSTRUCTION_PROFILE",
    "MOVED_OPERATORS",
    "OPERATOR_TABLE",
    "PADDING_BY_WIDTH",
    "ExtraError",
    "FailureArtifacts",
    "InstructionProfile",
    "OperatorMoves",
    "OperatorTable",
    "PaddingByWidth",
]

#: Key of :class:`PaddingByWidth` in a record's ``extra``.
PADDING_BY_WIDTH = "padding_by_width"
#: Key of :class:`OperatorTable` in a record's ``extra``.
OPERATOR_TABLE = "ops"
#: Key of :class:`FailureArtifacts` in a record's ``extra``.
FAILURE_ARTIFACTS = "artifacts"
#: Key of :class:`OperatorMoves` in a record's ``extra``.
MOVED_OPERATORS = "moved_ops"
#: Key of :class:`InstructionProfile` in a record's ``extra``.
INSTRUCTION_PROFILE = "instruction_profile"


class ExtraError(ValueError):
    """A record's ``extra`` holds a known key with a value of the wrong shape."""


def _number(key: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ExtraError(f"extra[{key!r}]: expected a number, got {x!r}")
    return float(x)


def _rate(key: str, x: Any) -> float:
    value = _number(key, x)
    if not 0.0 <= value <= 1.0:
        raise ExtraError(f"extra[{key!r}]: expected a padding rate in [0, 1], got {x!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class PaddingByWidth:
    """Padding rate per padded width (which batch shapes waste tokens), drawn by the HTML report."""

    widths: tuple[int, ...]
    """Padded widths (tokens per sequence), ascending."""
    rates: tuple[float, ...]
    """Padding rate (pad tokens / computed tokens, 0-1) of the batches padded to each width."""
    sorted_rate: float | None = None
    """Padding rate of length-sorted batching over the same lengths: the lower bound to compare with."""

    def __post_init__(self) -> None:
        key = PADDING_BY_WIDTH
        if len(self.widths) != len(self.rates):
            raise ExtraError(f"{key}: {len(self.widths)} widths but {len(self.rates)} rates")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.widths):
            raise ExtraError(f"{key}.widths: expected positive integers, got {list(self.widths)!r}")
        if list(self.widths) != sorted(set(self.widths)):
            raise ExtraError(f"{key}.widths: expected distinct widths in ascending order, got {list(self.widths)!r}")
        for w, r in zip(self.widths, self.rates, strict=True):
            _rate(f"{key}.rates[{w}]", r)
        if self.sorted_rate is not None:
            _rate(f"{key}.sorted_rate", self.sorted_rate)

    @classmethod
    def from_batches(
        cls,
        lengths_per_batch: Iterable[Sequence[int]],
        padded_len_per_batch: Iterable[int],
        *,
        sorted_rate: float | None = None,
    ) -> PaddingByWidth:
        """Group batches by the width they were padded to and account each group's padding.

        Args:
            lengths_per_batch: for each batch, the true length of every sequence in it.
            padded_len_per_batch: for each batch, the length it was padded to.
            sorted_rate: the length-sorted lower bound (``measure.padding.sorted_batching_padding_rate``).

        Raises:
            ValueError: batch counts differ, or a sequence is longer than its padded width.
        """
        by_width = padding_rate_by_width(lengths_per_batch, padded_len_per_batch)
        return cls(widths=tuple(by_width), rates=tuple(by_width.values()), sorted_rate=sorted_rate)

    def to_extra(self) -> dict[str, Any]:
        """``{"padding_by_width": {"widths": [...], "rates": [...], "sorted_rate": ...}}``."""
        return {PADDING_BY_WIDTH: {"widths": list(self.widths), "rates": list(self.rates),
                                   "sorted_rate": self.sorted_rate}}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> PaddingByWidth | None:
        """Read it back from a record's ``extra``; ``None`` when the key is absent.

        Raises:
            ExtraError: naming the key and the bad value.
        """
        value = extra.get(PADDING_BY_WIDTH)
        if value is None:
            return None
        key = PADDING_BY_WIDTH
        if not isinstance(value, Mapping):
            raise ExtraError(f"extra[{key!r}]: expected a mapping, got {value!r}")
        widths, rates = value.get("widths"), value.get("rates")
        if not isinstance(widths, list) or not isinstance(rates, list):
            raise ExtraError(f"extra[{key!r}]: expected lists 'widths' and 'rates', got {dict(value)!r}")
        if any(isinstance(w, bool) or not isinstance(w, int) for w in widths):
            raise ExtraError(f"extra[{key!r}].widths: expected positive integers, got {widths!r}")
        sorted_rate = value.get("sorted_rate")
        return cls(
            widths=tuple(widths),
            rates=tuple(_rate(f"{key}.rates", r) for r in rates),
            sorted_rate=None if sorted_rate is None else _rate(f"{key}.sorted_rate", sorted_rate),
        )


@dataclass(frozen=True, kw_only=True)
class OperatorTable:
    """The heaviest operators of a profiled step, for the per-operator plot and ``perfbudget diff``."""

    rows: tuple[OpRow, ...]
    """Operators, heaviest self time first (``measure.operators.OpRow``; shapes and roofline not kept)."""

    @classmethod
    def of(cls, table: OpTable, *, k: int = 25) -> OperatorTable:
        """The ``k`` heaviest rows of a ``measure.operators.OpTable``."""
        return cls(rows=tuple(table.top(k)))

    def to_extra(self) -> dict[str, Any]:
        """``{"ops": [{"name", "self_ms", "calls", "share", "total_ms", "flops"}, ...]}``."""
        return {OPERATOR_TABLE: [{"name": r.name, "self_ms": r.self_ms, "calls": r.calls, "share": r.share,
                                  "total_ms": r.total_ms, "flops": r.flops} for r in self.rows]}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> OperatorTable | None:
        """Read it back from a record's ``extra`` (``share``, ``total_ms``, ``flops`` default to 0); ``None`` when absent.

        Raises:
            ExtraError: naming the key, the row and the bad value.
        """
        value = extra.get(OPERATOR_TABLE)
        if value is None:
            return None
        if not isinstance(value, list):
            raise ExtraError(f"extra[{OPERATOR_TABLE!r}]: expected a list of operator rows, got {value!r}")
        rows = []
        for i, row in enumerate(value):
            where = f"{OPERATOR_TABLE}[{i}]"
            if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
                raise ExtraError(f"extra[{where!r}]: expected a mapping with a 'name', got {row!r}")
            rows.append(OpRow(
                name=row["name"], self_ms=_number(f"{where}.self_ms", row.get("self_ms")),
                calls=_number(f"{where}.calls", row.get("calls", 0)),
                share=_number(f"{where}.share", row.get("share", 0.0)),
                total_ms=_number(f"{where}.total_ms", row.get("total_ms", 0.0)),
                flops=_number(f"{where}.flops", row.get("flops", 0.0)),
            ))
        rows.sort(key=lambda r: -r.self_ms if math.isfinite(r.self_ms) else 0.0)
        return cls(rows=tuple(rows))


_AGAINST = ("budget", "base", "table")
#: A family of per-operator metrics (``op_self_ms``).
_FAMILY = re.compile(r"[a-z][a-z0-9_]{0,39}")
#: The most characters of an operator's name (a name in a results file), and of the note.
_MAX_OP = 1_000
_MAX_NOTE = 200


def _text(key: str, x: Any, limit: int, pattern: re.Pattern[str] | None = None) -> str:
    """A string of at most ``limit`` characters (of ``pattern`` where given)."""
    if not isinstance(x, str) or len(x) > limit or (pattern is not None and not pattern.fullmatch(x)):
        shown = f"{x[:80]!r}..." if isinstance(x, str) and len(x) > 80 else repr(x)
        rule = f"matching {pattern.pattern}" if pattern is not None else f"of at most {limit} characters"
        raise ExtraError(f"extra[{key!r}]: expected a string {rule}, got {shown}")
    return x


def _optional_number(key: str, x: Any) -> float | None:
    return None if x is None else _number(key, x)


@dataclass(frozen=True, kw_only=True)
class OperatorMoves:
    """The operators that moved, kept with a failing record: computed where the verdicts are, rendered by reports."""

    moves: tuple[OpMove, ...]
    """The moved operators, in the rule's order (finite numbers only: JSON has no inf)."""
    note: str = ""
    """How they were found when not by the test's own checks, e.g. ``"profiled when step_ms failed"``."""

    @classmethod
    def of(cls, candidates: Iterable[OpMove], *, note: str = "", k: int = 5) -> OperatorMoves:
        """The ``k`` operators of ``candidates`` that moved, by :func:`~perfbudget.measure.operators.moved_operators`."""
        return cls(moves=moved_operators(candidates, k=k), note=note)

    def to_extra(self) -> dict[str, Any]:
        """``{"moved_ops": {"note": ..., "moves": [{"op", "family", "before", "after", ...}, ...]}}``."""
        return {MOVED_OPERATORS: {"note": self.note, "moves": [asdict(m) for m in self.moves]}}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> OperatorMoves | None:
        """Read it back from a record's ``extra``; ``None`` when the key is absent.

        Raises:
            ExtraError: naming the key, the move and the bad value.
        """
        value = extra.get(MOVED_OPERATORS)
        if value is None:
            return None
        key = MOVED_OPERATORS
        if not isinstance(value, Mapping) or not isinstance(value.get("moves"), list):
            raise ExtraError(f"extra[{key!r}]: expected {{'moves': [...], 'note': ...}}, got {value!r}")
        moves = []
        for i, m in enumerate(value["moves"]):
            where = f"{key}.moves[{i}]"
            if not isinstance(m, Mapping) or not isinstance(m.get("op"), str) or not isinstance(m.get("family"), str):
                raise ExtraError(f"extra[{where!r}]: expected a mapping with 'op' and 'family', got {m!r}")
            if m.get("against", "budget") not in _AGAINST:
                raise ExtraError(f"extra[{where!r}].against: expected one of {_AGAINST}, got {m.get('against')!r}")
            outcome = m.get("outcome", "")
            if outcome != "" and outcome not in set(Outcome):
                raise ExtraError(f"extra[{where!r}].outcome: expected an outcome ({', '.join(Outcome)}) or '', "
                                 f"got {outcome!r:.100}")
            moves.append(OpMove(
                op=_text(f"{where}.op", m["op"], _MAX_OP), family=_text(f"{where}.family", m["family"], 40, _FAMILY),
                against=m.get("against", "budget"), unit=_text(f"{where}.unit", m.get("unit", ""), 16, UNIT),
                before=_optional_number(f"{where}.before", m.get("before")),
                after=_optional_number(f"{where}.after", m.get("after")),
                tolerance=_number(f"{where}.tolerance", m.get("tolerance", 0.0)),
                failing=bool(m.get("failing", False)), outcome=str(outcome),
                ratio=_optional_number(f"{where}.ratio", m.get("ratio")),
            ))
        return cls(moves=tuple(moves), note=_text(f"{key}.note", value.get("note", ""), _MAX_NOTE))


@dataclass(frozen=True, kw_only=True)
class FailureArtifacts:
    """Files written for a failing check (chrome trace, flame graph, memory snapshot), by label."""

    paths: tuple[tuple[str, str], ...]
    """``(label, path)`` pairs, e.g. ``("chrome trace", ".perfbudget/artifacts/t.py__test/trace.json")``."""

    @classmethod
    def of(cls, paths: Mapping[str, str]) -> FailureArtifacts:
        return cls(paths=tuple((str(k), str(v)) for k, v in paths.items()))

    def to_extra(self) -> dict[str, Any]:
        """``{"artifacts": {label: path}}``."""
        return {FAILURE_ARTIFACTS: dict(self.paths)}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> FailureArtifacts | None:
        """Read it back from a record's ``extra``; ``None`` when the key is absent.

        Raises:
            ExtraError: naming the key and the bad value.
        """
        value = extra.get(FAILURE_ARTIFACTS)
        if value is None:
            return None
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise ExtraError(f"extra[{FAILURE_ARTIFACTS!r}]: expected {{label: path}}, got {value!r}")
        return cls.of(value)


@dataclass(frozen=True, kw_only=True)
class InstructionProfile:
    """The heaviest functions of one callgrind dump, per step, kept so two records compare without their dumps."""

    counter: str
    """The counter of the count the profile belongs to (``callgrind Ir``)."""
    functions: tuple[tuple[str, float, float], ...]
    """``(function, self per step, inclusive per step)``, heaviest inclusive first (history-dependent too)."""
    history_dependent_per_step: float = 0.0
    """Instructions per step in history-dependent functions (allocators, lookups), left out of the value."""

    @classmethod
    def of(cls, counter: str, functions: Iterable[tuple[str, float, float]], *, k: int = 40,
           history_dependent_per_step: float = 0.0) -> InstructionProfile:
        rows = sorted(((str(f), float(s), float(i)) for f, s, i in functions), key=lambda r: (-r[2], r[0]))
        return cls(counter=counter, functions=tuple(rows[:k]), history_dependent_per_step=history_dependent_per_step)

    def to_extra(self) -> dict[str, Any]:
        """``{"instruction_profile": {"counter", "functions": [[name, self, inclusive], ...], ...}}``."""
        return {INSTRUCTION_PROFILE: {"counter": self.counter, "functions": [list(r) for r in self.functions],
                                      "history_dependent_per_step": self.history_dependent_per_step}}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> InstructionProfile | None:
        """Read it back from a record's ``extra``; ``None`` when the key is absent.

        Raises:
            ExtraError: naming the key and the bad value.
        """
        value = extra.get(INSTRUCTION_PROFILE)
        if value is None:
            return None
        rows = value.get("functions") if isinstance(value, Mapping) else None
        ok = isinstance(rows, list) and all(
            isinstance(r, list) and len(r) == 3 and isinstance(r[0], str)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in r[1:]) for r in rows)
        left_out = value.get("history_dependent_per_step", 0.0) if isinstance(value, Mapping) else None
        if not isinstance(left_out, (int, float)) or isinstance(left_out, bool):
            ok = False
        if not ok or not isinstance(value.get("counter"), str):
            raise ExtraError(f"extra[{INSTRUCTION_PROFILE!r}]: expected {{'counter': str, 'functions': "
                             f"[[name, self, inclusive], ...], 'history_dependent_per_step': number}}, got {value!r}")
        return cls(counter=value["counter"], functions=tuple((r[0], float(r[1]), float(r[2])) for r in rows or ()),
                   history_dependent_per_step=float(left_out or 0.0))

    def moved_against(self, before: InstructionProfile, k: int = 8) -> list[str]:
        """Readable lines: the functions whose inclusive instructions per step moved most from ``before``."""
        every = len(before.functions) + len(self.functions)
        moves = [m for m in moves_between({f: (s, i) for f, s, i in before.functions},
                                          {f: (s, i) for f, s, i in self.functions}, every)
                 if m.delta_per_step][:k]
        return [f"{m.function}: {m.before_per_step:,.0f} -> {m.after_per_step:,.0f} per step "
                f"({m.delta_per_step:+,.0f})" for m in moves]

    def top_lines(self, k: int = 8) -> list[str]:
        """Readable lines: the heaviest functions by inclusive instructions per step."""
        return [f"{f}: {i:,.0f} per step inclusive, {s:,.0f} self" for f, s, i in self.functions[:k]]
