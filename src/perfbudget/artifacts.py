"""Failure artifacts of a failing step, re-run as ``measure`` times it: chrome trace, flame graph, memory snapshot."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .device import DeviceType
from .measure.sync import device_sync
from .measure.timing import pinned_threads

__all__ = [
    "ALL_KINDS",
    "Artifact",
    "ArtifactConfig",
    "ArtifactKind",
    "artifact_dir",
    "chrome_trace",
    "cuda_memory_snapshot",
    "describe_artifacts",
    "find_py_spy",
    "flame_graph",
    "parse_kinds",
    "write_failure_artifacts",
]

ArtifactKind = Literal["trace", "flamegraph", "memory"]
ALL_KINDS: tuple[ArtifactKind, ...] = ("trace", "flamegraph", "memory")

Step = Callable[[], Any]


@dataclass(frozen=True, kw_only=True)
class ArtifactConfig:
    """Which failure artifacts to write and how."""

    kinds: tuple[ArtifactKind, ...] = ALL_KINDS
    """``trace`` (torch.profiler), ``flamegraph`` (py-spy), ``memory`` (CUDA, memory failures only)."""
    trace_steps: int = 3
    """Steps recorded in the chrome trace, after one warm-up step."""
    flame_seconds: int = 2
    """How long py-spy samples while the step re-runs, in whole s."""
    flame_rate_hz: int = 100
    threads: int | None = 1
    """Torch intra-op threads while re-running, as the timers use them; ``None`` leaves them."""
    py_spy: str | None = None
    """The py-spy executable; ``None`` looks beside the interpreter, then on PATH."""

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in ALL_KINDS]
        if bad:
            raise ValueError(f"kinds: unknown {bad!r}; expected some of {', '.join(ALL_KINDS)}")
        if self.trace_steps < 1:
            raise ValueError(f"trace_steps must be >= 1, got {self.trace_steps!r}")
        if not 0 < self.flame_seconds <= 60:
            raise ValueError(f"flame_seconds must be in (0, 60], got {self.flame_seconds!r}")
        if not 1 <= self.flame_rate_hz <= 1000:
            raise ValueError(f"flame_rate_hz must be in [1, 1000], got {self.flame_rate_hz!r}")


def parse_kinds(text: str) -> tuple[ArtifactKind, ...]:
    """Parse the ``perfbudget_artifacts`` setting: ``all``, ``none`` or a comma list of kinds.

    Raises:
        ValueError: naming the unknown word and the allowed ones.
    """
    words = [w.strip().lower() for w in re.split(r"[,\s]+", text) if w.strip()]
    if words in (["all"], []):
        return ALL_KINDS
    if words == ["none"]:
        return ()
    bad = [w for w in words if w not in ALL_KINDS]
    if bad:
        raise ValueError(f"unknown artifact kind(s) {', '.join(bad)}; expected all, none or some of "
                         f"{', '.join(ALL_KINDS)}")
    return tuple(k for k in ALL_KINDS if k in words)


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """One artifact written (``path``) or not (``path is None``, ``note`` says why)."""

    kind: ArtifactKind
    path: Path | None
    note: str = ""

    @property
    def label(self) -> str:
        return {"trace": "chrome trace", "flamegraph": "flame graph", "memory": "CUDA memory snapshot"}[self.kind]

    def line(self) -> str:
        """One line for a failure message."""
        if self.path is None:
            return f"{self.label}: not written: {self.note}"
        return f"{self.label}: {self.path}" + (f"  ({self.note})" if self.note else "")


def artifact_dir(root: str | os.PathLike[str], nodeid: str) -> Path:
    """The folder of one test's artifacts under ``root``, named safely after the test:
    ``perf_tests/test_x.py::test_step[cuda]`` -> ``root/test_x.py__test_step[cuda]`` (a long one cut, with a hash)."""
    path, sep, rest = nodeid.partition("::")
    tail = path.replace("\\", "/").split("/")[-1] + ("__" + rest.replace("::", "__") if sep else "")
    name = re.sub(r"[^A-Za-z0-9._\-\[\]=+]+", "_", tail).strip("._") or "test"
    if len(name) > 100 or name != tail:
        digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
        name = f"{name[:90]}-{digest}"
    return Path(root) / name


def chrome_trace(step: Step, path: str | os.PathLike[str], *, steps: int = 3, device: DeviceType = "cpu",
                 threads: int | None = 1) -> Artifact:
    """Profile one warm-up and ``steps`` calls of ``step``, threads pinned and the device synchronised
    as the timers do, and write a chrome trace (with shapes) for ui.perfetto.dev.

    Returns:
        The artifact, or one with a note when profiling failed (never raises for the step).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    path = Path(path)
    activities = [ProfilerActivity.CPU]
    if device == "cuda" and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    try:
        sync = device_sync(device)
        with pinned_threads(threads), profile(activities=activities, record_shapes=True,
                                              schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
            for _ in range(steps + 1):
                step()
                sync()
                prof.step()
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
    except Exception as exc:  # an artifact must never hide the test's own failure
        return Artifact(kind="trace", path=None, note=f"profiling the step failed: {type(exc).__name__}: {exc}")
    return Artifact(kind="trace", path=path, note="open in ui.perfetto.dev")


def find_py_spy() -> str | None:
    """py-spy beside this interpreter (a virtual environment's bin/), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def _spy_problem(output: str) -> str:
    text = " ".join(output.split())
    low = text.lower()
    if "permission" in low or "operation not permitted" in low or "ptrace" in low:
        return (f"py-spy may not attach to this process ({text[-200:]}); run as root, set "
                "kernel.yama.ptrace_scope=0, or in a container add --cap-add SYS_PTRACE")
    return f"py-spy failed: {text[-300:] or 'no output'}"


def flame_graph(
    step: Step,
    path: str | os.PathLike[str],
    *,
    seconds: float = 2,
    rate_hz: int = 100,
    py_spy: str | None = None,
    threads: int | None = 1,
    popen: Callable[..., Any] = subprocess.Popen,
    clock: Callable[[], float] = time.monotonic,
    grace_s: float = 20.0,
) -> Artifact:
    """Sample this process with py-spy while ``step`` re-runs in a loop, and write a flame graph SVG.

    Args:
        step: the failing step, re-run while sampled.
        path: the SVG to write.
        seconds: sampling time, in s (rounded up to whole seconds, as py-spy takes them).
        rate_hz: samples per second.
        py_spy: the executable; ``None`` finds it (:func:`find_py_spy`).
        threads: torch threads while re-running (as when measured).
        popen: ``subprocess.Popen`` (replaced in tests).
        clock: monotonic clock in s (replaced in tests).
        grace_s: extra time allowed for py-spy to start and write.

    Returns:
        The artifact; when py-spy is missing, not permitted or fails, one with the reason.
    """
    exe = py_spy or find_py_spy()
    if exe is None:
        return Artifact(kind="flamegraph", path=None,
                        note="py-spy is not installed; `pip install py-spy` to get flame graphs")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    seconds = max(1, math.ceil(seconds))  # py-spy takes whole seconds
    cmd = [exe, "record", "-o", str(path), "-r", str(rate_hz), "--pid", str(os.getpid()), "-d", str(seconds)]
    try:
        proc = popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        return Artifact(kind="flamegraph", path=None, note=f"cannot start py-spy ({exe}): {exc}")
    deadline = clock() + seconds + grace_s
    calls = 0
    step_error = ""
    with pinned_threads(threads):
        while proc.poll() is None and clock() < deadline:
            try:
                step()
            except Exception as exc:
                step_error = f"the step raised {type(exc).__name__}: {exc}"
                break
            calls += 1
    if proc.poll() is None:
        proc.kill()
    try:
        output, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        output = ""
    if step_error:
        return Artifact(kind="flamegraph", path=None, note=step_error)
    if proc.returncode != 0 or not path.is_file():
        return Artifact(kind="flamegraph", path=None, note=_spy_problem(output or ""))
    return Artifact(kind="flamegraph", path=path, note=f"{calls} re-runs sampled at {rate_hz} Hz for {seconds} s")


def cuda_memory_snapshot(step: Step, path: str | os.PathLike[str], *, memory: Any = None,
                         synchronize: Callable[[], None] | None = None, max_entries: int = 100_000) -> Artifact:
    """Record the CUDA caching allocator's history over one ``step`` and dump a snapshot for
    pytorch.org/memory_viz.

    Args:
        step: the failing step.
        path: the ``.pickle`` to write.
        memory: ``torch.cuda.memory`` (replaced in tests).
        synchronize: ``torch.cuda.synchronize`` (replaced in tests).
        max_entries: allocator events kept.
    """
    if memory is None or synchronize is None:
        import torch

        if not torch.cuda.is_available():
            return Artifact(kind="memory", path=None, note="no CUDA device")
        memory = memory or torch.cuda.memory
        synchronize = synchronize or device_sync("cuda")
    path = Path(path)
    try:
        memory._record_memory_history(max_entries=max_entries)
    except Exception as exc:
        return Artifact(kind="memory", path=None, note=f"cannot record memory history: {exc}")
    try:
        step()
        synchronize()
        path.parent.mkdir(parents=True, exist_ok=True)
        memory._dump_snapshot(str(path))
    except Exception as exc:
        return Artifact(kind="memory", path=None, note=f"memory snapshot failed: {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            memory._record_memory_history(enabled=None)
    return Artifact(kind="memory", path=path, note="open in pytorch.org/memory_viz")


def write_failure_artifacts(
    step: Step,
    folder: str | os.PathLike[str],
    *,
    device: DeviceType = "cpu",
    memory_failure: bool = False,
    config: ArtifactConfig | None = None,
    flame: Callable[..., Artifact] = flame_graph,
    trace: Callable[..., Artifact] = chrome_trace,
    snapshot: Callable[..., Artifact] = cuda_memory_snapshot,
) -> list[Artifact]:
    """Write the artifacts of a failing step into ``folder`` (emptied first): the memory snapshot first,
    on a fresh allocator history, the flame graph (the longest re-run) last.

    Args:
        step: the step to re-run.
        folder: this test's artifact folder (see :func:`artifact_dir`).
        device: ``cpu`` or ``cuda``.
        memory_failure: a memory budget failed (the snapshot is written only then, on CUDA).
        config: which artifacts and how.
        flame, trace, snapshot: the writers (replaced in tests).

    Returns:
        One :class:`Artifact` per kind attempted, written or with its reason.
    """
    cfg = config or ArtifactConfig()
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Artifact] = []
    if "memory" in cfg.kinds and memory_failure and device == "cuda":
        out.append(snapshot(step, folder / "cuda-memory.pickle"))
    if "trace" in cfg.kinds:
        out.append(trace(step, folder / "trace.json", steps=cfg.trace_steps, device=device, threads=cfg.threads))
    if "flamegraph" in cfg.kinds:
        out.append(flame(step, folder / "flamegraph.svg", seconds=cfg.flame_seconds, rate_hz=cfg.flame_rate_hz,
                         py_spy=cfg.py_spy, threads=cfg.threads))
    return out


def describe_artifacts(artifacts: Sequence[Artifact]) -> str:
    """The failure-message block naming every artifact (or why it is missing)."""
    if not artifacts:
        return ""
    return "\n".join(["failure artifacts:", *(f"    {a.line()}" for a in artifacts)])
