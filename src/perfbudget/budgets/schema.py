"""Typed budget data: budget files, entries, provenance, and the errors that name their place."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..device import DeviceInfo, Selector

__all__ = [
    "PROVENANCE_FIELDS",
    "SCHEMA_VERSION",
    "Budget",
    "BudgetError",
    "BudgetFile",
    "Provenance",
]

SCHEMA_VERSION = 1

class BudgetError(ValueError):
    """Bad budget input: ``budgets/cpu.yaml:12: budgets.enc.step_ms.tolerance: expected ..., got '5%'``."""


    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        keypath: tuple[str, ...] = (),
        value: Any = ...,
    ) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.line = line
        self.keypath = keypath
        self.value = value
        super().__init__(str(self))

    @property
    def key(self) -> str:
        return ".".join(self.keypath)

    def __str__(self) -> str:
        where = self.path or "<budgets>"
        if self.line is not None:
            where += f":{self.line}"
        key = f" {self.key}:" if self.keypath else ""
        got = f", got {_clip(repr(self.value))}" if self.value is not ... else ""
        return f"{where}:{key} {self.message}{got}"


def _clip(text: str, limit: int = 80) -> str:
    """A long offending value, shortened so the message stays one readable line."""
    return text if len(text) <= limit else f"{text[: limit - 12]}...{text[-8:]}"


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where a budget value came from (written by the updater, read by reviewers).

    Attributes:
        identity: the measuring machine's identity (``DeviceInfo.identity``), when known.
        samples: number of samples behind the value.
        commit: the commit measured (``update.provenance_commit``); ``unknown`` when none named
            it; ``None`` in files written before it was recorded.
        cv: coefficient of variation of the samples (timing noise).
        noise: relative standard error of the budgeted statistic (from its CI).
        threads: torch threads used for CPU timing.
        ref_ms: median time of the machine-speed reference workload beside the value (``measure.reference``).
        reason: why a reviewer accepted the value (``perfbudget accept``).
    """

    device: str | None = None
    identity: str | None = None
    torch: str | None = None
    samples: int | None = None
    date: str | None = None
    commit: str | None = None
    cv: float | None = None
    noise: float | None = None
    threads: int | None = None
    ref_ms: float | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in PROVENANCE_FIELDS if getattr(self, k) is not None}


#: Keys a ``provenance:`` block may hold (written by the updater): the fields of :class:`Provenance`.
PROVENANCE_FIELDS = tuple(f.name for f in fields(Provenance))


@dataclass(frozen=True, kw_only=True)
class Budget:
    """One budget: a value and a relative tolerance for one metric of one workload key.

    Attributes:
        metric: full metric name (``op_self_ms[aten::mm]``).
        value: budget value in the metric's unit.
        tolerance: relative tolerance in [0, 1] in the bad direction.
        ab_tolerance: the head/base ratio's tolerance in an A/B run, when not the metric's default
            (``tolerance`` may carry a floor for between-process noise, which taking turns removes).
        line: line of the metric in the file, when known.
        note: free text kept by the updater: why the value or tolerance is what it is.
    """

    key: str
    metric: str
    value: float
    tolerance: float
    source: str
    line: int | None = None
    provenance: Provenance | None = None
    ab_tolerance: float | None = None
    note: str | None = None


@dataclass(kw_only=True)
class BudgetFile:
    """A parsed budget file; ``errors`` holds what failed validation.

    An error outside ``budgets.<key>`` (or any error without a usable device block) makes the file's
    budgets unknown on every device, so the run fails; an entry error affects only that key's tests.
    """

    path: Path
    selector: Selector | None
    entries: dict[str, dict[str, Budget]] = field(default_factory=dict)
    errors: list[BudgetError] = field(default_factory=list)
    note: str | None = None

    @property
    def file_errors(self) -> list[BudgetError]:
        """Errors that make the whole file unusable; every error of an unusable file."""
        if self.selector is None or any(not _is_entry_error(e) for e in self.errors):
            return list(self.errors)
        return []

    @property
    def entry_errors(self) -> list[BudgetError]:
        """Errors confined to one workload key of a usable file."""
        return [] if self.file_errors else list(self.errors)

    def key_errors(self, key: str) -> list[BudgetError]:
        return [e for e in self.entry_errors if e.keypath[:2] == ("budgets", key)]

    @property
    def usable(self) -> bool:
        return self.selector is not None and not self.file_errors

    def matches(self, info: DeviceInfo) -> bool:
        return self.selector is not None and self.selector.matches(info)


def _is_entry_error(e: BudgetError) -> bool:
    return len(e.keypath) >= 2 and e.keypath[0] == "budgets"
