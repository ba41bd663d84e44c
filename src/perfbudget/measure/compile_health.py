"""torch.compile health: graph breaks with reasons, recompiles, compile time, inductor cache state, warm-up until stable."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CacheState",
    "CompileCounters",
    "GraphBreak",
    "GraphBreakReport",
    "RecompileError",
    "RecompileWatch",
    "WarmupReport",
    "explain_graph_breaks",
    "inductor_dirs",
    "no_recompiles",
    "read_counters",
    "reset_compiler",
    "warm_until_stable",
]

CacheState = Literal["cold", "warm"]
"""Inductor's FX-graph cache during a compile: ``cold`` when inductor generated code, ``warm`` when
every graph came from the cache (or none was compiled, e.g. backend ``eager``)."""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else text


@dataclass(frozen=True, kw_only=True)
class CompileCounters:
    """A snapshot (or the difference of two) of the process-global ``torch._dynamo.utils.counters``."""

    frames_total: int = 0
    """Frames dynamo converted (``counters["frames"]["total"]``): grows on every compile and recompile."""
    frames_ok: int = 0
    """Frames converted successfully."""
    unique_graphs: int = 0
    """FX graphs produced (``counters["stats"]["unique_graphs"]``)."""
    calls_captured: int = 0
    """Calls captured into graphs."""
    break_reasons: Mapping[str, int] = field(default_factory=dict)
    """Graph-break reason (first line of dynamo's message) -> count."""
    fx_cache_hits: int = 0
    """Inductor graphs loaded from the FX-graph cache (``counters["inductor"]["fxgraph_cache_hit"]``)."""
    fx_cache_misses: int = 0
    """Inductor graphs compiled because the cache did not have them (``fxgraph_cache_miss``)."""
    fx_cache_bypasses: int = 0
    """Inductor graphs compiled without the cache, which cannot hold them (``fxgraph_cache_bypass``)."""

    @property
    def graph_breaks(self) -> int:
        """Total graph breaks."""
        return sum(self.break_reasons.values())

    @property
    def recompiles(self) -> int:
        """Growth of ``frames_total`` (dynamo has no recompile counter), read after warm-up."""
        return self.frames_total

    @property
    def cache(self) -> CacheState:
        """``cold`` if any graph missed or bypassed the FX-graph cache (read around a compile)."""
        return "cold" if self.fx_cache_misses > 0 or self.fx_cache_bypasses > 0 else "warm"

    def __sub__(self, other: CompileCounters) -> CompileCounters:
        reasons = dict(self.break_reasons)
        for k, v in other.break_reasons.items():
            reasons[k] = reasons.get(k, 0) - v
        counts = {f.name: getattr(self, f.name) - getattr(other, f.name)
                  for f in fields(self) if f.name != "break_reasons"}
        return CompileCounters(break_reasons={k: v for k, v in reasons.items() if v}, **counts)

    def changed(self) -> bool:
        """True if this difference shows any compile activity (``frames_ok`` moves with ``frames_total``)."""
        return any(getattr(self, f.name) for f in fields(self) if f.name != "frames_ok")


def read_counters() -> CompileCounters:
    """Snapshot dynamo's global counters now."""
    from torch._dynamo.utils import counters

    reasons: dict[str, int] = {}
    for reason, n in counters.get("graph_break", {}).items():
        key = _first_line(str(reason))
        reasons[key] = reasons.get(key, 0) + int(n)
    frames: Mapping[str, Any] = counters.get("frames", {})
    st: Mapping[str, Any] = counters.get("stats", {})
    inductor: Mapping[str, Any] = counters.get("inductor", {})
    return CompileCounters(
        frames_total=int(frames.get("total", 0)),
        frames_ok=int(frames.get("ok", 0)),
        unique_graphs=int(st.get("unique_graphs", 0)),
        calls_captured=int(st.get("calls_captured", 0)),
        break_reasons=reasons,
        fx_cache_hits=int(inductor.get("fxgraph_cache_hit", 0)),
        fx_cache_misses=int(inductor.get("fxgraph_cache_miss", 0)),
        fx_cache_bypasses=int(inductor.get("fxgraph_cache_bypass", 0)),
    )


def reset_compiler() -> None:
    """Forget every compiled graph and zero dynamo's counters (``torch._dynamo.reset()``)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


@dataclass(frozen=True, kw_only=True)
class GraphBreak:
    """One graph break found by ``torch._dynamo.explain``."""

    reason: str
    """First line of dynamo's reason."""
    location: str | None
    """``file:line in function`` of the user code that broke the graph, when known."""
    detail: str
    """Dynamo's full message (explanation and hint)."""


@dataclass(frozen=True, kw_only=True)
class GraphBreakReport:
    """Graphs and graph breaks of one call of a function under dynamo."""

    graph_count: int
    graph_break_count: int
    breaks: tuple[GraphBreak, ...]

    def lines(self) -> list[str]:
        """Readable lines: one per break, with its location."""
        head = f"{self.graph_count} graph(s), {self.graph_break_count} graph break(s)"
        return [head, *(f"  {b.reason} at {b.location or '?'}" for b in self.breaks)]


def explain_graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GraphBreakReport:
    """Run ``fn(*args, **kwargs)`` under ``torch._dynamo.explain`` and list its graph breaks with
    their user-code locations; ``fn`` is a function or module, not a ``torch.compile`` wrapper."""
    import torch._dynamo

    ex = torch._dynamo.explain(fn)(*args, **kwargs)
    breaks = []
    for r in ex.break_reasons:
        loc = None
        stack = getattr(r, "user_stack", None) or []
        if stack:
            fr = stack[-1]
            loc = f"{fr.filename}:{fr.lineno} in {fr.name}"
        text = str(getattr(r, "reason", r))
        breaks.append(GraphBreak(reason=_first_line(text), location=loc, detail=text))
    return GraphBreakReport(
        graph_count=int(ex.graph_count),
        graph_break_count=int(ex.graph_break_count),
        breaks=tuple(breaks),
    )


@dataclass(frozen=True, kw_only=True)
class WarmupReport:
    """What warming a compiled function up with every shape class took."""

    rounds: int
    """Rounds run (each calls the function once per shape class)."""
    stable: bool
    """True if the last round left the counters unchanged."""
    first_call_s: float
    """Wall time of the very first call, in seconds (trace + compile + run)."""
    compile_s: float
    """Warm-up wall time beyond what the same calls take once stable, in seconds: the compile cost."""
    counters: CompileCounters
    """Counter growth over the whole warm-up (graphs, frames, graph breaks, FX-graph cache)."""
    cache: CacheState
    """``cold`` if inductor compiled any graph during the warm-up, ``warm`` if all came from its
    cache: ``compile_s`` is budgeted per state (``compile_s[cold]``, ``compile_s[warm]``)."""


def warm_until_stable(
    fn: Callable[..., Any],
    inputs: Sequence[Sequence[Any]],
    *,
    max_rounds: int = 4,
    sync: Callable[[], Any] | None = None,
) -> WarmupReport:
    """Call a compiled function with every shape class, round after round, until a round compiles
    nothing (with ``dynamic=None`` the second distinct shape recompiles).

    Args:
        fn: the compiled callable (e.g. ``torch.compile(model)``).
        inputs: one argument tuple per shape class.
        max_rounds: give up after this many rounds (``stable`` is then False).
        sync: called after every call before reading the clock (``torch.cuda.synchronize`` for GPU).

    Returns:
        ``WarmupReport``; ``compile_s`` is the compiling rounds' time minus as many stable rounds'.
    """
    if not inputs:
        raise ValueError("inputs must hold at least one argument tuple (one per shape class)")
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds!r}")
    start = read_counters()
    round_times: list[float] = []
    first_call_s = 0.0
    stable = False
    for r in range(max_rounds):
        before = read_counters()
        t0 = time.perf_counter()
        for i, args in enumerate(inputs):
            c0 = time.perf_counter()
            fn(*args)
            if sync is not None:
                sync()
            if r == 0 and i == 0:
                first_call_s = time.perf_counter() - c0
        round_times.append(time.perf_counter() - t0)
        if not (read_counters() - before).changed():
            stable = True
            break
    if stable:
        steady = round_times[-1]
        compiling = round_times[:-1]
        compile_s = max(0.0, sum(compiling) - steady * len(compiling))
    else:
        compile_s = sum(round_times)
    grown = read_counters() - start
    return WarmupReport(
        rounds=len(round_times),
        stable=stable,
        first_call_s=first_call_s,
        compile_s=compile_s,
        counters=grown,
        cache=grown.cache,
    )


class RecompileError(RuntimeError):
    """A compiled function recompiled (or broke new graphs) where it must not."""


@dataclass
class RecompileWatch:
    """Live view of compile activity inside :func:`no_recompiles`."""

    before: CompileCounters

    def delta(self) -> CompileCounters:
        """Counter growth since the block started."""
        return read_counters() - self.before


@contextmanager
def no_recompiles(*, stance: bool = True) -> Iterator[RecompileWatch]:
    """Fail on any recompile inside the block.

    ``set_stance("fail_on_recompile")`` (torch >= 2.6) raises at once; the counters, compared at
    exit, also catch older torch and frames compiled for the first time.

    Yields a ``RecompileWatch`` (``delta()``: the growth so far); raises ``RecompileError`` naming
    the counter growth. ``stance``: also apply the ``fail_on_recompile`` stance.
    """
    import torch

    watch = RecompileWatch(before=read_counters())
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    ctx: Any = set_stance("fail_on_recompile") if (stance and set_stance is not None) else None
    try:
        if ctx is not None:
            with ctx:
                yield watch
        else:
            yield watch
    except RuntimeError as exc:
        if "fail_on_recompile" in str(exc) and not isinstance(exc, RecompileError):
            raise RecompileError(f"recompile while measuring: {_first_line(str(exc))}") from exc
        raise
    delta = watch.delta()
    if delta.frames_total > 0 or delta.unique_graphs > 0:
        raise RecompileError(
            f"recompile while measuring: frames_total +{delta.frames_total}, "
            f"unique_graphs +{delta.unique_graphs}"
            + (f", new graph breaks: {dict(delta.break_reasons)}" if delta.break_reasons else "")
        )


def inductor_dirs(root: str | os.PathLike[str], *, keep_tmpdir: bool = False) -> None:
    """Keep inductor's cache and its precompiled headers in ``root`` (call before the first compile),
    so a second run starts warm. A ``TORCHINDUCTOR_CACHE_DIR`` already set is kept; headers go to
    ``tempfile.gettempdir()`` whatever it says, so TMPDIR moves too unless ``keep_tmpdir``.

    ``root``: a project-local, ignored folder (``.perfbudget``) that gets ``inductor/`` and ``tmp/``.
    """
    base = Path(root)
    cache = base / "inductor"
    tmp = base / "tmp"
    cache.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))
    if not keep_tmpdir:
        os.environ["TMPDIR"] = str(tmp)
        tempfile.tempdir = None  # re-read TMPDIR
