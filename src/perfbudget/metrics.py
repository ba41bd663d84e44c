"""The metric registry: every budgetable metric's name, unit, direction and kind."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "KINDS",
    "METRICS",
    "OP_METRIC_FAMILIES",
    "OP_TIMED_FAMILIES",
    "STATISTICAL_KINDS",
    "Direction",
    "Kind",
    "Metric",
    "MetricName",
    "UnknownMetricError",
    "family_of",
    "lookup",
    "op_family_sizes",
    "op_metric",
    "parse_name",
]

Kind = Literal["exact", "count", "bytes", "timing", "rate", "energy"]
Direction = Literal["lower", "higher"]
KINDS: tuple[Kind, ...] = ("exact", "count", "bytes", "timing", "rate", "energy")
#: Kinds judged on samples with a confidence interval (and followed as a trend in history).
STATISTICAL_KINDS: tuple[Kind, ...] = ("timing", "rate", "energy")

@dataclass(frozen=True, kw_only=True)
class Metric:
    """One registered metric family.

    Attributes:
        name: base name, unit last (``step_ms``, ``peak_allocated_mib``).
        unit: unit shown in tables (``ms``, ``MiB``, ``1`` for counts and fractions).
        direction: which way is better.
        kind: how a measurement is judged (see ``verdict.judge``).
        arg: what goes in brackets (``op_self_ms[aten::mm]``), ``None`` for plain metrics.
        portable: holds on any device of the type: filed in ``cpu.yaml``/``cuda.yaml``.
        quantile: the quantile a statistical metric budgets (0.5: the median; 0.9 for ``*_p90``).
        paired: both A/B sides take samples in the same order, so head/base is taken sample by sample.
        doc: one line shown by ``perfbudget show`` and in error suggestions.
    """

    name: str
    unit: str
    direction: Direction
    kind: Kind
    arg: str | None = None
    portable: bool = False
    portable_types: tuple[str, ...] = ()
    """Device types on which the metric is portable though not on every type (CPU peak memory per phase)."""
    quantile: float = 0.5
    paired: bool = False
    per_isa: bool = False
    """Its value depends on the kernel path (bf16 rounding, SM architecture): filed per ISA class, never portable."""
    advisory_on: tuple[str, ...] = ()
    """Device types on which a stored budget of it is only advisory (GPU wall clock follows the host)."""
    doc: str = ""

    def portable_on(self, device_type: str) -> bool:
        """Whether the value holds on any device of ``device_type`` (filed in ``<type>.yaml``)."""
        return self.portable or device_type in self.portable_types

    @property
    def statistical(self) -> bool:
        """Judged on samples with a confidence interval rather than one value."""
        return self.kind in STATISTICAL_KINDS


def _m(name: str, unit: str, direction: Direction, kind: Kind, doc: str, **kw: object) -> Metric:
    return Metric(name=name, unit=unit, direction=direction, kind=kind, doc=doc, **kw)  # type: ignore[arg-type]


_REGISTRY: tuple[Metric, ...] = (
    # exact: deterministic counts and fractions
    _m("graph_breaks", "1", "lower", "exact", "torch.compile graph breaks", portable=True),
    _m("recompiles", "1", "lower", "exact", "dynamo recompiles while measuring", portable=True),
    _m("unique_graphs", "1", "lower", "exact", "dynamo unique graphs after warm-up", portable=True),
    _m("op_count", "1", "lower", "exact", "calls of one operator per step", arg="op", portable=True),
    _m("flops", "1", "lower", "exact", "floating-point operations per step", portable=True),
    _m("padding_rate", "1", "lower", "exact", "padded tokens / all tokens", portable=True),
    _m("nonfinite_grads", "1", "lower", "exact", "parameters with NaN/inf gradients", portable=True),
    _m("scaler_skipped_steps", "1", "lower", "exact", "GradScaler steps skipped for inf/NaN", portable=True),
    # Low-precision numerics: deterministic on one kernel path; the tolerance bounds the worsening worth a failure.
    _m("loss_drift", "1", "lower", "exact", "max relative loss difference to an fp32 reference",
       per_isa=True),
    _m("max_abs_error", "1", "lower", "exact", "max absolute error against a reference", arg="case",
       per_isa=True),
    _m("kernel_count", "1", "lower", "exact", "GPU kernels launched per step"),
    _m("theoretical_occupancy", "1", "higher", "exact", "theoretical SM occupancy of a kernel", arg="kernel"),
    _m("ratio", "1", "lower", "exact", "a deterministic ratio where lower is better", arg="what", portable=True),
    # count: deterministic counters of work, with a tolerance; filed per machine identity (ISA path).
    _m("instructions", "1", "lower", "count", "instructions per step, by the counter named in brackets "
       "(callgrind: valgrind's Ir, the allocators' and dict/type lookups' left out; hardware: the CPU's "
       "user-space instructions counter, everything)", arg="counter"),
    # bytes: allocator peaks
    _m("peak_allocated_mib", "MiB", "lower", "bytes", "peak allocated memory of a phase", arg="phase",
       portable_types=("cpu",)),
    # timing: statistics over samples, lower is better
    _m("step_ms", "ms", "lower", "timing", "one training or inference step (wall clock)", advisory_on=("cuda",)),
    # A GPU step's device work from a profiled pass: stable where its wall time is not.
    _m("step_device_ms", "ms", "lower", "timing", "GPU busy time of one step: kernels, copies and fills, "
       "overlapping streams counted once (profiled pass)"),
    _m("latency_ms", "ms", "lower", "timing", "latency of a named call", arg="what"),
    # A/B sides profile their rounds in turns, round i beside round i (benchmarks/op-pairing-cpu.md).
    _m("op_self_ms", "ms", "lower", "timing", "operator self time per step (profiled)", arg="op", paired=True),
    _m("op_share", "1", "lower", "timing", "operator share of the profiled step", arg="op", paired=True),
    _m("ttft_ms", "ms", "lower", "timing", "time to first token", paired=True),
    _m("token_ms", "ms", "lower", "timing", "per-token decode latency", paired=True),
    _m("e2e_ms_p50", "ms", "lower", "timing", "end-to-end request latency, median", paired=True),
    _m("e2e_ms_p90", "ms", "lower", "timing", "end-to-end request latency, 90th percentile", quantile=0.9,
       paired=True),
    # One sample per run, and cold and warm inductor caches differ ~10x: budget them apart.
    _m("compile_s", "s", "lower", "timing", "torch.compile time until warm, by cache state",
       arg="cache"),
    # rate: statistics over samples, higher is better
    _m("throughput_samples_per_s", "samples/s", "higher", "rate", "training or inference throughput",
       advisory_on=("cuda",)),
    _m("tokens_per_s", "tokens/s", "higher", "rate", "generated tokens per second of a request", paired=True),
    _m("speedup", "x", "higher", "rate", "time ratio baseline / lever, measured in one run", arg="what"),
    _m("sm_occupancy", "1", "higher", "rate", "SM occupancy each kernel's launch resources and grid allow, duration-weighted over the profiled kernels"),
    _m("gpm_sm_occupancy", "1", "higher", "rate", "achieved SM occupancy measured by NVML GPM (Hopper and newer)"),
    _m("sm_util", "1", "higher", "rate", "fraction of SMs busy (NVML GPM)"),
    _m("tensor_util", "1", "higher", "rate", "tensor-core utilisation (NVML GPM)"),
    # energy
    _m("energy_j_per_sample", "J", "lower", "energy", "energy per sample over >= 1 s windows"),
    _m("energy_j_per_token", "J", "lower", "energy", "energy per generated token over >= 1 s windows"),
)

METRICS: dict[str, Metric] = {m.name: m for m in _REGISTRY}

_NAME = re.compile(r"^(?P<base>[a-z][a-z0-9_]*)(?:\[(?P<arg>[^\[\]]+)\])?$")

#: What a unit read from a file may be (``ms``, ``samples/s``); reports render it as it is.
UNIT = re.compile(r"[A-Za-z0-9/]{0,16}")


class UnknownMetricError(ValueError):
    """A metric name that is not in the registry or is malformed."""


@dataclass(frozen=True)
class MetricName:
    """A full metric name split into its registered family and bracket argument."""

    full: str
    metric: Metric
    arg: str | None


def parse_name(full: str) -> MetricName:
    """Parse ``op_self_ms[aten::mm]`` into its registered metric and argument.

    Raises:
        UnknownMetricError: with the closest known name when there is one.
    """
    if not isinstance(full, str):
        raise UnknownMetricError(f"metric name must be a string, got {full!r}")
    m = _NAME.fullmatch(full)  # match's $ would take a trailing newline
    base = m.group("base") if m else family_of(full)
    arg = m.group("arg") if m else None
    metric = METRICS.get(base)
    if metric is None or m is None:
        close = difflib.get_close_matches(base, list(METRICS), n=1, cutoff=0.5)
        hint = ""
        if close:
            known = METRICS[close[0]]
            hint = f"; did you mean {close[0]!r}" + (f" (as {close[0]}[<{known.arg}>])" if known.arg else "") + "?"
        elif metric is not None:
            hint = f"; expected {base}[<{metric.arg}>]" if metric.arg else f"; expected {base!r}"
        raise UnknownMetricError(f"unknown metric {full!r}{hint}")
    if metric.arg and not arg:
        raise UnknownMetricError(f"metric {full!r} needs an argument: {base}[<{metric.arg}>]")
    if arg and not metric.arg:
        raise UnknownMetricError(f"metric {base!r} takes no argument, got {full!r}")
    return MetricName(full=full, metric=metric, arg=arg)


def lookup(full: str) -> Metric:
    """The registered :class:`Metric` of a full metric name."""
    return parse_name(full).metric


#: The per-operator metric families: one check per operator (``op_self_ms[aten::mm]``).
OP_METRIC_FAMILIES: tuple[str, ...] = ("op_self_ms", "op_share", "op_count")
#: The timed ones: a test's many checks of these share one false-alarm budget (Bonferroni).
OP_TIMED_FAMILIES: tuple[str, ...] = ("op_self_ms", "op_share")


def family_of(full: str) -> str:
    """``op_self_ms[aten::mm]`` -> ``op_self_ms``: the name before any argument, registered or not."""
    return full.split("[", 1)[0]


def op_family_sizes(checks: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Per group (nodeid or budget key) of ``(group, metric)`` pairs, its statistical per-operator checks."""
    sizes: dict[str, int] = {}
    for group, metric in checks:
        if family_of(metric) not in OP_TIMED_FAMILIES:
            continue
        try:
            statistical = parse_name(metric).metric.statistical
        except UnknownMetricError:
            continue
        if statistical:
            sizes[group] = sizes.get(group, 0) + 1
    return sizes


def op_metric(metric: str) -> tuple[str, str] | None:
    """``op_self_ms[aten::mm]`` -> ``("op_self_ms", "aten::mm")``; ``None`` for other metrics."""
    family, bracket, rest = metric.partition("[")
    if not bracket or not rest.endswith("]") or family not in OP_METRIC_FAMILIES:
        return None
    return family, rest[:-1]
