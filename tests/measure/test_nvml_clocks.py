"""GPU clocks sampled through NVML: busy samples only, filed by who runs (constructed samples and a fake NVML)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from perfbudget.measure import nvml
from perfbudget.measure.nvml import (
    GPU_IDLE,
    ClockSample,
    ClockSampler,
    GpuClocks,
    open_session,
    read_clocks,
)

from .support import FakeGpu, FakeNvml


def sample(sm: float, reasons: int = 0, mem: float = 3201.0) -> ClockSample:
    return ClockSample(sm_mhz=sm, mem_mhz=mem, reasons=reasons)


def test_idle_samples_are_left_out_of_the_clocks() -> None:
    got = GpuClocks.of([sample(1980), sample(345, GPU_IDLE), sample(1970), sample(1950, 0x4), sample(570, GPU_IDLE | 0x2)])
    assert (got.busy, got.idle) == (3, 2)
    assert got.sm_median_mhz == 1970 and got.sm_mean_mhz == pytest.approx(1966.667, abs=1e-3)
    assert got.mem_median_mhz == got.mem_mean_mhz == 3201
    none = GpuClocks.of([sample(345, GPU_IDLE)])
    assert none.busy == 0 and none.sm_median_mhz is None and "no busy sample (1 idle)" in none.text


def test_a_sample_whose_reasons_nvml_could_not_read_is_neither_busy_nor_idle() -> None:
    # Counted busy, an idle sample's 345 MHz would drag the median of the clocks the work ran at.
    got = GpuClocks.of([sample(1980), ClockSample(sm_mhz=345, mem_mhz=405, reasons=None), sample(1970)])
    assert (got.busy, got.idle, got.unknown) == (2, 0, 1) and got.sm_median_mhz == 1975
    assert "(2 busy samples, 1 of unknown state)" in got.text
    unread = GpuClocks.of([ClockSample(sm_mhz=1980, mem_mhz=3201, reasons=None)] * 4)
    assert (unread.busy, unread.unknown) == (0, 4) and "no busy sample (0 idle, 4 of unknown state)" in unread.text


class ClockedNvml(FakeNvml):
    """The fake NVML with a memory clock of its own."""

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        return 3201 if clock == self.NVML_CLOCK_MEM else h.sm_clock


def test_a_sample_reads_both_clocks_and_the_reasons_and_is_filed_under_who_runs(fake_nvml: FakeNvml) -> None:
    nv = ClockedNvml()
    nv.gpu.sm_clock, nv.gpu.reasons = 1965, GPU_IDLE
    session = open_session(nv)
    assert isinstance(session, nvml.NvmlSession)
    gpu = session._from_visible_devices(0)
    assert isinstance(gpu, nvml.NvmlGpu)
    assert read_clocks(session, gpu) == ClockSample(sm_mhz=1965, mem_mhz=3201, reasons=GPU_IDLE)
    who: list[Any] = ["base"]
    sampler = ClockSampler(lambda: who[0], module=nv)
    sampler.sample(session, gpu)
    who[0] = None  # between turns: nobody's
    sampler.sample(session, gpu)
    nv.gpu.reasons = 0
    who[0] = "head"
    sampler.sample(session, gpu)
    assert {k: len(v) for k, v in sampler.samples.items()} == {"base": 1, "head": 1}
    got = sampler.stop()
    assert got["base"].busy == 0 and got["head"].sm_median_mhz == 1965


def test_the_sampler_thread_samples_until_stopped(fake_nvml: FakeNvml) -> None:
    nv = ClockedNvml()
    sampler = ClockSampler(lambda: "head", interval_s=0.001, module=nv).start()
    deadline = time.monotonic() + 10
    while not sampler.samples.get("head"):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    got = sampler.stop()
    assert got["head"].busy >= 1 and got["head"].sm_median_mhz == 1980 and nv.shutdowns == nv.inits == 1


def test_without_nvml_the_sampler_samples_nothing(fake_nvml: FakeNvml) -> None:
    import pynvml

    fake_nvml.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    sampler = ClockSampler(lambda: "base", interval_s=0.001, module=fake_nvml).start()
    assert sampler.stop() == {} and sampler.unavailable.startswith("NVML unavailable")


def test_a_reasons_mask_nvml_does_not_give_is_read_as_unknown(fake_nvml: FakeNvml) -> None:
    class NoReasons(ClockedNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
            raise self._real.NVMLError_NotSupported(self._real.NVML_ERROR_NOT_SUPPORTED)

    nv = NoReasons()
    session = open_session(nv)
    assert isinstance(session, nvml.NvmlSession)
    gpu = session._from_visible_devices(0)
    assert isinstance(gpu, nvml.NvmlGpu)
    got = read_clocks(session, gpu)
    assert isinstance(got, ClockSample) and got.reasons is None
