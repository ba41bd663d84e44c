"""Profiled runs of a step: one operator table (``profile_steps``) or per-operator samples over rounds."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from perfbudget.device import DeviceType
from perfbudget.measure.operators.flops import FlopCount, _flop_count_from_counter, _flop_counter
from perfbudget.measure.operators.roofline import DevicePeaks, datasheet_peaks, measure_cpu_peaks
from perfbudget.measure.operators.table import OpTable, table_from_events
from perfbudget.measure.sync import device_sync
from perfbudget.measure.timing import pinned_threads

__all__ = ["OpRounds", "profile_rounds", "profile_steps"]


def _default_peaks(device: DeviceType, threads: int | None) -> DevicePeaks | None:
    import torch

    if device == "cuda":
        return datasheet_peaks(torch.cuda.get_device_name())
    return measure_cpu_peaks(threads if threads is not None else torch.get_num_threads())


def profile_steps(
    step: Callable[[], Any],
    *,
    steps: int = 3,
    warmup: int = 1,
    record_shapes: bool = True,
    with_flops: bool = True,
    profile_memory: bool = False,
    device: DeviceType = "cpu",
    threads: int | None = 1,
    trace_path: str | os.PathLike[str] | None = None,
    peaks: DevicePeaks | Literal["auto"] | None = "auto",
) -> OpTable:
    """Profile ``warmup + steps`` calls of ``step``: an :class:`OpTable` of per-step averages.

    The last warm-up step runs under ``FlopCounterMode`` (its overhead outside the measured steps). Profiling
    inflates time (3-6 %, up to 2x on small CPUs): compare only with other profiled self times.

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
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    with pinned_threads(threads):
        resolved_peaks = _default_peaks(device, threads) if peaks == "auto" else peaks
    prof, flop_count = _profiled(step, steps=steps, warmup=warmup, device=device, threads=threads,
                                 record_shapes=record_shapes, with_flops=with_flops, profile_memory=profile_memory)
    path: str | None = None
    if trace_path is not None:
        path = os.fspath(trace_path)
        prof.export_chrome_trace(path)
    return table_from_events(prof.events(), steps=steps, device=device, flop_count=flop_count,
                             peaks=resolved_peaks, trace_path=path)


def trace_steps(step: Callable[[], Any], *, path: str | os.PathLike[str], steps: int, warmup: int = 1,
                device: DeviceType = "cpu", threads: int | None = 1) -> None:
    """Profile ``warmup + steps`` calls of ``step`` (no shapes, no FLOPs) and write their chrome trace to ``path``."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps!r}, {warmup!r}")
    prof, _ = _profiled(step, steps=steps, warmup=warmup, device=device, threads=threads, record_shapes=False,
                        with_flops=False, profile_memory=False)
    prof.export_chrome_trace(os.fspath(path))


def _profiled(step: Callable[[], Any], *, steps: int, warmup: int, device: DeviceType, threads: int | None,
              record_shapes: bool, with_flops: bool, profile_memory: bool) -> tuple[Any, FlopCount | None]:
    """The finished profiler of ``warmup + steps`` calls of ``step``, and the FLOPs counted in the last warm-up."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("profile_steps(device='cuda') needs CUDA; none is available")
        activities.append(ProfilerActivity.CUDA)
    sync = device_sync(device)
    flop_count: FlopCount | None = None
    with pinned_threads(threads):
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
    return prof, flop_count


@dataclass(frozen=True)
class OpRounds:
    """Per-operator samples, one per independent profiled round (a slowed round is one outlier, not a shift)."""

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

    def calls(self, name: str) -> list[float]:
        """Calls per step of ``name`` in each round (0 where it did not run)."""
        return [(t.get(name).calls if t.get(name) is not None else 0.0) for t in self.tables]  # type: ignore[union-attr]

    def mean_share(self, name: str) -> float:
        shares = self.share(name)
        return sum(shares) / len(shares)

    def median_share(self, name: str) -> float:
        return statistics.median(self.share(name))

    def top(self, min_share: float) -> list[str]:
        """ATen operators (not ``record_function`` regions) whose median share is at least ``min_share``, largest first."""
        # The median: one round stopped inside a tiny operator (``aten::transpose`` at 0.9, on a loaded
        # 2-core VM) would otherwise list it and push the real ones below the threshold.
        names = [n for n in self.names() if n.startswith("aten::") and self.median_share(n) >= min_share]
        return sorted(names, key=self.median_share, reverse=True)


def profile_rounds(
    step: Callable[[], Any],
    *,
    rounds: int = 10,
    steps: int = 2,
    device: DeviceType = "cpu",
    threads: int | None = 1,
    reference: Callable[[], Any] | None = None,
) -> OpRounds:
    """Profile ``rounds`` independent rounds of ``steps`` steps each (one warm-up each; no shapes or FLOPs).

    Args:
        step: zero-argument callable.
        rounds: independent profiler sessions (>= 3 for a median with a CI).
        steps: profiled steps per round.
        device: ``"cuda"`` uses device self time.
        threads: torch threads during the rounds.
        reference: a machine-speed reference, timed before each round (to normalise host drift).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    from ..timing import Bursts

    tables, refs = [], []
    sync = device_sync(device)
    # Lockstep A/B: the other side profiles its round i between this side's rounds i and i + 1
    # (each round warms up its own step), so an A/B compares the sides round by round.
    bursts = Bursts()
    with pinned_threads(threads):
        for i in range(rounds):
            if i:
                bursts.handover()
            if reference is not None:
                t = time.perf_counter()
                reference()
                sync()
                refs.append((time.perf_counter() - t) * 1e3)
            tables.append(profile_steps(step, steps=steps, warmup=1, record_shapes=False, with_flops=False,
                                        device=device, threads=threads, peaks=None))
    return OpRounds(tuple(tables), tuple(refs))
