"""Per-operator attribution of a step from torch.profiler: time, calls, shapes, FLOPs, roofline class, diffs."""

from __future__ import annotations

import difflib
import functools
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perfbudget.measure.timing import pinned_threads

__all__ = [
    "DATASHEET_PEAKS",
    "DevicePeaks",
    "FlopCount",
    "OpChange",
    "OpDiff",
    "OpRounds",
    "OpRow",
    "OpTable",
    "Roofline",
    "attention_flops",
    "count_flops",
    "datasheet_peaks",
    "measure_cpu_peaks",
    "profile_rounds",
    "profile_steps",
    "read_event_field",
    "table_from_events",
]

Device = Literal["cpu", "cuda"]
Roofline = Literal["compute", "memory", "unknown"]

# --------------------------------------------------------------------------------------------
# Field names across torch versions
# --------------------------------------------------------------------------------------------

# torch 2.4 renamed the CUDA-specific profiler fields to device-neutral ones (PR #123247);
# FunctionEventAvg in 2.13 has no ``self_cuda_time_total`` alias at all, older releases have
# only the CUDA names. Every read goes through these fallbacks, newest name first.
_FIELD_FALLBACKS: dict[str, tuple[str, ...]] = {
    "self_device_time_total": ("self_device_time_total", "self_cuda_time_total"),
    "device_time_total": ("device_time_total", "cuda_time_total"),
    "self_device_memory_usage": ("self_device_memory_usage", "self_cuda_memory_usage"),
    "device_memory_usage": ("device_memory_usage", "cuda_memory_usage"),
    "self_cpu_time_total": ("self_cpu_time_total",),
    "cpu_time_total": ("cpu_time_total",),
    "input_dtypes": ("input_dtypes",),
}


def read_event_field(event: Any, name: str, default: Any = 0) -> Any:
    """Read a profiler event field by its current name, falling back to older spellings.

    Args:
        event: a ``FunctionEvent``/``FunctionEventAvg`` (or anything with those attributes).
        name: the current (torch >= 2.4) field name, e.g. ``"self_device_time_total"``.
        default: returned when no spelling exists on the event.

    Returns:
        The first attribute found among the known spellings, else ``default``.
    """
    for attr in _FIELD_FALLBACKS.get(name, (name,)):
        try:
            value = getattr(event, attr)
        except (AttributeError, NotImplementedError):
            continue
        if value is not None:
            return value
    return default


# --------------------------------------------------------------------------------------------
# Attention FLOPs (the profiler and FlopCounterMode count CPU SDPA as 0 in torch 2.13)
# --------------------------------------------------------------------------------------------

_ATTENTION_FORWARD = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    }
)
# Every backward overload takes (grad_out, query, key, value, ...).
_ATTENTION_BACKWARD = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
    }
)


def attention_flops(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    *,
    backward: bool = False,
) -> int:
    """FLOPs of scaled-dot-product attention from the q/k/v shapes ``[batch, heads, seq, dim]``.

    Counts the two matmuls (``QK^T`` and ``PV``) at 2 FLOPs per multiply-add, as
    ``torch.utils.flop_counter`` does for the CUDA kernels; softmax and masking are not counted,
    and causal masking is not discounted. Grouped-query attention (fewer key/value heads) is
    handled: the matmuls run at the query's head count.

    Args:
        query_shape: ``[b, h_q, s_q, d_qk]``.
        key_shape: ``[b, h_kv, s_k, d_qk]``.
        value_shape: ``[b, h_kv, s_k, d_v]``.
        backward: count the backward pass instead (recomputed scores plus four matmuls).

    Returns:
        FLOPs of one call.
    """
    if len(query_shape) != 4 or len(key_shape) != 4 or len(value_shape) != 4:
        raise ValueError(
            f"attention shapes must be 4-D [batch, heads, seq, dim], got q={list(query_shape)}, "
            f"k={list(key_shape)}, v={list(value_shape)}"
        )
    b, h_q, s_q, d_q = (int(x) for x in query_shape)
    s_k = int(key_shape[2])
    d_v = int(value_shape[3])
    per_head = s_q * s_k
    if backward:
        # scores recompute (d_q), grad scores (d_v), grad V (d_v), grad Q (d_q), grad K (d_q)
        return 2 * b * h_q * per_head * (3 * d_q + 2 * d_v)
    return 2 * b * h_q * per_head * (d_q + d_v)


def _attention_flops_from_shapes(name: str, shapes: Sequence[Sequence[int]]) -> int:
    """Attention FLOPs of one recorded call, or 0 when ``name`` is not an attention kernel."""
    try:
        if name in _ATTENTION_FORWARD and len(shapes) >= 3:
            return attention_flops(shapes[0], shapes[1], shapes[2])
        if name in _ATTENTION_BACKWARD and len(shapes) >= 4:
            return attention_flops(shapes[1], shapes[2], shapes[3], backward=True)
    except (ValueError, IndexError, TypeError):
        return 0
    return 0


def _flop_counter_attention_mapping() -> dict[Any, Callable[..., int]]:
    """Formulas for FlopCounterMode(custom_mapping=...) covering the attention ops it misses."""
    import torch

    def forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return attention_flops(q, k, v)

    def backward(
        grad_out: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any
    ) -> int:
        return attention_flops(q, k, v, backward=True)

    mapping: dict[Any, Callable[..., int]] = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu",):
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            mapping[packet] = forward
        packet_bwd = getattr(torch.ops.aten, name + "_backward", None)
        if packet_bwd is not None:
            mapping[packet_bwd] = backward
    return mapping


@dataclass(frozen=True, kw_only=True)
class FlopCount:
    """FLOPs of one call of a step, from ``torch.utils.flop_counter.FlopCounterMode``."""

    total_flops: int
    """All counted FLOPs."""
    by_op: Mapping[str, int]
    """FLOPs per operator, keyed like the profiler (``"aten::mm"``)."""
    by_module: Mapping[str, int]
    """FLOPs per module path (``"layers.0.linear1"``); empty when no module ran."""


def _op_key(packet: Any) -> str:
    """``aten.mm`` (an OpOverloadPacket) -> ``"aten::mm"``, the profiler's spelling."""
    text = str(packet)
    ns, _, rest = text.partition(".")
    return f"{ns}::{rest}" if rest else text


def _flop_counter() -> Any:
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=_flop_counter_attention_mapping())


def _flop_count_from_counter(counter: Any) -> FlopCount:
    counts: dict[str, dict[Any, int]] = counter.get_flop_counts()
    glob = counts.get("Global", {})
    by_op = {_op_key(k): int(v) for k, v in glob.items()}
    by_module = {mod: int(sum(ops.values())) for mod, ops in counts.items() if mod != "Global"}
    return FlopCount(total_flops=int(sum(glob.values())), by_op=by_op, by_module=by_module)


def count_flops(step: Callable[[], Any]) -> FlopCount:
    """Count the FLOPs of one call of ``step`` with ``FlopCounterMode``, attention included.

    The step runs once (it is *executed*, so optimizer state advances). CPU attention
    (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) is counted with
    :func:`attention_flops`, which ``FlopCounterMode`` does not do in torch 2.13.

    Args:
        step: zero-argument callable, e.g. forward + backward + optimizer step.

    Returns:
        ``FlopCount`` with the total, per-operator and per-module FLOPs.
    """
    counter = _flop_counter()
    with counter:
        step()
    return _flop_count_from_counter(counter)


# --------------------------------------------------------------------------------------------
# Roofline
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DevicePeaks:
    """Peak arithmetic rate and memory bandwidth of a device: the roofline's two ceilings."""

    name: str
    """Device name the peaks belong to."""
    flops_per_s: Mapping[str, float]
    """Peak FLOP/s by dtype (``"float32"``, ``"tf32"``, ``"float16"``, ``"bfloat16"``); dense."""
    bytes_per_s: float
    """Peak memory bandwidth in bytes/s."""
    source: Literal["datasheet", "measured"]
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        if not self.flops_per_s or "float32" not in self.flops_per_s:
            raise ValueError(f"flops_per_s must contain 'float32', got {dict(self.flops_per_s)}")
        if self.bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be > 0, got {self.bytes_per_s!r}")

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``, falling back to float32 when the dtype is not listed."""
        return self.flops_per_s.get(dtype, self.flops_per_s["float32"])

    def ridge_flop_per_byte(self, dtype: str = "float32") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.peak_flops(dtype) / self.bytes_per_s

    def classify(self, flops: float, bytes_accessed: float, dtype: str = "float32") -> Roofline:
        """Roofline class of work with ``flops`` FLOPs over ``bytes_accessed`` bytes.

        Returns:
            ``"compute"`` at or above the ridge point, ``"memory"`` below it (including
            zero-FLOP data movement), ``"unknown"`` when no bytes are known.
        """
        if bytes_accessed <= 0:
            return "unknown"
        if flops <= 0:
            return "memory"
        return "compute" if flops / bytes_accessed >= self.ridge_flop_per_byte(dtype) else "memory"


# Dense (no sparsity) vendor datasheet numbers, SXM parts unless the name says PCIe.
# "tf32" applies to fp32 matmuls only when TF32 is enabled (torch.backends.cuda.matmul).
DATASHEET_PEAKS: Mapping[str, DevicePeaks] = {
    "a100-40gb": DevicePeaks(
        name="NVIDIA A100 40GB",
        flops_per_s={"float32": 19.5e12, "tf32": 156e12, "float16": 312e12, "bfloat16": 312e12},
        bytes_per_s=1.555e12,
        source="datasheet",
    ),
    "a100": DevicePeaks(
        name="NVIDIA A100 80GB",
        flops_per_s={"float32": 19.5e12, "tf32": 156e12, "float16": 312e12, "bfloat16": 312e12},
        bytes_per_s=2.039e12,
        source="datasheet",
    ),
    "h100-pcie": DevicePeaks(
        name="NVIDIA H100 PCIe",
        flops_per_s={"float32": 51.2e12, "tf32": 378e12, "float16": 756e12, "bfloat16": 756e12},
        bytes_per_s=2.0e12,
        source="datasheet",
    ),
    "h100": DevicePeaks(
        name="NVIDIA H100 SXM",
        flops_per_s={
            "float32": 66.9e12,
            "tf32": 494.7e12,
            "float16": 989.4e12,
            "bfloat16": 989.4e12,
        },
        bytes_per_s=3.35e12,
        source="datasheet",
    ),
    "h200": DevicePeaks(
        name="NVIDIA H200",
        flops_per_s={
            "float32": 66.9e12,
            "tf32": 494.7e12,
            "float16": 989.4e12,
            "bfloat16": 989.4e12,
        },
        bytes_per_s=4.8e12,
        source="datasheet",
    ),
}


def datasheet_peaks(device_name: str) -> DevicePeaks | None:
    """Datasheet peaks for a GPU name as ``torch.cuda.get_device_name()`` spells it.

    Args:
        device_name: e.g. ``"NVIDIA H100 80GB HBM3"`` or ``"NVIDIA A100-SXM4-40GB"``.

    Returns:
        The matching ``DevicePeaks``, or ``None`` for a device not in :data:`DATASHEET_PEAKS`.
    """
    n = device_name.lower()
    if "h200" in n:
        return DATASHEET_PEAKS["h200"]
    if "h100" in n:
        return DATASHEET_PEAKS["h100-pcie" if "pcie" in n else "h100"]
    if "a100" in n:
        return DATASHEET_PEAKS["a100-40gb" if "40gb" in n else "a100"]
    return None


@functools.lru_cache(maxsize=8)
def measure_cpu_peaks(threads: int = 1) -> DevicePeaks:
    """Measure this CPU's float32 matmul rate and copy bandwidth (best of a few short runs).

    Cached per thread count for the life of the process; takes ~0.2 s.

    Args:
        threads: torch intra-op threads to measure with (match the profiled run).

    Returns:
        ``DevicePeaks`` with ``source="measured"``.
    """
    import torch

    with pinned_threads(threads):
        n = 512
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        torch.mm(a, b)
        best_mm = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best_mm = min(best_mm, time.perf_counter() - t0)
        src = torch.empty(16 * 1024 * 1024 // 4)
        src.fill_(1.0)
        dst = torch.empty_like(src)
        dst.copy_(src)
        best_copy = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best_copy = min(best_copy, time.perf_counter() - t0)
    flops = 2 * n**3 / max(best_mm, 1e-9)
    # A copy reads and writes every byte once.
    bandwidth = 2 * src.numel() * 4 / max(best_copy, 1e-9)
    return DevicePeaks(
        name=f"cpu ({threads} thread{'s' if threads != 1 else ''})",
        flops_per_s={"float32": flops},
        bytes_per_s=bandwidth,
        source="measured",
    )


# --------------------------------------------------------------------------------------------
# Operator table
# --------------------------------------------------------------------------------------------

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
    """Estimated bytes an op call reads and writes, and its main floating dtype.

    Inputs come from the recorded shapes and dtypes. The profiler does not record outputs:
    matmul and attention outputs are computed from the shapes, other ops are charged one
    output the size of their largest input (exact for elementwise ops).
    """
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
    """Estimated bytes read and written per step (see ``_event_bytes``); 0 for views."""
    dtype: str = "float32"
    """Main floating dtype of the inputs (picks the peak in the roofline)."""
    roofline: Roofline = "unknown"
    """``"compute"`` or ``"memory"`` bound against the device's ridge point, else ``"unknown"``."""

    @property
    def intensity_flop_per_byte(self) -> float:
        """Arithmetic intensity (FLOPs per byte accessed); 0 when no bytes are known."""
        return self.flops / self.bytes_accessed if self.bytes_accessed > 0 else 0.0

    @property
    def self_ms_per_call(self) -> float:
        """Self time per call in ms."""
        return self.self_ms / self.calls if self.calls else 0.0


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
class OpDiff:
    """Operator-level differences between a base (control) table and a new (test) table."""

    changes: tuple[OpChange, ...]
    """Every operator on either side, largest absolute self-time change first."""
    base_step_ms: float
    """Base summed operator self time per step, in ms."""
    new_step_ms: float
    """New summed operator self time per step, in ms."""

    def moved(self, *, min_rel: float = 0.10, min_step_share: float = 0.01) -> tuple[OpChange, ...]:
        """Operators that moved: exact changes (added, removed, calls or FLOPs) always, and
        time changes larger than ``min_rel`` of their own base *and* ``min_step_share`` of the
        base step, so that noise on tiny operators is not named.

        Args:
            min_rel: least relative self-time change (0.10 = 10 %).
            min_step_share: least change as a fraction of the base step's self time.

        Returns:
            The moved operators, largest absolute self-time change first.
        """
        floor_ms = min_step_share * self.base_step_ms
        out = []
        for c in self.changes:
            if c.status in ("added", "removed", "changed"):
                out.append(c)
                continue
            big = abs(c.delta_ms) >= floor_ms
            rel = abs(c.delta_ms) >= min_rel * c.base_self_ms
            if big and rel:
                out.append(c)
        return tuple(out)

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
    device: Device
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
            elif not math.isclose(a.calls, b.calls) or not math.isclose(
                a.flops, b.flops, rel_tol=1e-9
            ):
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


def table_from_events(
    events: Iterable[Any],
    *,
    steps: int,
    device: Device = "cpu",
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

    Returns:
        The table.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    from torch.autograd import DeviceType

    acc: dict[str, dict[str, Any]] = {}
    for e in events:
        if getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU or _is_step_marker(e.name):
            continue
        a = acc.setdefault(
            e.name,
            {
                "calls": 0,
                "self": 0.0,
                "total": 0.0,
                "self_cpu": 0.0,
                "flops": 0.0,
                "bytes": 0.0,
                "dtype": None,
                "shapes": {},
            },
        )
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
        # Composite ops (children, no FLOPs of their own) do their data work in the children.
        leaf = not getattr(e, "cpu_children", None)
        if e.name not in _NO_DATA_OPS and (leaf or flops > 0):
            dtypes = list(read_event_field(e, "input_dtypes", []) or [])
            if not dtypes:
                # Profilers without dtypes (older torch): assume float32 tensors.
                dtypes = ["float" if s else "" for s in shapes]
            nbytes, dt = _event_bytes(e.name, shapes, dtypes)
            a["bytes"] += nbytes
            if a["dtype"] is None and nbytes > 0:
                a["dtype"] = dt
        key = tuple(tuple(int(d) for d in s) for s in shapes)
        a["shapes"][key] = a["shapes"].get(key, 0.0) + self_t

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
    return OpTable(
        rows=tuple(rows),
        steps=steps,
        device=device,
        flop_count=flop_count,
        peaks=peaks,
        trace_path=trace_path,
    )


def _default_peaks(device: Device, threads: int | None) -> DevicePeaks | None:
    if device == "cuda":
        import torch

        return datasheet_peaks(torch.cuda.get_device_name())
    import torch

    return measure_cpu_peaks(threads if threads is not None else torch.get_num_threads())


def profile_steps(
    step: Callable[[], Any],
    *,
    steps: int = 3,
    warmup: int = 1,
    record_shapes: bool = True,
    with_flops: bool = True,
    profile_memory: bool = False,
    device: Device = "cpu",
    threads: int | None = 1,
    trace_path: str | os.PathLike[str] | None = None,
    peaks: DevicePeaks | Literal["auto"] | None = "auto",
) -> OpTable:
    """Profile ``warmup + steps`` calls of ``step`` and return per-step operator costs.

    Warm-up steps run under the profiler's warm-up phase (traced, discarded), which also
    absorbs the profiler's own first-step initialisation. When ``with_flops`` is set, the last
    warm-up step runs under ``FlopCounterMode`` (outside the measured steps, so its dispatch
    overhead does not inflate self times) and fills FLOPs the profiler does not estimate.

    Profiled wall time is inflated (3-6 % typical, sometimes 2x on small CPUs): compare these
    self times only with self times from profiled runs, never with latency budgets.

    Args:
        step: zero-argument callable (forward, backward, optimizer step...).
        steps: profiled steps to average over.
        warmup: warm-up steps before them (0 skips the FlopCounterMode pass).
        record_shapes: record input shapes (needed for attention FLOPs and bytes).
        with_flops: ask the profiler for FLOP estimates and run FlopCounterMode.
        profile_memory: also record allocator events (see ``memory.peak_cpu_mib``).
        device: ``"cuda"`` also traces CUDA and uses device self time.
        threads: torch intra-op threads during the run (restored after); ``None`` leaves them.
        trace_path: write a chrome trace there (``.json``; ``.json.gz`` is gzipped).
        peaks: roofline ceilings; ``"auto"`` uses datasheet peaks on CUDA and a cached
            measurement on CPU; ``None`` skips the roofline class.

    Returns:
        ``OpTable`` of per-step averages.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("profile_steps(device='cuda') needs CUDA; none is available")
        activities.append(ProfilerActivity.CUDA)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    flop_count: FlopCount | None = None
    with pinned_threads(threads):
        resolved_peaks = _default_peaks(device, threads) if peaks == "auto" else peaks
        # Without warm-up, no schedule: every step is recorded (a schedule would warn).
        sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1) if warmup else None
        with profile(
            activities=activities,
            record_shapes=record_shapes,
            with_flops=with_flops,
            profile_memory=profile_memory,
            schedule=sched,
        ) as prof:
            for i in range(warmup + steps):
                if with_flops and i == warmup - 1:
                    counter = _flop_counter()
                    with counter:
                        step()
                    flop_count = _flop_count_from_counter(counter)
                else:
                    step()
                sync()
                prof.step()
        path: str | None = None
        if trace_path is not None:
            path = os.fspath(trace_path)
            prof.export_chrome_trace(path)
        return table_from_events(
            prof.events(),
            steps=steps,
            device=device,
            flop_count=flop_count,
            peaks=resolved_peaks,
            trace_path=path,
        )


@dataclass(frozen=True)
class OpRounds:
    """Per-operator samples from several independent profiled rounds (one ``OpTable`` each).

    Per-op budgets are statistical: one sample per round (the round's per-step self time),
    so a round the profiler slowed down as a whole is one outlier, not a shifted mean.
    """

    tables: tuple[OpTable, ...]
    ref_ms: tuple[float, ...] = ()
    """Machine-speed reference time measured right before each round (empty without one)."""

    def names(self) -> tuple[str, ...]:
        """Every operator seen in any round."""
        return tuple(sorted({r.name for t in self.tables for r in t.rows}))

    def self_ms(self, name: str) -> list[float]:
        """Per-step self time of ``name`` in each round, in ms (0 where it did not run)."""
        return [(t.get(name).self_ms if t.get(name) is not None else 0.0) for t in self.tables]  # type: ignore[union-attr]

    def share(self, name: str) -> list[float]:
        """Share of the profiled step of ``name`` in each round, in [0, 1]."""
        return [(t.get(name).share if t.get(name) is not None else 0.0) for t in self.tables]  # type: ignore[union-attr]

    def mean_share(self, name: str) -> float:
        shares = self.share(name)
        return sum(shares) / len(shares)

    def top(self, min_share: float) -> list[str]:
        """ATen operators whose mean share of the step is at least ``min_share``, largest first.

        Only ``aten::`` names: ``record_function`` annotations (``Optimizer.step#...``,
        ``perfbudget::forward``) are regions, not operators, and their self time is glue.
        """
        names = [n for n in self.names() if n.startswith("aten::") and self.mean_share(n) >= min_share]
        return sorted(names, key=self.mean_share, reverse=True)

    def moved_against(self, budget_ms: Mapping[str, float], k: int = 5) -> list[str]:
        """Readable lines: operators whose median self time moved most against ``budget_ms``.

        Args:
            budget_ms: per-operator self-time budgets in ms (``op_self_ms[...]`` values).
            k: lines to return.
        """
        from . import stats

        moves = []
        for name in set(budget_ms) | set(self.top(0.02)):
            now = stats.median(self.self_ms(name))
            was = budget_ms.get(name)
            delta = now - (was or 0.0)
            moves.append((abs(delta), name, now, was))
        moves.sort(reverse=True)
        lines = []
        for _, name, now, was in moves[:k]:
            if was is None:
                lines.append(f"{name}: {now:.3f} ms/step (not budgeted)")
            else:
                rel = f"{(now - was) / was:+.1%}" if was else "new"
                lines.append(f"{name}: {now:.3f} ms/step vs budget {was:.3f} ({rel})")
        return lines


def profile_rounds(
    step: Callable[[], Any],
    *,
    rounds: int = 10,
    steps: int = 2,
    device: Device = "cpu",
    threads: int | None = 1,
    reference: Callable[[], Any] | None = None,
) -> OpRounds:
    """Profile ``rounds`` independent rounds of ``steps`` steps each (one warm-up step per round).

    Shapes and FLOPs are not recorded, to keep the profiler's overhead low: these samples
    feed per-operator timing budgets. Use :func:`profile_steps` for the full table.

    Args:
        step: zero-argument callable.
        rounds: independent profiler sessions (>= 3 for a median with a CI).
        steps: profiled steps per round.
        device: ``"cuda"`` uses device self time.
        threads: torch threads during the rounds.
        reference: a machine-speed reference workload, timed (unprofiled) right before
            each round, so per-round self times can be normalised for host drift.

    Returns:
        :class:`OpRounds` with one table per round.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    import torch

    tables = []
    refs = []
    with pinned_threads(threads):
        for _ in range(rounds):
            if reference is not None:
                t = time.perf_counter()
                reference()
                if device == "cuda":
                    torch.cuda.synchronize()
                refs.append((time.perf_counter() - t) * 1e3)
            tables.append(profile_steps(step, steps=steps, warmup=1, record_shapes=False, with_flops=False,
                                        device=device, threads=threads, peaks=None))
    return OpRounds(tuple(tables), tuple(refs))
