"""Results of a run as plain JSON records: write, read, merge shards, feed the updater."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budgets.schema import Budget
from .budgets.update import Measured
from .budgets.verdict import Verdict
from .device import DeviceInfo

__all__ = ["RESULTS_SCHEMA", "Record", "Results", "load_results", "merge_results"]

RESULTS_SCHEMA = 1


def _num(x: float | None) -> float | None:
    # JSON has no NaN/inf: keep them readable as strings rather than invalid JSON.
    if x is None or math.isfinite(x):
        return x
    return str(x)  # type: ignore[return-value]


@dataclass(kw_only=True)
class Record:
    """One metric of one test: the verdict plus where it ran.

    ``budget`` is ``{"value", "tolerance", "source", "line"}`` or ``None``.
    """

    nodeid: str
    key: str
    metric: str
    outcome: str
    value: float | None
    ci: list[float] | None
    n: int
    cv: float | None
    budget: dict[str, Any] | None
    limit: float | None
    rounds: int
    confirmed: bool | None
    reason: str
    samples: list[float]
    attribution: list[str]
    device: dict[str, Any]
    unit: str = ""
    ref_ms: float | None = None
    kind: str = ""
    direction: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_verdict(cls, v: Verdict, *, nodeid: str, device: DeviceInfo, extra: dict[str, Any] | None = None) -> Record:
        info = v.info
        b: Budget | None = v.budget
        return cls(
            nodeid=nodeid, key=v.key, metric=v.metric, outcome=v.outcome, value=_num(v.value),
            ci=[_num(v.ci[0]), _num(v.ci[1])] if v.ci else None,  # type: ignore[list-item]
            n=v.n, cv=v.cv,
            budget=None if b is None else {"value": b.value, "tolerance": b.tolerance, "source": b.source, "line": b.line},
            limit=v.limit, rounds=v.rounds, confirmed=v.confirmed, reason=v.reason,
            samples=[_num(x) for x in v.samples],  # type: ignore[misc]
            attribution=list(v.attribution), device=device.as_dict(),
            unit=info.unit, kind=info.kind, direction=info.direction, extra=dict(extra or {}),
            ref_ms=v.ref_ms,
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def device_info(self) -> DeviceInfo:
        return DeviceInfo(**self.device)

    def measured(self) -> Measured | None:
        """The value the updater may write, or ``None`` for errors and unmeasurable metrics."""
        if self.outcome in ("error", "unmeasurable") or not isinstance(self.value, (int, float)):
            return None
        noise = None
        if self.ci and isinstance(self.ci[0], (int, float)) and isinstance(self.ci[1], (int, float)) and self.value:
            # A 95 % CI spans about 2 x 1.96 standard errors.
            noise = abs(self.ci[1] - self.ci[0]) / (2 * 1.96 * abs(float(self.value)))
        return Measured(key=self.key, metric=self.metric, value=float(self.value), samples=self.n,
                        cv=self.cv, device=self.device_info, ref_ms=self.ref_ms, noise=noise)


@dataclass(kw_only=True)
class Results:
    """All records of a run (or of merged shards)."""

    records: list[Record] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"schema": RESULTS_SCHEMA, "meta": self.meta, "records": [r.as_dict() for r in self.records]}

    def write(self, path: str | Path) -> Path:
        """Write atomically (temp file + rename); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(self.as_dict(), fh, indent=1)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
        return path

    def measured(self) -> list[Measured]:
        return [m for r in self.records if (m := r.measured()) is not None]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out


def load_results(path: str | Path) -> Results:
    """Read a results JSON file written by the plugin.

    Raises:
        ValueError: naming the file when it is not a results file of a known schema.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read results: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != RESULTS_SCHEMA:
        raise ValueError(f"{path}: schema: expected {RESULTS_SCHEMA}, got {data.get('schema') if isinstance(data, dict) else data!r}")
    names = set(Record.__dataclass_fields__)
    try:
        records = [Record(**{k: v for k, v in r.items() if k in names}) for r in data.get("records", [])]
    except TypeError as exc:
        raise ValueError(f"{path}: records: {exc}") from None
    return Results(records=records, meta=dict(data.get("meta", {})))


def merge_results(parts: Iterable[Results]) -> Results:
    """Merge shards (xdist workers or CI matrix jobs) into one, ordered by test and metric."""
    out = Results()
    shards = []
    for p in parts:
        out.records.extend(p.records)
        shards.append(p.meta)
    out.records.sort(key=lambda r: (r.nodeid, r.key, r.metric))
    if shards:
        out.meta = dict(shards[0])
        out.meta["shards"] = len(shards)
    return out
