"""The per-step operator table from profiler events, diffs between two tables, and which operators moved."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perfbudget.device import DeviceType
from perfbudget.measure.operators.fields import read_event_field
from perfbudget.measure.operators.flops import (
    _ATTENTION_FORWARD,
    FlopCount,
    _attention_flops_from_shapes,
)
from perfbudget.measure.operators.roofline import DevicePeaks, Roofline
from perfbudget.metrics import OP_METRIC_FAMILIES, op_metric
from perfbudget.verdict.rule import moved_beyond, same

__all__ = [
    "OP_METRIC_FAMILIES",
    "OpChange",
    "OpDiff",
    "OpMove",
    "OpRow",
    "OpTable",
    "moved_operators",
    "op_metric",
    "table_from_events",
]

#: What an operator is compared with: its budget, the base commit's value, or a base table's row.
Against = Literal["budget", "base", "table"]
# Profiler dtype strings (c10 names) -> (canonical name, bytes per element).
_DTYPES: Mapping[str, tuple[str, int]] = {
    "float": ("float32", 4),
    "double": ("float64", 8),
    "c10::Half": ("float16", 2),
    "c10::BFloat16": ("bfloat16", 2),
    "c10::Float8_e4m3fn": ("float8", 1),
    "c10::Float8_e5m2": ("float8", 1),
    "c10::Float8_e4m3fnuz": ("float8", 1),
    "c10::Float8_e5m2fnuz": ("float8", 1),
    "long int": ("int64", 8),
    "int": ("int32", 4),
    "short int": ("int16", 2),
    "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1),
    "bool": ("bool", 1),
    "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16),
}

# Ops that only create views or metadata: they move no data, so no bytes are charged.
_NO_DATA_OPS = frozenset(
    {
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::_reshape_alias",
        "aten::t",
        "aten::transpose",
        "aten::permute",
        "aten::expand",
        "aten::as_strided",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::select",
        "aten::slice",
        "aten::narrow",
        "aten::split",
        "aten::chunk",
        "aten::unbind",
        "aten::alias",
        "aten::detach",
        "detach",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::lift_fresh",
    }
)

_MATMUL_OUTPUT = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def _event_bytes(
    name: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str]
) -> tuple[float, str]:
    """Estimated bytes an op call reads and writes, and its main floating dtype."""
    # No outputs are recorded: matmul and attention outputs come from the shapes; other ops are charged
    # one the size of their largest input (exact for elementwise ops).
    in_bytes = 0
    largest = 0
    dtype = "float32"
    found_float = False
    tensor_shapes: list[tuple[Sequence[int], int]] = []
    for i, shape in enumerate(shapes):
        dt = dtypes[i] if i < len(dtypes) else ""
        info = _DTYPES.get(dt)
        if info is None:
            continue
        canonical, size = info
        if not found_float and canonical.startswith(("float", "bfloat")):
            dtype, found_float = canonical, True
        nbytes = _numel(shape) * size
        in_bytes += nbytes
        largest = max(largest, nbytes)
        tensor_shapes.append((shape, size))
    if not tensor_shapes:
        return 0.0, dtype
    out_bytes = largest
    if name in _MATMUL_OUTPUT:
        mats = [(s, size) for s, size in tensor_shapes if len(s) >= 2]
        if len(mats) >= 2:
            a, size = mats[-2]
            b_shape, _ = mats[-1]
            out_bytes = _numel([*a[:-1], b_shape[-1]]) * size
    elif name in _ATTENTION_FORWARD and len(tensor_shapes) >= 3:
        (q, size), (v, _) = tensor_shapes[0], tensor_shapes[2]
        if len(q) == 4 and len(v) == 4:
            out_bytes = _numel([*q[:-1], v[-1]]) * size
    return float(in_bytes + out_bytes), dtype


@dataclass(frozen=True, kw_only=True)
class OpRow:
    """One operator's cost per step (averaged over the profiled steps)."""

    name: str
    """Operator name as the profiler spells it, e.g. ``"aten::addmm"``."""
    calls: float
    """Calls per step."""
    self_ms: float
    """Self time per step in ms: device time on CUDA, CPU time on CPU."""
    total_ms: float
    """Time including child operators, per step, in ms (same clock as ``self_ms``)."""
    flops: float
    """FLOPs per step (profiler; attention from shapes; FlopCounterMode where the profiler has none)."""
    share: float
    """``self_ms`` as a fraction (0-1) of the step's summed operator self time."""
    input_shapes: tuple[tuple[tuple[int, ...], ...], ...] = ()
    """Distinct input-shape signatures seen (``()`` for non-tensor arguments), most time first."""
    self_cpu_ms: float = 0.0
    """Host self time per step in ms (equals ``self_ms`` on CPU)."""
    bytes_accessed: float = 0.0
    """Estimated bytes read and written per step; 0 for views and where no input dtypes were recorded."""
    dtype: str = "float32"
    """Main floating dtype of the inputs (picks the peak in the roofline)."""
    roofline: Roofline = "unknown"
    """``"compute"`` or ``"memory"`` bound against the device's ridge point, else ``"unknown"``."""


@dataclass(frozen=True, kw_only=True)
class OpChange:
    """How one operator changed between a base table and a new one (per step)."""

    name: str
    base_self_ms: float
    new_self_ms: float
    base_calls: float
    new_calls: float
    base_flops: float
    new_flops: float
    status: Literal["added", "removed", "changed", "same"]
    """``added``/``removed``: present on one side only; ``changed``: calls or FLOPs differ."""

    @property
    def delta_ms(self) -> float:
        """New minus base self time per step, in ms."""
        return self.new_self_ms - self.base_self_ms

    @property
    def ratio(self) -> float:
        """New over base self time (``inf`` for an added operator)."""
        if self.base_self_ms == 0:
            return math.inf if self.new_self_ms > 0 else 1.0
        return self.new_self_ms / self.base_self_ms

    def line(self) -> str:
        """One readable line, e.g. ``aten::mm: self 2.10 -> 3.00 ms/step (+0.90 ms, +43%), calls 3 -> 4``."""
        if self.status == "added":
            head = f"{self.name}: new, {self.new_self_ms:.3f} ms/step"
        elif self.status == "removed":
            head = f"{self.name}: gone, was {self.base_self_ms:.3f} ms/step"
        else:
            rel = (self.ratio - 1) * 100 if math.isfinite(self.ratio) else math.inf
            head = (
                f"{self.name}: self {self.base_self_ms:.3f} -> {self.new_self_ms:.3f} ms/step "
                f"({self.delta_ms:+.3f} ms, {rel:+.0f}%)"
            )
        extras = []
        if self.base_calls != self.new_calls:
            extras.append(f"calls {_fmt_num(self.base_calls)} -> {_fmt_num(self.new_calls)}")
        if self.base_flops != self.new_flops:
            extras.append(f"FLOPs {_fmt_flops(self.base_flops)} -> {_fmt_flops(self.new_flops)}")
        return ", ".join([head, *extras])


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def _fmt_flops(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"


@dataclass(frozen=True, kw_only=True)
class OpMove:
    """One operator's metric before and after (against its budget, the base commit, or a base table)."""

    op: str
    """Operator name, e.g. ``"aten::addmm"``."""
    family: str
    """``op_self_ms``, ``op_share`` or ``op_count``; ``op_flops`` in table diffs."""
    before: float | None
    """The reference (budget, base value, base table); ``None`` when there is none (not budgeted, new)."""
    after: float | None
    """Measured now; ``None`` when the operator did not run (gone)."""
    against: Against = "budget"
    """What ``before`` is."""
    unit: str = ""
    """Unit of both values (``ms``, ``1``)."""
    tolerance: float = 0.0
    """Relative change within which the operator did not move (the check's tolerance)."""
    failing: bool = False
    """The check of this operator failed: it moved, whatever the size of the change."""
    outcome: str = ""
    """The check's verdict, shown beside it; empty when nothing judged it (profiled to explain)."""
    ratio: float | None = None
    """head/base from the process pairs of a lockstep A/B run (then the change is ``ratio - 1``)."""

    @property
    def metric(self) -> str:
        """The check's metric name, ``op_self_ms[aten::mm]``."""
        return f"{self.family}[{self.op}]"

    @property
    def one_sided(self) -> bool:
        """Only one side has the operator (not budgeted, new, or gone)."""
        return self.before is None or self.after is None

    @property
    def delta(self) -> float:
        """``after - before`` in the unit (a missing side counts as 0)."""
        return (self.after or 0.0) - (self.before or 0.0)

    @property
    def change(self) -> float:
        """Relative change (+0.25 = 25 % above the reference); ``inf`` with no reference, -1 when gone."""
        if self.ratio is not None:
            return self.ratio - 1
        if self.before is None:
            return math.inf
        if self.after is None:
            return -1.0
        if self.before == 0:
            return 0.0 if self.after == 0 else math.inf
        return self.after / self.before - 1

    def moved(self, min_delta: float = 0.0) -> bool:
        """Its check failed, it is on one side only, or it changed beyond its tolerance and by ``min_delta``."""
        if self.failing or self.one_sided:
            return True
        return moved_beyond(self.change, self.tolerance) and abs(self.delta) >= min_delta


def moved_operators(
    candidates: Iterable[OpMove], *, k: int | None = 5, min_delta: Mapping[str, float] | None = None
) -> tuple[OpMove, ...]:
    """The operators that moved (:meth:`OpMove.moved`): failing first, then by largest relative change, then
    one-sided by size, ties by metric name; the one rule every report names them by.

    Args:
        candidates: one :class:`OpMove` per operator metric compared.
        k: how many to keep (``None``: all).
        min_delta: per family, the least absolute change that counts (noise on tiny operators).
    """
    floors = min_delta or {}
    out = [m for m in candidates if m.moved(floors.get(m.family, 0.0))]
    out.sort(key=lambda m: (not m.failing, m.one_sided,
                            -abs(m.after or m.before or 0.0) if m.one_sided else -abs(m.change), m.metric))
    return tuple(out if k is None else out[:k])


@dataclass(frozen=True, kw_only=True)
class OpDiff:
    """Operator-level differences between a base (control) table and a new (test) table."""

    changes: tuple[OpChange, ...]
    """Every operator on either side, largest absolute self-time change first."""
    base_step_ms: float
    """Base summed operator self time per step, in ms."""
    new_step_ms: float
    """New summed operator self time per step, in ms."""

    def moved(self, *, min_rel: float = 0.10, min_step_share: float = 0.01) -> tuple[OpChange, ...]:
        """Operators that moved, largest self-time change first: exact changes always, time beyond both bounds.

        Args:
            min_rel: least relative self-time change (0.10 = 10 %).
            min_step_share: least change as a fraction of the base step's self time.
        """
        names = {m.op for m in self.moves(min_rel=min_rel, min_step_share=min_step_share, k=None)}
        return tuple(c for c in self.changes if c.name in names)

    def moves(self, *, min_rel: float = 0.10, min_step_share: float = 0.01, k: int | None = 5) -> tuple[OpMove, ...]:
        """The operators that moved (see :meth:`moved`), one :class:`OpMove` per changed quantity."""
        candidates = []
        for c in self.changes:
            added, removed = c.status == "added", c.status == "removed"
            for family, before, after, unit, tolerance in (
                ("op_self_ms", c.base_self_ms, c.new_self_ms, "ms", min_rel),
                ("op_count", c.base_calls, c.new_calls, "1", 0.0),
                ("op_flops", c.base_flops, c.new_flops, "1", 0.0),
            ):
                candidates.append(OpMove(op=c.name, family=family, before=None if added else before,
                                         after=None if removed else after, against="table", unit=unit,
                                         tolerance=tolerance))
        moved = moved_operators(candidates, k=None, min_delta={"op_self_ms": min_step_share * self.base_step_ms})
        # An operator added or removed moves in every quantity: name it once, by its time.
        once = [m for m in moved if not m.one_sided or m.family == "op_self_ms"]
        return tuple(once if k is None else once[:k])

    def lines(self, k: int = 5) -> list[str]:
        """Readable lines for a failure message: the step change, then the top ``k`` movers."""
        step_rel = (self.new_step_ms / self.base_step_ms - 1) * 100 if self.base_step_ms else 0.0
        head = (
            f"operator self time per step: {self.base_step_ms:.3f} -> {self.new_step_ms:.3f} ms "
            f"({step_rel:+.1f}%)"
        )
        moved = self.moved()
        if not moved:
            return [head, "  no operator moved beyond noise"]
        return [head, *("  " + c.line() for c in moved[:k])]

    def __str__(self) -> str:
        return "\n".join(self.lines())


@dataclass(frozen=True, kw_only=True)
class OpTable:
    """Per-step operator costs of a profiled step, heaviest first."""

    rows: tuple[OpRow, ...]
    """One row per operator name, sorted by ``self_ms`` descending."""
    steps: int
    """Profiled steps the averages are taken over."""
    device: DeviceType
    """Whose self time ``self_ms`` is."""
    flop_count: FlopCount | None = None
    """FlopCounterMode's count of one (warm-up) step, when it ran."""
    peaks: DevicePeaks | None = None
    """Ceilings the roofline classes were computed against."""
    trace_path: str | None = None
    """Chrome trace written for these steps, if one was asked for."""

    @property
    def step_self_ms(self) -> float:
        """Summed operator self time per step, in ms (the denominator of ``share``)."""
        return math.fsum(r.self_ms for r in self.rows)

    @property
    def total_flops(self) -> float:
        """FLOPs per step summed over operators."""
        return math.fsum(r.flops for r in self.rows)

    def names(self) -> tuple[str, ...]:
        """Operator names, heaviest first."""
        return tuple(r.name for r in self.rows)

    def top(
        self, k: int = 10, *, by: Literal["self_ms", "total_ms", "flops", "calls"] = "self_ms"
    ) -> tuple[OpRow, ...]:
        """The ``k`` heaviest operators by ``by``."""
        if by not in ("self_ms", "total_ms", "flops", "calls"):
            raise ValueError(f"by must be one of self_ms, total_ms, flops, calls; got {by!r}")
        return tuple(sorted(self.rows, key=lambda r: getattr(r, by), reverse=True)[:k])

    def by_name(self, name: str) -> OpRow:
        """The row of operator ``name``; ``KeyError`` naming the closest operators otherwise."""
        row = self.get(name)
        if row is None:
            close = difflib.get_close_matches(name, list(self.names()), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise KeyError(f"operator {name!r} not in this table{hint}")
        return row

    def get(self, name: str) -> OpRow | None:
        """The row of operator ``name``, or ``None``."""
        return next((r for r in self.rows if r.name == name), None)

    def diff(self, other: OpTable) -> OpDiff:
        """What changed from this table (base/control) to ``other`` (new/test)."""
        names = list(dict.fromkeys([*self.names(), *other.names()]))
        changes = []
        for n in names:
            a, b = self.get(n), other.get(n)
            status: Literal["added", "removed", "changed", "same"]
            if a is None:
                status = "added"
            elif b is None:
                status = "removed"
            elif not same(a.calls, b.calls) or not same(a.flops, b.flops):
                status = "changed"
            else:
                status = "same"
            changes.append(
                OpChange(
                    name=n,
                    base_self_ms=a.self_ms if a else 0.0,
                    new_self_ms=b.self_ms if b else 0.0,
                    base_calls=a.calls if a else 0.0,
                    new_calls=b.calls if b else 0.0,
                    base_flops=a.flops if a else 0.0,
                    new_flops=b.flops if b else 0.0,
                    status=status,
                )
            )
        changes.sort(key=lambda c: abs(c.delta_ms), reverse=True)
        return OpDiff(
            changes=tuple(changes), base_step_ms=self.step_self_ms, new_step_ms=other.step_self_ms
        )

    def lines(self, k: int = 10) -> list[str]:
        """A fixed-width text table of the top ``k`` operators."""
        head = (
            f"{'operator':<52} {'calls':>7} {'self (ms)':>10} {'share':>6} "
            f"{'total (ms)':>10} {'GFLOP':>8} {'roofline':>8}"
        )
        out = [head]
        for r in self.top(k):
            name = r.name if len(r.name) <= 52 else r.name[:49] + "..."
            out.append(
                f"{name:<52} {_fmt_num(r.calls):>7} {r.self_ms:>10.3f} {r.share:>6.1%} "
                f"{r.total_ms:>10.3f} {r.flops / 1e9:>8.3f} {r.roofline:>8}"
            )
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _is_step_marker(name: str) -> bool:
    return name.startswith("ProfilerStep") or name == "[memory]"


#: Names of the CUDA/HIP runtime and driver calls the profiler nests under the op that made them.
_RUNTIME_PREFIXES = ("cuda", "cu", "hip")


def _per_op(events: Iterable[Any], device: DeviceType) -> dict[str, dict[str, Any]]:
    """Each operator's sums over the profile's host events (times in us), with self time by input shapes."""
    # torch's own enum of where an event ran, not this package's DeviceType.
    from torch.autograd import DeviceType as EventDevice

    acc: dict[str, dict[str, Any]] = {}
    for e in events:
        if getattr(e, "device_type", EventDevice.CPU) != EventDevice.CPU or _is_step_marker(e.name):
            continue
        a = acc.setdefault(e.name, {"calls": 0, "self": 0.0, "total": 0.0, "self_cpu": 0.0, "flops": 0.0,
                                    "bytes": 0.0, "dtype": None, "shapes": {}})
        self_cpu = float(read_event_field(e, "self_cpu_time_total"))
        if device == "cuda":
            self_t = float(read_event_field(e, "self_device_time_total"))
            total_t = float(read_event_field(e, "device_time_total"))
        else:
            self_t, total_t = self_cpu, float(read_event_field(e, "cpu_time_total"))
        shapes = [list(s) if isinstance(s, (list, tuple)) else [] for s in (e.input_shapes or [])]
        flops = float(getattr(e, "flops", 0) or 0)
        if flops == 0:
            flops = float(_attention_flops_from_shapes(e.name, shapes))
        a["calls"] += 1
        a["self"] += self_t
        a["total"] += total_t
        a["self_cpu"] += self_cpu
        a["flops"] += flops
        # Composite ops (children, no FLOPs of their own) do their data work in the children. The CUDA runtime
        # and driver calls an op makes (cudaLaunchKernel, cuLaunchKernel) are its children too, and no ops.
        leaf = not any(not c.name.startswith(_RUNTIME_PREFIXES) for c in getattr(e, "cpu_children", None) or ())
        if e.name not in _NO_DATA_OPS and (leaf or flops > 0):
            dtypes = list(read_event_field(e, "input_dtypes", []) or [])
            # No dtypes (older torch): bytes unknown; float32 would double a bf16 GEMM's and misplace its roofline.
            if dtypes:
                nbytes, dt = _event_bytes(e.name, shapes, dtypes)
                a["bytes"] += nbytes
                if a["dtype"] is None and nbytes > 0:
                    a["dtype"] = dt
        key = tuple(tuple(int(d) for d in s) for s in shapes)
        a["shapes"][key] = a["shapes"].get(key, 0.0) + self_t
    return acc


def _rows(acc: dict[str, dict[str, Any]], *, steps: int, flop_count: FlopCount | None,
          peaks: DevicePeaks | None) -> list[OpRow]:
    """Per-step rows of :func:`_per_op`'s sums, slowest first; FLOPs the profiler lacks from ``flop_count``."""
    counter_by_op = dict(flop_count.by_op) if flop_count is not None else {}
    total_self = math.fsum(a["self"] for a in acc.values()) / 1e3 / steps
    rows = []
    for name, a in acc.items():
        flops = a["flops"] / steps
        if flops == 0 and counter_by_op.get(name, 0) > 0:
            flops = float(counter_by_op[name])
        self_ms = a["self"] / 1e3 / steps
        bytes_accessed = a["bytes"] / steps
        dtype = a["dtype"] or "float32"
        roofline: Roofline = (
            peaks.classify(flops, bytes_accessed, dtype) if peaks is not None else "unknown"
        )
        shapes_by_time = sorted(a["shapes"].items(), key=lambda kv: kv[1], reverse=True)
        rows.append(
            OpRow(
                name=name,
                calls=a["calls"] / steps,
                self_ms=self_ms,
                total_ms=a["total"] / 1e3 / steps,
                flops=flops,
                share=self_ms / total_self if total_self > 0 else 0.0,
                input_shapes=tuple(k for k, _ in shapes_by_time),
                self_cpu_ms=a["self_cpu"] / 1e3 / steps,
                bytes_accessed=bytes_accessed,
                dtype=dtype,
                roofline=roofline,
            )
        )
    rows.sort(key=lambda r: (r.self_ms, r.name), reverse=True)
    return rows


def table_from_events(
    events: Iterable[Any],
    *,
    steps: int,
    device: DeviceType = "cpu",
    flop_count: FlopCount | None = None,
    peaks: DevicePeaks | None = None,
    trace_path: str | None = None,
) -> OpTable:
    """Aggregate profiler ``FunctionEvent``s into an :class:`OpTable` (per-step averages).

    Args:
        events: ``prof.events()`` of a profile covering ``steps`` steps.
        steps: number of steps the events cover.
        device: ``"cuda"`` takes self device time as ``self_ms``, ``"cpu"`` self CPU time.
        flop_count: FlopCounterMode count of one step; fills FLOPs the profiler lacks.
        peaks: device ceilings for the roofline class; ``None`` leaves it ``"unknown"``.
        trace_path: recorded on the table.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    rows = _rows(_per_op(events, device), steps=steps, flop_count=flop_count, peaks=peaks)
    return OpTable(
        rows=tuple(rows),
        steps=steps,
        device=device,
        flop_count=flop_count,
        peaks=peaks,
        trace_path=trace_path,
    )
