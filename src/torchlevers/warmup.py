"""Warm-up until steady, a torch.compile wrapper (warm every shape class, record compile_s, then run under fail_on_recompile) and a PYTORCH_CUDA_ALLOC_CONF helper."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

__all__ = [
    "CompileConfig",
    "CompiledStep",
    "CudaAllocConf",
    "DynamoCounters",
    "RecompileError",
    "WarmupConfig",
    "WarmupReport",
    "compile_and_warm",
    "set_cuda_alloc_conf",
    "warm_up",
]


# --------------------------------------------------------------------------- counters


@dataclass(frozen=True)
class DynamoCounters:
    """Snapshot of the dynamo counters that move when something (re)compiles.

    There is no "recompiles" counter: a recompile shows as growth of
    ``frames_total`` and ``unique_graphs``. The counters are process-wide, so
    other compiled code running meanwhile moves them too.
    """

    frames_total: int = 0
    frames_ok: int = 0
    unique_graphs: int = 0
    graph_breaks: int = 0
    """Sum over all graph-break reasons."""

    @classmethod
    def read(cls) -> DynamoCounters:
        """Read ``torch._dynamo.utils.counters`` now."""
        from torch._dynamo.utils import counters

        return cls(
            frames_total=int(counters["frames"]["total"]),
            frames_ok=int(counters["frames"]["ok"]),
            unique_graphs=int(counters["stats"]["unique_graphs"]),
            graph_breaks=int(sum(counters["graph_break"].values())),
        )

    def __sub__(self, other: DynamoCounters) -> DynamoCounters:
        return DynamoCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def changed_since(self, other: DynamoCounters) -> bool:
        """Whether any counter moved."""
        return self != other


# --------------------------------------------------------------------------- warm-up


@dataclass(frozen=True, kw_only=True)
class WarmupConfig:
    """When a warm-up counts as steady."""

    min_rounds: int = 1
    """Passes over all shape classes always run (first-call costs: allocator, caches, compile)."""
    max_rounds: int = 5
    """Give up after this many passes; the report then says ``steady=False``."""
    steady_rounds: int = 1
    """Consecutive passes in which the dynamo counters did not move."""
    time_tolerance: float | None = None
    """Also require the pass time to change by at most this fraction from the previous
    pass (e.g. 0.05); None judges by counters only (timing is noisy on shared machines)."""

    def __post_init__(self) -> None:
        if self.min_rounds < 1:
            raise ValueError(f"min_rounds must be >= 1, got {self.min_rounds!r}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds must be >= min_rounds={self.min_rounds}, got {self.max_rounds!r}")
        if self.steady_rounds < 1:
            raise ValueError(f"steady_rounds must be >= 1, got {self.steady_rounds!r}")
        if self.time_tolerance is not None and not self.time_tolerance > 0:
            raise ValueError(f"time_tolerance must be > 0 or None, got {self.time_tolerance!r}")


@dataclass(frozen=True)
class WarmupReport:
    """What a warm-up did."""

    rounds: int
    """Passes over the shape classes."""
    steps: int
    """Calls of the step."""
    steady: bool
    """The stopping rule was met within ``max_rounds``."""
    round_s: tuple[float, ...]
    """Wall time of each pass (seconds)."""
    compile_s: float
    """Wall time of the calls during which the dynamo counters moved (seconds):
    compilation plus that call's own run."""
    counters: DynamoCounters
    """Counter growth over the whole warm-up."""
    changed: tuple[bool, ...] = field(repr=False)
    """Per pass: did the counters move."""


def _default_sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def warm_up(
    step: Callable[[Any], Any],
    shape_classes: Sequence[Any],
    config: WarmupConfig | None = None,
    *,
    synchronize: Callable[[], None] | None = None,
    read_counters: Callable[[], DynamoCounters] | None = None,
) -> WarmupReport:
    """Run ``step`` once per shape class, pass after pass, until steady.

    Args:
        step: one training or inference step taking one batch, e.g. ``lambda b: train_step(model, b)``.
        shape_classes: one representative batch per shape class (e.g. one per bucket).
            Every shape the measured run will see must be here.
        config: stopping rule; defaults to :class:`WarmupConfig()`.
        synchronize: waits for queued device work before a clock is read; default
            ``torch.cuda.synchronize`` when CUDA is initialised, else nothing.
        read_counters: source of counter snapshots; default :meth:`DynamoCounters.read`.

    Returns:
        :class:`WarmupReport`.
    """
    cfg = config or WarmupConfig()
    if len(shape_classes) == 0:
        raise ValueError("shape_classes is empty: give one batch per shape the step will see")
    sync = synchronize or _default_sync
    read = read_counters or DynamoCounters.read
    start = read()
    round_s: list[float] = []
    changed: list[bool] = []
    compile_s = 0.0
    quiet = 0
    steady = False
    steps = 0
    for r in range(cfg.max_rounds):
        before_round = read()
        t_round = time.perf_counter()
        for batch in shape_classes:
            before = read()
            t0 = time.perf_counter()
            step(batch)
            sync()
            dt = time.perf_counter() - t0
            steps += 1
            if read().changed_since(before):
                compile_s += dt
        round_s.append(time.perf_counter() - t_round)
        moved = read().changed_since(before_round)
        changed.append(moved)
        stable_time = True
        if cfg.time_tolerance is not None:
            stable_time = len(round_s) >= 2 and abs(round_s[-1] - round_s[-2]) <= cfg.time_tolerance * round_s[-2]
        quiet = quiet + 1 if (not moved and stable_time) else 0
        if r + 1 >= cfg.min_rounds and quiet >= cfg.steady_rounds:
            steady = True
            break
    return WarmupReport(
        rounds=len(round_s),
        steps=steps,
        steady=steady,
        round_s=tuple(round_s),
        compile_s=compile_s,
        counters=read() - start,
        changed=tuple(changed),
    )


# --------------------------------------------------------------------------- compile


class RecompileError(RuntimeError):
    """A compiled step met an input it was not warmed up for."""


@dataclass(frozen=True, kw_only=True)
class CompileConfig:
    """``torch.compile`` options and the warm-up rule of :func:`compile_and_warm`."""

    backend: str = "inductor"
    """Dynamo backend ("inductor"; "eager"/"aot_eager" to test the lifecycle cheaply)."""
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None = None
    """Inductor mode; None = default."""
    dynamic: bool | None = None
    """None: dynamo's automatic dynamic shapes; False: one graph per shape class (bounded by
    ``torch._dynamo.config.recompile_limit``); True: dynamic from the start."""
    fullgraph: bool = False
    """Fail on any graph break instead of splitting."""
    warmup: WarmupConfig = field(default_factory=lambda: WarmupConfig(min_rounds=2, max_rounds=5))
    """Stopping rule; two passes minimum so automatic-dynamic recompiles are caught."""

    def __post_init__(self) -> None:
        allowed = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        if self.mode is not None and self.mode not in allowed:
            raise ValueError(f"mode must be one of {allowed} or None, got {self.mode!r}")
        if not self.backend:
            raise ValueError(f"backend must be a backend name, got {self.backend!r}")


class CompiledStep:
    """A compiled callable with its warm-up report; calls run under ``fail_on_recompile``.

    Build it with :func:`compile_and_warm`. A call that would recompile raises
    :class:`RecompileError` instead of silently paying compile time inside a
    measurement.
    """

    def __init__(self, fn: Callable[..., Any], config: CompileConfig | None = None) -> None:
        self.config = config or CompileConfig()
        self.fn = fn
        self.compiled = torch.compile(
            fn,
            backend=self.config.backend,
            mode=self.config.mode,
            dynamic=self.config.dynamic,
            fullgraph=self.config.fullgraph,
        )
        self.report: WarmupReport | None = None

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling during warm-up (see :attr:`WarmupReport.compile_s`)."""
        if self.report is None:
            raise RuntimeError("not warmed up yet: call warm() or use compile_and_warm()")
        return self.report.compile_s

    def warm(self, shape_classes: Sequence[Any]) -> WarmupReport:
        """Call the compiled function on every shape class until the dynamo counters stop moving.

        Raises:
            ValueError: with ``dynamic=False`` and more shape classes than the
                recompile limit, where dynamo would silently fall back to eager.
            RecompileError: if the counters still move after ``max_rounds`` passes.
        """
        limit = int(getattr(torch._dynamo.config, "recompile_limit", 8))
        if self.config.dynamic is False and len(shape_classes) > limit:
            raise ValueError(
                f"{len(shape_classes)} shape classes with dynamic=False exceed "
                f"torch._dynamo.config.recompile_limit={limit}; past it dynamo runs eagerly. "
                "Use dynamic=None, fewer buckets, or raise the limit"
            )
        report = warm_up(self.compiled, shape_classes, self.config.warmup)
        if not report.steady:
            raise RecompileError(
                f"still recompiling after {report.rounds} warm-up passes "
                f"(counters moved: {report.counters}); inputs are not shape-stable"
            )
        self.report = report
        return report

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.report is None:
            raise RuntimeError("not warmed up yet: call warm() or use compile_and_warm()")
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self.compiled(*args, **kwargs)
        except RuntimeError as exc:
            if "fail_on_recompile" in str(exc) or "Detected recompile" in str(exc):
                raise RecompileError(
                    "the compiled step would recompile for this input: add its shape class "
                    "(shape, dtype, device) to the warm-up batches"
                ) from exc
            raise


def compile_and_warm(
    fn: Callable[..., Any], shape_classes: Sequence[Any], config: CompileConfig | None = None
) -> CompiledStep:
    """``torch.compile`` ``fn``, warm every shape class until steady, return the ready step.

    Args:
        fn: a step or module taking one batch (``fn(batch)``).
        shape_classes: one batch per shape class the measurement will use.
        config: compile options; defaults to :class:`CompileConfig()`.

    Returns:
        :class:`CompiledStep` with ``compile_s`` and the warm-up report; calls
        run under ``torch.compiler.set_stance("fail_on_recompile")``.
    """
    step = CompiledStep(fn, config)
    step.warm(shape_classes)
    return step


# --------------------------------------------------------------------------- allocator


_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
# Newer PyTorch reads this first; PYTORCH_CUDA_ALLOC_CONF is the older, lower-priority name.
_ALLOC_ENV_GENERIC = "PYTORCH_ALLOC_CONF"


def _parse_bool(text: str, key: str, source: str) -> bool:
    low = text.strip()
    if low in ("True", "true", "1"):
        return True
    if low in ("False", "false", "0"):
        return False
    raise ValueError(f"{source}: {key}: expected True or False, got {text!r}")


@dataclass(frozen=True, kw_only=True)
class CudaAllocConf:
    """Options of PyTorch's CUDA caching allocator, as written into ``PYTORCH_CUDA_ALLOC_CONF``.

    A typed subset of the allocator's options (the ones that matter for
    fragmentation); only those set (not None) are written. Other keys and the
    list form of ``roundup_power2_divisions`` are rejected by :meth:`parse`.
    """

    expandable_segments: bool | None = None
    """Grow segments in place instead of allocating new ones: less fragmentation when
    shapes vary (bucketed batches)."""
    max_split_size_mb: int | None = None
    """Blocks larger than this (MiB, > 20) are never split."""
    garbage_collection_threshold: float | None = None
    """Reclaim cached blocks once usage exceeds this fraction of the allowed memory, in (0, 1)."""
    roundup_power2_divisions: int | None = None
    """Round allocation sizes to this many divisions per power of two (a power of two)."""
    backend: Literal["native", "cudaMallocAsync"] | None = None
    """Allocator backend; "cudaMallocAsync" ignores the native allocator's options."""

    def __post_init__(self) -> None:
        if self.max_split_size_mb is not None and (
            isinstance(self.max_split_size_mb, bool) or not isinstance(self.max_split_size_mb, int) or self.max_split_size_mb <= 20
        ):
            raise ValueError(f"max_split_size_mb must be an int > 20 (MiB), got {self.max_split_size_mb!r}")
        g = self.garbage_collection_threshold
        if g is not None and not (isinstance(g, (int, float)) and 0.0 < g < 1.0):
            raise ValueError(f"garbage_collection_threshold must be in (0, 1), got {g!r}")
        r = self.roundup_power2_divisions
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1 or r & (r - 1)):
            raise ValueError(f"roundup_power2_divisions must be a power of two >= 1, got {r!r}")
        if self.backend not in (None, "native", "cudaMallocAsync"):
            raise ValueError(f"backend must be 'native', 'cudaMallocAsync' or None, got {self.backend!r}")
        native_only = [
            f.name for f in fields(self) if f.name != "backend" and getattr(self, f.name) is not None
        ]
        if self.backend == "cudaMallocAsync" and native_only:
            raise ValueError(
                f"backend='cudaMallocAsync' ignores {', '.join(native_only)}; drop them or use backend='native'"
            )

    def to_env(self) -> str:
        """The ``key:value,...`` string."""
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            parts.append(f"{f.name}:{'True' if v is True else 'False' if v is False else v}")
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str, *, source: str = _ALLOC_ENV) -> CudaAllocConf:
        """Parse and validate a ``key:value,...`` string.

        Raises:
            ValueError: naming ``source``, the key and the value.
        """
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for raw in filter(None, (p.strip() for p in text.split(","))):
            key, sep, val = raw.partition(":")
            key = key.strip()
            if not sep:
                raise ValueError(f"{source}: {raw!r}: expected key:value")
            if key not in known:
                raise ValueError(f"{source}: {key}: unknown option (known: {', '.join(sorted(known))})")
            if key in values:
                raise ValueError(f"{source}: {key}: given twice")
            try:
                if key == "expandable_segments":
                    values[key] = _parse_bool(val, key, source)
                elif key in ("max_split_size_mb", "roundup_power2_divisions"):
                    values[key] = int(val)
                elif key == "garbage_collection_threshold":
                    values[key] = float(val)
                else:
                    values[key] = val.strip()
            except ValueError as exc:
                if str(exc).startswith(source):
                    raise
                raise ValueError(f"{source}: {key}: not a number: {val!r}") from None
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None


def set_cuda_alloc_conf(
    conf: CudaAllocConf | str,
    *,
    environ: MutableMapping[str, str] | None = None,
    override: bool = False,
    cuda_initialized: Callable[[], bool] | None = None,
) -> str:
    """Validate ``conf`` and write it to ``PYTORCH_CUDA_ALLOC_CONF`` before CUDA starts.

    The allocator reads the variable once, when CUDA is initialised; setting it
    later silently does nothing, so this refuses instead.

    Args:
        conf: options, or a string to validate.
        environ: environment to write (default ``os.environ``).
        override: replace a different value already set.
        cuda_initialized: check used for "CUDA already started" (default
            ``torch.cuda.is_initialized``).

    Returns:
        The string written.

    Raises:
        RuntimeError: CUDA is already initialised in this process.
        ValueError: invalid options, or a conflicting value already set.
    """
    env = os.environ if environ is None else environ
    parsed = conf if isinstance(conf, CudaAllocConf) else CudaAllocConf.parse(conf)
    text = parsed.to_env()
    is_init = cuda_initialized or torch.cuda.is_initialized
    if is_init():
        raise RuntimeError(
            f"{_ALLOC_ENV} must be set before CUDA is initialised, and CUDA is already "
            f"initialised in this process, so {text!r} would be ignored. Set it in the "
            "environment of the process (or call this before the first CUDA call)"
        )
    generic = env.get(_ALLOC_ENV_GENERIC)
    if generic is not None and generic != text:
        raise ValueError(
            f"{_ALLOC_ENV_GENERIC}={generic!r} is set and takes precedence over {_ALLOC_ENV}; "
            f"unset it or set it to {text!r}"
        )
    current = env.get(_ALLOC_ENV)
    if current is not None and current != text and not override:
        raise ValueError(f"{_ALLOC_ENV} is already {current!r}; pass override=True to replace it with {text!r}")
    env[_ALLOC_ENV] = text
    return text
