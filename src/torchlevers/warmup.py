"""A torch.compile wrapper (warm every shape class until dynamo settles, then run under fail_on_recompile) and a PYTORCH_CUDA_ALLOC_CONF helper."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

__all__ = [
    "CompileConfig",
    "CompiledStep",
    "CudaAllocConf",
    "compile_and_warm",
    "set_cuda_alloc_conf",
]


# --------------------------------------------------------------------------- compile

_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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
    min_rounds: int = 2
    """Passes over all shape classes that always run: with ``dynamic=None`` the second shape
    recompiles the first static graph as a dynamic one, so one pass is not enough."""
    max_rounds: int = 5
    """Passes after which a step that still compiles is refused as not shape-stable."""

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES} or None, got {self.mode!r}")
        if not self.backend:
            raise ValueError(f"backend must be a backend name, got {self.backend!r}")
        if self.min_rounds < 1:
            raise ValueError(f"min_rounds must be >= 1, got {self.min_rounds!r}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds must be >= min_rounds={self.min_rounds}, got {self.max_rounds!r}")


def _dynamo_activity() -> tuple[int, int]:
    """Frames dynamo converted and graphs it produced: both grow on every (re)compile.

    There is no recompile counter; these are the two that move (process-wide)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"]), int(counters["stats"]["unique_graphs"])


def _recompile_error(message: str) -> RuntimeError:
    """torch's own ``RecompileError`` (a RuntimeError), imported late: ``torch._dynamo`` costs
    seconds to import and a user of the other levers never needs it."""
    from torch._dynamo.exc import RecompileError

    return RecompileError(message)


def _sync() -> None:
    # Compile time is read from a host clock: wait for queued GPU work first.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class CompiledStep:
    """A compiled callable, warmed on every shape class; calls run under ``fail_on_recompile``.

    Build it with :func:`compile_and_warm`. A call that would recompile raises
    ``torch._dynamo.exc.RecompileError`` instead of silently paying compile time inside a
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
        self.rounds: int | None = None
        """Warm-up passes over the shape classes run (None before :meth:`warm`)."""
        self._compile_s: float | None = None

    @property
    def compile_s(self) -> float:
        """Seconds of the warm-up calls during which dynamo compiled (compilation plus that
        call's own run)."""
        if self._compile_s is None:
            raise RuntimeError("not warmed up yet: call warm() or use compile_and_warm()")
        return self._compile_s

    def warm(self, shape_classes: Sequence[Any]) -> float:
        """Call the compiled function on every shape class, pass after pass, until a pass compiles nothing.

        Args:
            shape_classes: one batch per shape class the step will see (e.g. one per bucket).

        Returns:
            :attr:`compile_s`.

        Raises:
            ValueError: no shape classes, or with ``dynamic=False`` more shape classes than the
                recompile limit, where dynamo would silently fall back to eager.
            torch._dynamo.exc.RecompileError: dynamo still compiles after ``max_rounds`` passes.
        """
        if len(shape_classes) == 0:
            raise ValueError("shape_classes is empty: give one batch per shape the step will see")
        limit = int(getattr(torch._dynamo.config, "recompile_limit", 8))
        if self.config.dynamic is False and len(shape_classes) > limit:
            raise ValueError(
                f"{len(shape_classes)} shape classes with dynamic=False exceed "
                f"torch._dynamo.config.recompile_limit={limit}; past it dynamo runs eagerly. "
                "Use dynamic=None, fewer buckets, or raise the limit"
            )
        compile_s = 0.0
        for done in range(1, self.config.max_rounds + 1):
            before_round = _dynamo_activity()
            for batch in shape_classes:
                before = _dynamo_activity()
                t0 = time.perf_counter()
                self.compiled(batch)
                _sync()
                if _dynamo_activity() != before:
                    compile_s += time.perf_counter() - t0
            if done >= self.config.min_rounds and _dynamo_activity() == before_round:
                self.rounds, self._compile_s = done, compile_s
                return compile_s
        raise _recompile_error(
            f"still recompiling after {self.config.max_rounds} warm-up passes over "
            f"{len(shape_classes)} shape classes: inputs are not shape-stable"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compile_s is None:
            raise RuntimeError("not warmed up yet: call warm() or use compile_and_warm()")
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self.compiled(*args, **kwargs)
        except RuntimeError as exc:
            if "fail_on_recompile" in str(exc) or "Detected recompile" in str(exc):
                raise _recompile_error(
                    "the compiled step would recompile for this input (fail_on_recompile): add its "
                    "shape class (shape, dtype, device) to the warm-up batches"
                ) from exc
            raise


def compile_and_warm(
    fn: Callable[..., Any], shape_classes: Sequence[Any], config: CompileConfig | None = None
) -> CompiledStep:
    """``torch.compile`` ``fn``, warm every shape class until dynamo settles, return the ready step.

    Args:
        fn: a step or module taking one batch (``fn(batch)``).
        shape_classes: one batch per shape class the measurement will use.
        config: compile options; defaults to :class:`CompileConfig()`.

    Returns:
        :class:`CompiledStep` with ``compile_s``; calls run under
        ``torch.compiler.set_stance("fail_on_recompile")``.
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
