"""Energy per sample from hardware energy counters (NVML on GPUs, RAPL on CPUs), or a typed "unmeasurable"."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from perfbudget.device import DeviceType
from perfbudget.measure import nvml, stats
from perfbudget.measure.sync import device_sync
from perfbudget.measure.unmeasurable import Unmeasurable

__all__ = [
    "RAPL_ROOT",
    "EnergySamples",
    "RaplDomain",
    "Unmeasurable",
    "energy_per_sample",
    "rapl_domains",
]

RAPL_ROOT = Path("/sys/class/powercap")


@dataclass(frozen=True, kw_only=True)
class EnergySamples:
    """Energy per processed sample, one value per measurement window."""

    j_per_sample: tuple[float, ...]
    """Joules per sample in each window."""
    window_s: tuple[float, ...]
    """Length of each window in seconds (each >= the requested minimum)."""
    samples_per_window: tuple[int, ...]
    source: Literal["nvml", "rapl"]
    domain: str
    """What the counter covers: ``"GPU 2 (cuda:0), NVIDIA H200"``, ``"package-0"`` (the whole socket)."""

    def summary(self, confidence: float = 0.95) -> stats.Summary:
        """Median J/sample, CI of the median, IQR, CV over the windows."""
        return stats.summarize(self.j_per_sample, confidence)


@dataclass(frozen=True, kw_only=True)
class RaplDomain:
    """A top-level RAPL power zone (a CPU package)."""

    name: str
    energy_path: Path
    max_range_uj: int | None
    """Counter wraps modulo this (``max_energy_range_uj``)."""

    def read_uj(self) -> int:
        """The counter in microjoules."""
        return int(self.energy_path.read_text().strip())


# Only top-level zones (intel-rapl:0, intel-rapl:1): sub-zones (intel-rapl:0:0, core/uncore)
# are parts of their package and would be counted twice.
_TOP_ZONE = re.compile(r"^intel-rapl:\d+$")


def rapl_domains(root: str | os.PathLike[str] = RAPL_ROOT) -> list[RaplDomain] | Unmeasurable:
    """Readable RAPL package counters under ``root``, or ``Unmeasurable`` saying what is missing."""
    base = Path(root)
    if not base.is_dir():
        return Unmeasurable(reason=f"no RAPL: {base} does not exist (VM or non-Linux host)")
    zones = sorted(p for p in base.iterdir() if _TOP_ZONE.match(p.name))
    if not zones:
        return Unmeasurable(reason=f"no RAPL: no intel-rapl:N zone under {base}")
    out = []
    for z in zones:
        energy = z / "energy_uj"
        try:
            int(energy.read_text().strip())
        except PermissionError:
            return Unmeasurable(
                reason=f"RAPL {energy} is not readable: root-only since Linux 5.10 (CVE-2020-8694)"
            )
        except (OSError, ValueError) as exc:
            return Unmeasurable(reason=f"RAPL {energy} cannot be read: {exc}")
        try:
            name = (z / "name").read_text().strip()
        except OSError:
            name = z.name
        try:
            max_range: int | None = int((z / "max_energy_range_uj").read_text().strip())
        except (OSError, ValueError):
            max_range = None
        out.append(RaplDomain(name=name, energy_path=energy, max_range_uj=max_range))
    return out


class _Counter:
    """A monotonically increasing energy counter read in joules."""

    def __init__(self, read: Callable[[], list[int]], wrap: list[int | None], scale_j: float):
        self._read = read
        self._wrap = wrap
        self._scale = scale_j

    def snapshot(self) -> list[int]:
        return self._read()

    def delta_j(self, before: list[int], after: list[int]) -> float:
        total = 0
        for b, a, wrap in zip(before, after, self._wrap, strict=True):
            d = a - b
            if d < 0 and wrap:
                d += wrap
            total += d
        return total * self._scale


def _nvml_counter(
    device_index: int | None, module: Any, stack: ExitStack
) -> tuple[_Counter, str] | Unmeasurable:
    """The energy counter of CUDA device ``device_index``'s GPU; ``stack`` closes its NVML session."""
    opened = nvml.open_session(module)
    if isinstance(opened, Unmeasurable):
        return Unmeasurable(reason=f"no NVML energy counter: {opened.reason}")
    session = stack.enter_context(opened)
    gpu = session.gpu(device_index)
    if isinstance(gpu, Unmeasurable):
        return Unmeasurable(reason=f"no NVML energy counter: {gpu.reason}")
    first = session.total_energy_mj(gpu)
    if isinstance(first, Unmeasurable):
        return Unmeasurable(reason=f"no NVML energy counter on {gpu.label}: {first.reason}")

    def read() -> list[int]:
        v = session.total_energy_mj(gpu)
        if isinstance(v, Unmeasurable):
            raise RuntimeError(f"NVML energy counter of {gpu.label} stopped answering: {v.reason}")
        return [v]

    return _Counter(read, [None], 1e-3), f"{gpu.label}, {gpu.name}"


def _rapl_counter(root: str | os.PathLike[str]) -> tuple[_Counter, str] | Unmeasurable:
    domains = rapl_domains(root)
    if isinstance(domains, Unmeasurable):
        return domains

    def read() -> list[int]:
        return [d.read_uj() for d in domains]

    label = "+".join(d.name for d in domains)
    return _Counter(read, [d.max_range_uj for d in domains], 1e-6), label


def energy_per_sample(
    step: Callable[[], Any],
    *,
    samples_per_call: int = 1,
    device: DeviceType = "cpu",
    windows: int = 5,
    min_window_s: float = 1.0,
    device_index: int | None = None,
    sync: Callable[[], Any] | None = None,
    nvml_module: Any = None,
    rapl_root: str | os.PathLike[str] = RAPL_ROOT,
) -> EnergySamples | Unmeasurable:
    """Joules per sample from an energy counter read around windows of at least ``min_window_s``.

    NVML's counter refreshes every 10-100 ms, so windows under ~1 s are mostly its granularity;
    a RAPL wrap (minutes of full load) is undone once per window, so windows must stay shorter.

    Args:
        step: processes ``samples_per_call`` samples per call.
        samples_per_call: samples (e.g. batch size or tokens) per call.
        device: ``"cuda"``: NVML's counter of CUDA device ``device_index`` (``None``: current);
            ``"cpu"``: RAPL package counters.
        windows: number of windows (energy is a statistics kind: one value per window).
        min_window_s: least window length in seconds.
        sync: waits for queued device work before each counter read (default: ``device``'s).
        nvml_module: a ``pynvml``-compatible module (tests inject a fake one).
        rapl_root: powercap directory.

    Returns:
        ``EnergySamples``, or ``Unmeasurable`` with the reason (no RAPL, no NVML...).
    """
    if samples_per_call < 1:
        raise ValueError(f"samples_per_call must be >= 1, got {samples_per_call!r}")
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows!r}")
    if min_window_s <= 0:
        raise ValueError(f"min_window_s must be > 0, got {min_window_s!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")

    with ExitStack() as stack:
        found = (
            _nvml_counter(device_index, nvml_module, stack) if device == "cuda" else _rapl_counter(rapl_root)
        )
        if isinstance(found, Unmeasurable):
            return found
        counter, domain = found
        if sync is None:
            sync = device_sync("cuda" if device == "cuda" and _cuda_available() else "cpu")
        per_sample, lengths, counts = _windows(step, counter, sync, windows, min_window_s, samples_per_call)
    return EnergySamples(
        j_per_sample=tuple(per_sample),
        window_s=tuple(lengths),
        samples_per_window=tuple(counts),
        source="nvml" if device == "cuda" else "rapl",
        domain=domain,
    )


def _cuda_available() -> bool:
    # A fake NVML (tests) reads "cuda" energy on a machine without CUDA: no GPU work to wait for.
    import torch

    return bool(torch.cuda.is_available())


def _windows(
    step: Callable[[], Any],
    counter: _Counter,
    sync: Callable[[], Any],
    windows: int,
    min_window_s: float,
    samples_per_call: int,
) -> tuple[list[float], list[float], list[int]]:
    """Joules per sample, seconds and samples of each window."""
    per_sample: list[float] = []
    lengths: list[float] = []
    counts: list[int] = []
    step()  # one unmeasured call: lazy initialisation is not part of steady-state energy
    sync()
    for _ in range(windows):
        calls = 0
        before = counter.snapshot()
        t0 = time.perf_counter()
        while True:
            step()
            calls += 1
            if time.perf_counter() - t0 >= min_window_s:
                sync()
                if time.perf_counter() - t0 >= min_window_s:
                    break
        after = counter.snapshot()
        elapsed = time.perf_counter() - t0
        n = calls * samples_per_call
        per_sample.append(counter.delta_j(before, after) / n)
        lengths.append(elapsed)
        counts.append(n)
    return per_sample, lengths, counts
