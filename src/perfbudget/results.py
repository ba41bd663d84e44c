"""Results of a run as typed records: write, read, merge shards; JSON (and its NaN strings) only at the edge."""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import re
import types
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from .budgets.schema import Budget
from .budgets.update import Measured, check_commit, measured_value
from .device import DeviceInfo
from .fileio import atomic_write, shown_path
from .measure.nvml import GpuClocks
from .measure.stats import normal_quantile, t_quantile
from .metrics import UNIT, UnknownMetricError, parse_name
from .verdict.judge import Verdict
from .vocabulary import Outcome, RunMode, count_outcomes

__all__ = ["MAX_RESULTS_BYTES", "RESULTS_SCHEMA", "ABPolicyInfo", "ABRunInfo", "BaseSide", "BudgetRef", "FieldError", "HowMeasured", "PairClocks",
           "Record", "Results", "RunInfo", "SetAsidePair", "load_results", "merge_results"]

RESULTS_SCHEMA = 4
"""Version of the results file's form; a bump adds its step to :data:`_MIGRATIONS`."""

#: Degrees of freedom of schema-1 files' flat prior, where ``meta.ab.policy.prior_df`` does not say.
_SCHEMA1_PRIOR_DF = 3.0


def _ab_into_base(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: ``extra["ab"]`` moves into ``base``; a missing df and sd are derived from the interval."""
    meta_ab = data.get("meta", {}).get("ab") if isinstance(data.get("meta"), dict) else None
    policy = meta_ab.get("policy") if isinstance(meta_ab, dict) else None
    prior_df = policy.get("prior_df") if isinstance(policy, dict) else None
    if isinstance(prior_df, bool) or not isinstance(prior_df, (int, float)):
        prior_df = _SCHEMA1_PRIOR_DF
    records = []
    for rec in data.get("records", []):
        extra = rec.get("extra") if isinstance(rec, dict) else None
        ab = extra.get("ab") if isinstance(extra, dict) else None
        if not isinstance(ab, dict):
            records.append(rec)
            continue
        base = dict(rec.get("base") or {"value": None})
        base.update({k: ab[k] for k in ("compared", "note", "tolerance", "tolerance_from", "sd", "df", "prior",
                                        "confidence") if k in ab})
        if base.get("detectable") is None and ab.get("mde") is not None:
            base["detectable"] = ab["mde"]
        pairs = base.get("pairs")
        if base.get("compared", True) and isinstance(pairs, int) and pairs >= 1 and base.get("ratio") is not None:
            if base.get("df") is None:
                base["df"] = float(prior_df) + pairs - 1
            ci = base.get("ratio_ci")
            if base.get("sd") is None and isinstance(ci, list) and len(ci) == 2 and all(
                    isinstance(x, (int, float)) and x > 0 for x in ci) and base["df"] > 0:
                coverage = base.get("confidence") or 0.95
                half = (math.log(ci[1]) - math.log(ci[0])) / 2
                base["sd"] = half / t_quantile(0.5 + coverage / 2, base["df"]) * math.sqrt(pairs)
        records.append({**rec, "base": base, "extra": {k: v for k, v in extra.items() if k != "ab"}})  # type: ignore[union-attr]
    return {**data, "records": records}


def _mode_in_meta(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3: ``meta.mode`` always set: ``ab`` where ``meta.ab`` is, else ``check``."""
    meta = data.get("meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if isinstance(meta.get("ab"), dict):
        meta["mode"] = RunMode.AB.value
    meta.setdefault("mode", "check")
    return {**data, "meta": meta}


def _stored_named_once(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 -> 4: mode ``check`` becomes ``stored``."""
    meta = data.get("meta")
    if isinstance(meta, dict) and meta.get("mode") == "check":
        return {**data, "meta": {**meta, "mode": RunMode.STORED.value}}
    return data


_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _ab_into_base, 2: _mode_in_meta,
                                                                   3: _stored_named_once}
"""``version -> step``: the step turns a results file of ``version`` into one of ``version + 1``."""

_D = TypeVar("_D")


class FieldError(ValueError):
    """A field of a results file that does not read as its type; ``where`` is its path in the record."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.message = message


def _encode_fields(obj: Any) -> dict[str, Any]:
    return {f.name: _encode(getattr(obj, f.name)) for f in fields(obj)}


def _encode(value: Any) -> Any:
    """The JSON form of one field's value; ``Any``-typed data (``extra``) is kept as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        return _encode_fields(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float):  # JSON has no NaN/inf: written as strings ("nan", "inf"), read back as floats
        return value if math.isfinite(value) else str(value)
    if isinstance(value, tuple):
        return [_encode(x) for x in value]
    return value


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """The fields' annotations, resolved (this module's annotations are strings)."""
    if cls not in _FIELD_TYPES:
        _FIELD_TYPES[cls] = get_type_hints(cls)
    return _FIELD_TYPES[cls]


def _decode_fields(cls: type[_D], data: Any, where: str) -> _D:
    """``cls`` from its JSON form, every field read by its annotated type."""
    if not isinstance(data, Mapping):
        raise FieldError(where, f"expected a mapping, got {data!r}")
    types = _field_types(cls)
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]
        at = f"{where}.{f.name}" if where else f.name
        if f.name in data:
            values[f.name] = _decode(types[f.name], data[f.name], at)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise FieldError(at, "missing")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # a type's own checks (``__post_init__``)
        raise FieldError(where, str(exc)) from None


def _decode(tp: Any, x: Any, where: str) -> Any:
    """One value of annotated type ``tp`` from its JSON form."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return x
    if origin in (Union, types.UnionType):
        if x is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:  # records use ``X | None`` only; another union needs its own rule here
            raise TypeError(f"{where}: no JSON form for fields of type {tp!r}")
        return _decode(inner[0], x, where)
    if origin is Literal:
        if x not in args:
            raise FieldError(where, f"expected one of {', '.join(map(repr, args))}, got {x!r}")
        return x
    if origin is tuple:
        if not isinstance(x, (list, tuple)):
            raise FieldError(where, f"expected a list, got {x!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], y, f"{where}[{i}]") for i, y in enumerate(x))
        if len(x) != len(args):
            raise FieldError(where, f"expected {len(args)} values, got {x!r}")
        return tuple(_decode(a, y, f"{where}[{i}]") for i, (a, y) in enumerate(zip(args, x, strict=True)))
    if origin is dict:
        if not isinstance(x, Mapping):
            raise FieldError(where, f"expected a mapping, got {x!r}")
        if len(args) == 2 and args[1] is not Any:
            return {_decode(args[0], k, where): _decode(args[1], v, f"{where}.{k}") for k, v in x.items()}
        return dict(x)
    if isinstance(tp, type) and is_dataclass(tp):
        return _decode_fields(tp, x, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(x)
        except ValueError:
            raise FieldError(where, f"expected one of {', '.join(repr(m.value) for m in tp)}, got {x!r}") from None
    if tp is float:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return float(x)
        if isinstance(x, str) and x.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
            return float(x)
        raise FieldError(where, f"expected a number, got {x!r}")
    if tp is str and isinstance(x, str) and len(x) > MAX_TEXT:
        raise FieldError(where, f"expected at most {MAX_TEXT} characters, got {len(x)}: {_cut(x)}")
    if tp is str and isinstance(x, str) and not x.isascii():
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (JSON "\\ud800"): no report could write it
            raise FieldError(where, f"expected text, got a lone surrogate in {x!r}") from None
    if tp in (bool, int, str) and isinstance(x, tp) and not (tp is int and isinstance(x, bool)):
        return x
    if tp in (bool, int, str):
        raise FieldError(where, f"expected {'an integer' if tp is int else 'a ' + tp.__name__}, got {x!r}")
    raise TypeError(f"{where}: no JSON form for fields of type {tp!r}")  # a record type this codec lacks


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
        return shown_path(self.source, self.line)


@dataclass(frozen=True, kw_only=True)
class SetAsidePair:
    """A process pair whose head/base lay far from the other pairs' (a disturbed minute): not averaged in."""

    pair: int
    ratio: float
    why: str


@dataclass(frozen=True, kw_only=True)
class BaseSide:
    """A lockstep A/B run's comparison of a check with the base commit: base value, head/base, how judged."""

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
    """Minimum detectable effect: the smallest bad-direction change (a fraction) these pairs resolve."""
    compared: bool = True
    """Judged against the base; otherwise against the stored budgets alone (``note`` says why)."""
    note: str = ""
    """Why it was not compared (``the base lacks it``)."""
    tolerance: float | None = None
    """The relative tolerance applied to head/base."""
    tolerance_from: str = ""
    """``budgets/cpu.yaml:12``, or ``default for timing`` when the check has no budget."""
    sd: float | None = None
    """Pooled per-pair sd of ln(head/base) behind the interval."""
    df: float | None = None
    """Degrees of freedom of the interval's t quantile (the pairs', plus the prior's unless it was set aside)."""
    prior: str = ""
    """Where the prior sd came from (``default for timing``, ``measured: <noise file>, 10 df``, ``set aside``)."""
    confidence: float | None = None
    """Two-sided coverage of ``ratio_ci`` (higher for per-operator checks, which share one false-alarm budget)."""
    set_aside: tuple[SetAsidePair, ...] = ()
    """Pairs left out of ``ratio`` as outlying (:func:`perfbudget.ab.ratios.outlying_pair`)."""
    not_comparable: str = ""
    """How the sides measured differently (``threads 1 vs 2``): not compared with the base."""

    @property
    def log_se(self) -> float | None:
        """Standard error of ln(ratio): the per-pair sd over the square root of the pairs."""
        return self.sd / math.sqrt(self.pairs) if self.sd is not None and self.sd > 0 and self.pairs >= 1 else None


@dataclass(frozen=True, kw_only=True)
class Record:
    """One metric of one test: the verdict plus where it ran (NaN allowed; JSON writes it as a string)."""

    nodeid: str
    key: str
    metric: str
    outcome: Outcome
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
    """Lockstep A/B: the comparison with the base commit (:attr:`vs_base`: only where it was compared)."""
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

    @property
    def value_log_se(self) -> float | None:
        """Standard error of ln(value) from its interval's width and coverage (``None`` without them)."""
        ci, cover = self.ci, self.ci_confidence
        if self.value is None or not (self.value > 0) or ci is None or cover is None or not 0 < cover < 1 \
                or not all(math.isfinite(x) and x > 0 for x in ci) or not ci[1] > ci[0]:
            return None
        return (math.log(ci[1]) - math.log(ci[0])) / (2 * normal_quantile(0.5 + cover / 2))

    @property
    def vs_base(self) -> BaseSide | None:
        """The comparison with the base commit where the check was compared with it, else ``None``."""
        return self.base if self.base is not None and self.base.compared else None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, one key per field: NaN/inf as strings, nested records as dicts."""
        return _encode_fields(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        """Inverse of :meth:`as_dict`; unknown keys ignored. Raises ValueError naming the field."""
        return _decode_fields(cls, d, "")

    def measured(self) -> Measured | None:
        """The value offered to the updater (non-finite too: it refuses them), or ``None`` where no budget may be."""
        if self.outcome in (Outcome.ERROR, Outcome.UNMEASURABLE, Outcome.NOT_JUDGED, Outcome.NOT_MEASURED) or self.value is None \
                or self.device is None:
            return None
        return measured_value(key=self.key, metric=self.metric, value=self.value, n=self.n, cv=self.cv,
                              device=self.device, ci=self.ci, confidence=self.ci_confidence, ref_ms=self.ref_ms)


@dataclass(frozen=True, kw_only=True)
class ABPolicyInfo:
    """The decision rule of a ``perfbudget ab`` run (``meta.ab.policy``)."""

    confidence: float = 0.95
    prior_sd: dict[str, float] = field(default_factory=dict)
    """Flat prior per-pair sd of ln(head/base) by kind, where no measured noise applied."""
    prior_df: float = 0.0
    family_alpha: float = 0.05
    noise: tuple[str, ...] = ()
    """The noise files whose measured per-check spread served as priors."""


@dataclass(frozen=True, kw_only=True)
class PairClocks:
    """The GPU clocks each side of one process pair ran at, over its turns (``meta.ab.clocks``)."""

    pair: int
    base: GpuClocks | None = None
    head: GpuClocks | None = None
    refused: str = ""
    """Why the pair's GPU timing was not compared (the sides' clocks differ), empty when it was."""


@dataclass(frozen=True, kw_only=True)
class ABRunInfo:
    """How a ``perfbudget ab`` run went (``meta.ab``); each check's verdict is on its record (:attr:`Record.base`)."""

    base_ref: str = ""
    """The base as given (``origin/main``)."""
    base_commit: str = ""
    merge_base: bool = False
    """The base is the merge-base of the head and :attr:`base_ref` (a pull request's)."""
    head_commit: str = ""
    """The head's commit; ``<sha>-dirty`` when the working tree had uncommitted changes."""
    pairs: int = 0
    valid_pairs: int = 0
    invalid_pairs: tuple[int, ...] = ()
    """Pairs that lost turn-taking (not used)."""
    min_pairs: int = 0
    max_pairs: int = 0
    stopped: str = ""
    """Why no further pair started (:class:`perfbudget.ab.run.StopReason`)."""
    strict: bool = False
    allow_missing_base: bool = False
    wall_s: float = 0.0
    cpus: tuple[int, ...] = ()
    """CPUs the sides were pinned to (each pair's ``runs`` entry says which side had which)."""
    burst_ms: float | None = None
    compared: int = 0
    not_compared: int = 0
    base_only: tuple[tuple[str, ...], ...] = ()
    """(nodeid, key, metric) of checks only the base recorded."""
    inconclusive: tuple[tuple[str, ...], ...] = ()
    """(nodeid, key, metric) of checks the pairs left undecided."""
    policy: ABPolicyInfo | None = None
    clocks: tuple[PairClocks, ...] = ()
    """Per pair, the GPU clocks of each side's turns (none without NVML)."""
    runs: tuple[dict[str, Any], ...] = ()
    """Each pair as it ran (sides, turns, wall time), as :meth:`perfbudget.ab.pairs.PairRun.as_dict` wrote it."""
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class HowMeasured:
    """How one pytest session measured (``meta.measured``): what A/B sides must share (:meth:`differences`)."""

    settings: dict[str, str] = field(default_factory=dict)
    """The resolved settings that shape a measurement, by name (``threads``: ``"1"``)."""
    machine: str = ""
    """Identities of the devices measured, comma-separated."""
    versions: dict[str, str] = field(default_factory=dict)
    """Libraries as loaded (``torch``, ``triton``, ``numpy``, ``python``): one not loaded is absent."""
    way: Literal["wall", "callgrind"] = "wall"
    """Timed (``wall``: host clock, or CUDA events on a GPU) or instruction counts under callgrind."""

    def differences(self, base: HowMeasured) -> list[str]:
        """``threads 1 vs 2`` (the base's value first) for each field the head (``self``) and ``base`` differ in."""
        def flat(h: HowMeasured) -> dict[str, str]:
            return {**h.settings, "machine": h.machine, **h.versions, "way": h.way}

        # A library one side never loaded (triton without a compile) is no difference.
        head, was = flat(self), flat(base)
        return [f"{k} {was[k]} vs {head[k]}" for k in was if k in head and str(was[k]) != str(head[k])]


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What a results file says about the run that wrote it (its ``meta``)."""

    mode: RunMode = RunMode.STORED
    budgets_dir: str | None = None
    """The budget folder the run judged against."""
    errors: tuple[dict[str, str], ...] = ()
    """Tests whose measuring raised (``nodeid``, ``key``, ``error``); their records hold what came before."""
    unfinished: str | None = None
    """Set while the run has not finished (a checkpoint after each test): why the file may lack records."""
    shards: int | None = None
    """Merged from this many shards (``perfbudget merge``, xdist workers)."""
    sources: tuple[str, ...] | None = None
    """The files merged into these results."""
    ab: ABRunInfo | None = None
    """A lockstep A/B run's account (:attr:`mode` ``ab``)."""
    lease: bool | None = None
    """True when the run's work was lease-sized (``perfbudget_lease``, :mod:`perfbudget.lease`)."""
    measured: HowMeasured | None = None
    """How the session measured (an A/B run compares sides only where theirs agree)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunInfo:
        """Read the JSON form, unknown keys left out. Raises FieldError for a bad value (``meta.<key>``)."""
        return _decode_fields(cls, data, "meta")

    def as_dict(self) -> dict[str, Any]:
        """The JSON form; ``None`` fields are left out, for readers that test a key's presence."""
        return {k: v for k, v in _encode_fields(self).items() if v is not None}


@dataclass(kw_only=True)
class Results:
    """All records of a run (or of merged shards), and what the run says of itself (:attr:`meta`)."""

    records: list[Record] = field(default_factory=list)
    meta: RunInfo = field(default_factory=RunInfo)

    def as_dict(self) -> dict[str, Any]:
        return {"schema": RESULTS_SCHEMA, "meta": self.meta.as_dict(), "records": [r.as_dict() for r in self.records]}

    def write(self, path: str | Path) -> Path:
        """Write atomically (:func:`perfbudget.fileio.atomic_write`); returns the path."""
        return atomic_write(path, json.dumps(self.as_dict(), indent=1))

    def measured(self) -> list[Measured]:
        return [m for r in self.records if (m := r.measured()) is not None]

    def counts(self) -> dict[str, int]:
        return count_outcomes(r.outcome for r in self.records)

    @property
    def head_commit(self) -> str | None:
        """The commit an A/B run measured as its head (``meta.ab.head_commit``); ``None`` where not said."""
        return (self.meta.ab.head_commit or None) if self.meta.ab is not None else None


def load_results(path: str | Path) -> Results:
    """Read a results JSON file: an older schema migrated, a newer one or one over :data:`MAX_RESULTS_BYTES` refused.

    Raises:
        ValueError: naming the file (and the record and field) it cannot read.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size  # a file of gigabytes is refused unread; a pipe read up to the limit
            raw = fh.read(MAX_RESULTS_BYTES + 1) if size <= MAX_RESULTS_BYTES else b""
        if max(size, len(raw)) > MAX_RESULTS_BYTES:
            raise ValueError(f"larger than {MAX_RESULTS_BYTES >> 20} MiB, more than perfbudget writes "
                             f"({max(size, len(raw))} bytes)")
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, an integer of 5000 digits
        raise ValueError(f"{path}: cannot read results: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a results object, got {type(data).__name__}")
    data = _migrate(data, path)
    if not isinstance(data.get("records", []), list):
        raise ValueError(f"{path}: records: expected a list, got {_cut(str(data['records']))}")
    records = []
    for i, r in enumerate(data.get("records", [])):
        try:
            records.append(_checked(Record.from_dict(r)))
        except FieldError as exc:
            where = f"records[{i}]" + (f".{exc.where}" if exc.where else "")
            raise ValueError(f"{path}: {where}: {exc.message}") from None
    try:
        meta = _checked_meta(RunInfo.from_dict(data.get("meta", {})))
    except FieldError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return Results(records=records, meta=meta)


#: The largest results file :func:`load_results` reads: a suite's are a few hundred KiB (``benchmarks/*.json``),
#: and an untrusted one could be any size (read, it takes twice its size in memory).
MAX_RESULTS_BYTES = 64 << 20


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: a second ``"records"`` appended to a file would replace the first."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {_cut(twice)}")
    return out


#: The most characters any text field of a (possibly untrusted) results file may hold.
MAX_TEXT = 20_000
#: The most characters a name (node id, key, metric, device field) may hold.
MAX_NAME = 1_000
_NAME_PATTERNS = {"device.isa_class": re.compile(r"[a-z0-9_]{1,40}"),
                  "device.cpuid": re.compile(r"[0-9]{1,6}/[0-9]{1,6}/[0-9]{1,6}"),
                  "metric": re.compile(r"[a-z][a-z0-9_]*(?:\[[^\[\]]+\])?"), "unit": UNIT}


def _cut(text: str) -> str:
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}..."


def _check_name(where: str, text: str) -> None:
    """A name: bounded, no control or format characters (newline, ANSI escape, RTL override), of its pattern."""
    if len(text) > MAX_NAME:
        raise FieldError(where, f"expected at most {MAX_NAME} characters, got {len(text)}: {_cut(text)}")
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in text):
        raise FieldError(where, f"expected no control characters, got {text!r}")
    pattern = _NAME_PATTERNS.get(where)
    if pattern is not None and not pattern.fullmatch(text):
        raise FieldError(where, f"expected {pattern.pattern}, got {text!r}")


def _checked(r: Record) -> Record:
    """The trust boundary for one (possibly untrusted) record: names, intervals, counts; the codec read the types."""
    names = {"nodeid": r.nodeid, "key": r.key, "metric": r.metric, "unit": r.unit}
    if r.device is not None:
        names.update({f"device.{f.name}": v for f in fields(r.device) if isinstance(v := getattr(r.device, f.name), str)})
    for where, text in names.items():
        _check_name(where, text)
    if r.ci is not None and not (all(math.isfinite(x) for x in r.ci) and r.ci[0] <= r.ci[1]):
        raise FieldError("ci", f"expected two finite numbers, low to high, got {list(r.ci)!r}")
    if r.ci_confidence is not None and not (0 < r.ci_confidence < 1 and 0.5 + r.ci_confidence / 2 < 1):
        raise FieldError("ci_confidence", f"expected a number in (0, 1), got {r.ci_confidence!r}")
    try:
        parse_name(r.metric)
    except UnknownMetricError as exc:
        raise FieldError("metric", str(exc)) from None
    for name in ("n", "rounds"):
        if not 0 <= getattr(r, name) <= MAX_COUNT:
            raise FieldError(name, f"expected an integer in [0, {MAX_COUNT}], got {getattr(r, name)!r}")
    if r.base is not None:
        _check_base(r.base)
    _check_extra(r.extra, "extra", 0)
    return r


#: The most samples, rounds or pairs a record may claim.
MAX_COUNT = 10_000_000


def _check_base(b: BaseSide) -> None:
    """An A/B record's base side: counts in range, numbers finite, intervals low to high."""
    if not 0 <= b.pairs <= MAX_COUNT:
        raise FieldError("base.pairs", f"expected an integer in [0, {MAX_COUNT}], got {b.pairs!r}")
    if b.pair_ratios and b.pairs > len(b.pair_ratios):
        raise FieldError("base.pairs", f"expected at most the {len(b.pair_ratios)} pair ratios given, got {b.pairs}")
    for name in ("ratio", "sd", "df", "detectable", "tolerance", "confidence"):
        x = getattr(b, name)
        if x is not None and not (math.isfinite(x) and (name in ("ratio", "detectable") or x >= 0)):
            raise FieldError(f"base.{name}", f"expected a finite number{'' if name == 'ratio' else ' >= 0'}, got {x!r}")
    if b.ratio_ci is not None and not (all(math.isfinite(x) for x in b.ratio_ci) and b.ratio_ci[0] <= b.ratio_ci[1]):
        raise FieldError("base.ratio_ci", f"expected two finite numbers, low to high, got {list(b.ratio_ci)!r}")


def _check_extra(x: Any, where: str, depth: int) -> None:
    """A record's free-form ``extra``: texts bounded and encodable, nesting bounded (reports render it)."""
    if depth > 8:
        raise FieldError(where, "expected at most 8 levels of nesting")
    if isinstance(x, str):
        _decode(str, x, where)  # length and lone surrogates, as every text field
    elif isinstance(x, Mapping):
        for k, v in x.items():
            _decode(str, k, where)
            _check_extra(v, f"{where}.{_cut(k)}", depth + 1)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _check_extra(v, f"{where}[{i}]", depth + 1)


def _checked_meta(meta: RunInfo) -> RunInfo:
    """The trust boundary for ``meta``: the budget folder a command may write, the commits handed to git."""
    if meta.budgets_dir is not None:
        _check_name("meta.budgets_dir", meta.budgets_dir)
    if (m := meta.measured) is not None:
        for key, value in {**m.settings, **m.versions, "machine": m.machine}.items():
            _check_name(f"meta.measured.{_cut(str(key))}", f"{key}={value}")
    if meta.ab is not None:
        _check_name("meta.ab.base_ref", meta.ab.base_ref)
        for name in ("head_commit", "base_commit"):
            if commit := getattr(meta.ab, name):
                try:
                    check_commit(commit)
                except ValueError as exc:
                    raise FieldError(f"meta.ab.{name}", str(exc)) from None
    return meta


def _migrate(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Read the schema: refuse one unknown or newer, migrate an older one step by step."""
    version = data.get("schema")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{path}: schema: expected a results schema version (1 to {RESULTS_SCHEMA}), got {version!r}")
    if version > RESULTS_SCHEMA:
        raise ValueError(f"{path}: results schema {version} is newer than this perfbudget reads "
                         f"(schema {RESULTS_SCHEMA}); upgrade perfbudget to read it")
    while version < RESULTS_SCHEMA:
        try:
            data = {**_MIGRATIONS[version](data), "schema": version + 1}
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a field of the wrong type
            raise ValueError(f"{path}: cannot migrate schema {version} results: {exc!r}") from None
        version += 1
    return data


def is_unrecorded_budget(r: Record) -> bool:
    """A session's report that a budget applied but no test of *that* shard recorded it."""
    return r.outcome == Outcome.NOT_MEASURED and not r.nodeid


def _where(r: Record) -> tuple[str, str, str]:
    return (r.device.label if r.device is not None else "", r.key, r.metric)


def merge_results(parts: Iterable[Results]) -> Results:
    """Merge shards (xdist workers, CI jobs) by test and metric; an unmeasured budget once, if no shard measured it."""
    out = Results()
    shards = []
    records: list[Record] = []
    for p in parts:
        records.extend(p.records)
        shards.append(p.meta)
    measured = {_where(r) for r in records if not is_unrecorded_budget(r)}
    reported: set[tuple[str, str, str]] = set()
    for r in records:
        if is_unrecorded_budget(r):
            if _where(r) in measured or _where(r) in reported:
                continue
            reported.add(_where(r))
        out.records.append(r)
    out.records.sort(key=lambda r: (r.nodeid, r.key, r.metric))
    if shards:
        # Every shard's unreadable budget files and unfinished run: one shard's would otherwise hide another's.
        errors = tuple({json.dumps(e, sort_keys=True): e for m in shards for e in m.errors}.values())
        unfinished = "; ".join(dict.fromkeys(m.unfinished for m in shards if m.unfinished)) or None
        out.meta = replace(shards[0], shards=len(shards), errors=errors, unfinished=unfinished)
    return out
