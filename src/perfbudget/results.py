"""Results of a run as typed records: write, read, merge shards; JSON (and its NaN strings) only at the edge."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .budgets.schema import Budget
from .budgets.update import Measured, measured_value
from .budgets.verdict import Verdict
from .device import DeviceInfo
from .fileio import atomic_write
from .metrics import UnknownMetricError

__all__ = ["RESULTS_SCHEMA", "BaseSide", "BudgetRef", "Record", "Results", "load_results", "merge_results"]

RESULTS_SCHEMA = 1


def _to_json(x: float | None) -> float | str | None:
    # JSON has no NaN/inf: written as strings ("nan", "inf"), read back as floats.
    if x is None or math.isfinite(x):
        return x
    return str(x)


def _from_json(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool):
        raise TypeError(f"expected a number, got {x!r}")
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(x)
    raise TypeError(f"expected a number, got {x!r}")


@dataclass(frozen=True, kw_only=True)
class BudgetRef:
    """The budget a record was judged against, as the record keeps it."""

    value: float
    """Budget value, in the metric's unit."""
    tolerance: float
    """Relative tolerance in the bad direction."""
    source: str
    """Budget file it came from."""
    line: int | None = None
    """Line of the entry in that file, when known."""
    ab_tolerance: float | None = None
    """Tolerance of the head/base ratio in a lockstep A/B run, when the entry sets one."""

    @classmethod
    def of(cls, budget: Budget) -> BudgetRef:
        return cls(value=budget.value, tolerance=budget.tolerance, source=budget.source, line=budget.line,
                   ab_tolerance=budget.ab_tolerance)

    @property
    def where(self) -> str:
        """``budgets/cpu.yaml:12`` (or the file alone), relative to the working folder when under it."""
        source = self.source
        with contextlib.suppress(ValueError):
            source = str(Path(source).resolve().relative_to(Path.cwd().resolve())) if Path(source).is_absolute() else source
        return f"{source}:{self.line}" if self.line else source


@dataclass(frozen=True, kw_only=True)
class BaseSide:
    """What the base commit measured for the same check in a lockstep A/B run."""

    value: float | None
    """The base side's value (median over process pairs for statistical kinds)."""
    samples: tuple[float, ...] = ()
    """The base side's raw samples (all pairs)."""
    ratio: float | None = None
    """head / base (geometric mean over process pairs for statistical kinds)."""
    ratio_ci: tuple[float, float] | None = None
    """CI of the ratio from the process pairs."""
    pairs: int = 0
    """Process pairs behind the ratio."""
    pair_ratios: tuple[float, ...] = ()
    """head / base of each process pair."""
    detectable: float | None = None
    """The smallest change (a fraction, in the bad direction) this run could have resolved as a
    failure at the pairs it got: a statistical check's minimum detectable effect."""


@dataclass(frozen=True, kw_only=True)
class Record:
    """One metric of one test: the verdict plus where it ran. Floats may be NaN here; the
    JSON form writes them as strings."""

    nodeid: str
    key: str
    metric: str
    outcome: str
    value: float | None = None
    ci: tuple[float, float] | None = None
    ci_confidence: float | None = None
    """Coverage of ``ci`` (per-operator families are judged at a higher one)."""
    n: int = 0
    cv: float | None = None
    budget: BudgetRef | None = None
    limit: float | None = None
    rounds: int = 1
    confirmed: bool | None = None
    reason: str = ""
    samples: tuple[float, ...] = ()
    attribution: tuple[str, ...] = ()
    device: DeviceInfo | None = None
    unit: str = ""
    ref_ms: float | None = None
    kind: str = ""
    direction: str = ""
    base: BaseSide | None = None
    """Lockstep A/B: the base commit's side of the comparison."""
    advice: str = ""
    """For an ``advisory`` record: the outcome it would have had where timing gates."""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_verdict(cls, v: Verdict, *, nodeid: str, device: DeviceInfo, extra: Mapping[str, Any] | None = None) -> Record:
        unit, kind, direction = "", "", ""
        # An error record for a misspelt metric keeps its name, with no unit or kind.
        with contextlib.suppress(UnknownMetricError):
            unit, kind, direction = v.info.unit, v.info.kind, v.info.direction
        return cls(
            nodeid=nodeid, key=v.key, metric=v.metric, outcome=v.outcome, value=v.value, ci=v.ci,
            ci_confidence=v.confidence if v.ci else None, n=v.n, cv=v.cv,
            budget=None if v.budget is None else BudgetRef.of(v.budget),
            limit=v.limit, rounds=v.rounds, confirmed=v.confirmed, reason=v.reason,
            samples=tuple(v.samples), attribution=tuple(v.attribution), device=device,
            unit=unit, kind=kind, direction=direction, extra=dict(extra or {}),
            ref_ms=v.ref_ms, advice=v.advice,
        )

    def with_(self, **changes: Any) -> Record:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: NaN/inf as strings, nested types as dicts."""
        b = self.budget
        s = self.base
        return {
            "nodeid": self.nodeid, "key": self.key, "metric": self.metric, "outcome": self.outcome,
            "value": _to_json(self.value),
            "ci": None if self.ci is None else [_to_json(self.ci[0]), _to_json(self.ci[1])],
            "ci_confidence": self.ci_confidence, "n": self.n, "cv": _to_json(self.cv),
            "budget": None if b is None else {"value": b.value, "tolerance": b.tolerance, "source": b.source,
                                              "line": b.line, "ab_tolerance": b.ab_tolerance},
            "limit": _to_json(self.limit), "rounds": self.rounds, "confirmed": self.confirmed, "reason": self.reason,
            "samples": [_to_json(x) for x in self.samples], "attribution": list(self.attribution),
            "device": None if self.device is None else self.device.as_dict(),
            "unit": self.unit, "ref_ms": self.ref_ms, "kind": self.kind, "direction": self.direction,
            "base": None if s is None else {
                "value": _to_json(s.value), "samples": [_to_json(x) for x in s.samples], "ratio": _to_json(s.ratio),
                "ratio_ci": None if s.ratio_ci is None else [_to_json(s.ratio_ci[0]), _to_json(s.ratio_ci[1])],
                "pairs": s.pairs, "pair_ratios": [_to_json(x) for x in s.pair_ratios],
                "detectable": _to_json(s.detectable),
            },
            "advice": self.advice,
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        """Inverse of :meth:`as_dict`. Raises ``TypeError``/``KeyError``/``ValueError`` on bad data."""

        def pair(x: Any) -> tuple[float, float] | None:
            if x is None:
                return None
            lo, hi = (_from_json(y) for y in x)
            if lo is None or hi is None:
                raise TypeError(f"expected two numbers, got {x!r}")
            return (lo, hi)

        def floats(xs: Any) -> tuple[float, ...]:
            return tuple(float(y) for y in (_from_json(x) for x in xs or ()) if y is not None)

        b = d.get("budget")
        s = d.get("base")
        dev = d.get("device")
        known = {f.name for f in fields(DeviceInfo)}
        return cls(
            nodeid=str(d["nodeid"]), key=str(d["key"]), metric=str(d["metric"]), outcome=str(d["outcome"]),
            value=_from_json(d.get("value")), ci=pair(d.get("ci")), ci_confidence=d.get("ci_confidence"),
            n=int(d.get("n", 0)), cv=_from_json(d.get("cv")),
            budget=None if not b else BudgetRef(value=float(b["value"]), tolerance=float(b["tolerance"]),
                                                 source=str(b.get("source", "")), line=b.get("line"),
                                                 ab_tolerance=_from_json(b.get("ab_tolerance"))),
            limit=_from_json(d.get("limit")), rounds=int(d.get("rounds", 1)), confirmed=d.get("confirmed"),
            reason=str(d.get("reason", "")), samples=floats(d.get("samples")),
            attribution=tuple(str(a) for a in d.get("attribution", ())),
            device=None if not dev else DeviceInfo(**{k: v for k, v in dev.items() if k in known}),
            unit=str(d.get("unit", "")), ref_ms=_from_json(d.get("ref_ms")), kind=str(d.get("kind", "")),
            direction=str(d.get("direction", "")),
            base=None if not s else BaseSide(
                value=_from_json(s.get("value")), samples=floats(s.get("samples")), ratio=_from_json(s.get("ratio")),
                ratio_ci=pair(s.get("ratio_ci")), pairs=int(s.get("pairs", 0)), pair_ratios=floats(s.get("pair_ratios")),
                detectable=_from_json(s.get("detectable")),
            ),
            advice=str(d.get("advice", "")),
            extra=dict(d.get("extra") or {}),
        )

    def measured(self) -> Measured | None:
        """The value the updater may write, or ``None`` for errors and unmeasurable metrics."""
        if self.outcome in ("error", "unmeasurable") or self.value is None or self.device is None:
            return None
        return measured_value(key=self.key, metric=self.metric, value=self.value, n=self.n, cv=self.cv,
                              device=self.device, ci=self.ci, confidence=self.ci_confidence, ref_ms=self.ref_ms)


@dataclass(kw_only=True)
class Results:
    """All records of a run (or of merged shards)."""

    records: list[Record] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"schema": RESULTS_SCHEMA, "meta": self.meta, "records": [r.as_dict() for r in self.records]}

    def write(self, path: str | Path) -> Path:
        """Write atomically (:func:`perfbudget.fileio.atomic_write`); returns the path."""
        return atomic_write(path, json.dumps(self.as_dict(), indent=1))

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
    records = []
    for i, r in enumerate(data.get("records", [])):
        try:
            records.append(Record.from_dict(r))
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: records[{i}]: {type(exc).__name__}: {exc}") from None
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
