"""GPU utilisation: device time, idle share and kernels, SM occupancy, NVML GPM occupancy and tensor cores."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any, ClassVar

from ..lease import LEASE_DEVICE_STEPS, LEASE_GPM_WINDOWS, LEASE_OCC_ROUNDS
from ..measure import nvml, occupancy
from ..measure.measurement import Explanation, Measurement, Passes
from ..measure.occupancy import StepDeviceTime
from ..measure.operators import trace_steps
from ..measure.unmeasurable import Unmeasurable
from ..verdict.judge import Verdict
from .core import RecorderCore, Timed

__all__ = ["DEVICE_STEPS", "GPM_WINDOWS", "OCC_ROUNDS", "Gpu"]

#: Profiled steps per device-time pass, one ``step_device_ms`` sample each: ten give a 95 %
#: interval of the median, and the device time repeats within 0.1 % (docs/gpu-runners.md).
DEVICE_STEPS = 10
#: Profiled rounds behind ``sm_occupancy``, one sample each.
OCC_ROUNDS = 5
#: NVML GPM windows, one sample each.
GPM_WINDOWS = 5


class Gpu(RecorderCore):
    """``perf.occupancy``, ``perf.gpm``, and a GPU step's device side (recorded by ``perf.step``)."""

    METRICS: ClassVar[tuple[str, ...]] = ("kernel_count", "sm_occupancy", "gpm_sm_occupancy", "tensor_util",
                                          "step_device_ms")

    def _device_time(self, step: Callable[[], Any], wall: Passes[Timed], *,
                     explain: Callable[[], Explanation] | None) -> tuple[Verdict, ...]:
        """Record ``kernel_count`` and ``step_device_ms`` (GPU busy time per step) from a profiled pass.

        The idle share against the unprofiled ``wall`` is only said, never judged: it grows when the
        GPU's work gets faster.
        """
        steps = LEASE_DEVICE_STEPS if self.lease else DEVICE_STEPS
        device = Passes(lambda: _device_pass(step, steps=steps, device=self._dev, threads=self._timing_threads()),
                        what="the step's device time")
        if device.unmeasurable is not None:
            return (self.unmeasurable("step_device_ms", device.unmeasurable.reason),)
        first = device.first
        busy = statistics.median(s.busy_ms for s in first)
        line = (f"per step: {busy:.3f} ms busy, {statistics.median(s.summed_ms for s in first):.3f} ms summed over "
                f"streams, {first[0].kernels} kernels, {first[0].copies} copies and fills; the GPU idle "
                f"{max(0.0, 1 - busy / statistics.median(wall.first.samples_ms)):.0%} of the unprofiled step")
        return (self._record("kernel_count", Measurement(samples=[s.kernels for s in first])),
                self._record("step_device_ms", device.measurement(lambda p: [s.busy_ms for s in p], explain=explain,
                                                                  attribution=(line,))))

    def occupancy(self, step: Callable[[], Any], *, rounds: int | None = None, steps: int = 2) -> None:
        """Record ``sm_occupancy``: the duration-weighted occupancy kernels' launch resources allow.

        Unmeasurable where no kernel carries launch resources (CPU). Kernels per step stay
        ``kernel_count``'s, recorded by ``perf.step`` (one owner per metric).

        Args:
            step: one full step.
            rounds: profiled rounds, one sample each (default :data:`OCC_ROUNDS`; fewer under the lease).
            steps: steps per profiled round.
        """
        n = rounds if rounds is not None else LEASE_OCC_ROUNDS if self.lease else OCC_ROUNDS
        passes = Passes(lambda: self._occupancy_pass(step, rounds=n, steps=steps))
        occ, kernels, left_out = passes.first
        if not occ:
            self.unmeasurable("sm_occupancy", "no kernel in the profiler trace carries the launch resources "
                                              "(registers, shared memory, block, grid) occupancy is computed from")
        else:
            self._record("sm_occupancy", passes.measurement(
                lambda p: p[0], attribution=(*left_out, f"{kernels} kernels a profiled step")))

    def _occupancy_pass(self, step: Callable[[], Any], *, rounds: int,
                        steps: int) -> tuple[list[float], int, tuple[str, ...]]:
        """Occupancy per profiled round where computable, kernels per step, and the left-out line."""
        occ: list[float] = []
        kernels = 0
        left_out: tuple[str, ...] = ()
        with tempfile.TemporaryDirectory(prefix="perfbudget-occupancy-") as tmp:
            for i in range(rounds):
                path = Path(tmp) / f"round{i}.json"
                trace_steps(step, path=path, steps=steps, device=self._dev)
                got = occupancy.achieved_occupancy(path)
                if got.occupancy is not None:
                    if not occ and (line := got.left_out_line()) is not None:
                        left_out = (line,)
                    occ.append(got.occupancy)
                kernels = got.kernels // steps
        return occ, kernels, left_out

    def gpm(self, window: Callable[[], Any], *, windows: int | None = None) -> None:
        """Record NVML GPM's ``gpm_sm_occupancy`` and ``tensor_util``, one sample per window.

        Args:
            window: keeps the GPU busy for a second or so, and synchronises.
            windows: windows per sample set (default :data:`GPM_WINDOWS`; fewer under the lease).
        """
        windows = windows if windows is not None else LEASE_GPM_WINDOWS if self.lease else GPM_WINDOWS
        read = {"gpm_sm_occupancy": "sm_occupancy", "tensor_util": "tensor_util"}
        passes = Passes(lambda: _gpm_pass(window, windows=windows, metrics=tuple(read.values())), what="NVML GPM")
        for metric, gpm_name in read.items():
            if passes.unmeasurable is not None:
                self.unmeasurable(metric, passes.unmeasurable.reason)
            else:
                self._record(metric, passes.measurement(itemgetter(gpm_name)))


def _device_pass(step: Callable[[], Any], *, steps: int, device: Any,
                 threads: int | None) -> list[StepDeviceTime] | Unmeasurable:
    """Device time of ``steps`` profiled steps (after one warm-up), or why there is none."""
    with tempfile.TemporaryDirectory(prefix="perfbudget-device-") as tmp:
        path = Path(tmp) / "trace.json"
        trace_steps(step, path=path, steps=steps, device=device, threads=threads)
        times = occupancy.step_device_times(path)
    if not any(t.kernels + t.copies for t in times):
        return Unmeasurable(reason=f"the profiler recorded no kernel, copy or fill launched in {len(times)} profiled "
                                   "steps (ProfilerStep ranges): no CUDA activity in the trace")
    return times


def _gpm_pass(window: Callable[[], Any], *, windows: int, metrics: tuple[str, ...]) -> dict[str, list[float]] | Unmeasurable:
    """GPM metrics (fractions 0-1) of ``windows`` windows, or why GPM cannot be read."""
    out: dict[str, list[float]] = {k: [] for k in metrics}
    for _ in range(windows):
        got = nvml.gpm_metrics(window, metrics=metrics)
        if isinstance(got, Unmeasurable):
            return got
        # NVML answers each metric with its own status: name a refused one rather than a KeyError.
        missing = [k for k in out if k not in got.values_pct]
        if missing:
            return Unmeasurable(reason=f"NVML GPM returned no value for {missing} (got {sorted(got.values_pct)})")
        for k in out:
            out[k].append(got.values_pct[k] / 100.0)
    return out
