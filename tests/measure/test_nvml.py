"""Tests of measure.nvml: the real library is absent here (typed Unavailable); the rest on a fake NVML."""

from __future__ import annotations

import os

import pytest

from perfbudget.measure import nvml
from perfbudget.measure.nvml import (
    DeviceInfo,
    GpmMetrics,
    Preflight,
    Unavailable,
    device_info,
    gpm_metrics,
    power_w,
    preflight,
    total_energy_mj,
)

from .support import FakeNvml, process


def test_missing_nvml_is_a_typed_unavailable_not_an_exception() -> None:
    info = device_info()
    if not isinstance(info, Unavailable):
        pytest.skip("NVML is present on this machine")
    assert "NVML Shared Library Not Found" in info.reason
    assert "NVMLError_LibraryNotFound" in info.reason
    assert not info
    for result in (total_energy_mj(), power_w(), preflight(), gpm_metrics()):
        assert isinstance(result, Unavailable)


def test_device_info_from_fake(fake_nvml: FakeNvml) -> None:
    fake_nvml.compute_procs = [process(os.getpid(), 1024)]
    info = device_info(module=fake_nvml)
    assert isinstance(info, DeviceInfo)
    assert info.name == "NVIDIA H200"
    assert info.memory_total_mib == 141 * 1024 and info.memory_used_mib == 2048
    assert info.power_w == 350.0 and info.energy_mj == 1_000_000
    assert info.sm_clock_mhz == 1980 and info.clock_reasons == ()
    assert info.processes[0].pid == os.getpid() and info.processes[0].used_mib == 1024
    assert info.driver_version == "560.35.03" and info.cuda_driver_version == "12.6"
    assert info.compute_capability == (9, 0)
    assert fake_nvml.inits == fake_nvml.shutdowns == 1


def test_module_seam(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "NVML_MODULE", fake_nvml)
    assert isinstance(device_info(), DeviceInfo)


def test_unsupported_getter_gives_none(fake_nvml: FakeNvml) -> None:
    fake_nvml.energy_supported = False
    info = device_info(module=fake_nvml)
    assert isinstance(info, DeviceInfo) and info.energy_mj is None
    energy = total_energy_mj(module=fake_nvml)
    assert isinstance(energy, Unavailable) and "Not Supported" in energy.reason


def test_init_failure_and_bad_index(fake_nvml: FakeNvml) -> None:
    import pynvml

    fake_nvml.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    result = device_info(module=fake_nvml)
    assert isinstance(result, Unavailable) and result.reason.startswith("NVML unavailable")
    fake_nvml.init_error = None
    bad = device_info(3, module=fake_nvml)
    assert isinstance(bad, Unavailable) and "Invalid Argument" in bad.reason
    assert fake_nvml.shutdowns == 1


def test_power_prefers_the_instant_field(fake_nvml: FakeNvml) -> None:
    assert power_w(module=fake_nvml) == 420.0
    assert power_w(instant=False, module=fake_nvml) == 350.0
    fake_nvml.power_instant_mw = None
    assert power_w(module=fake_nvml) == 350.0


def test_total_energy(fake_nvml: FakeNvml) -> None:
    assert total_energy_mj(module=fake_nvml) == 1_000_000


def test_preflight_ok_when_alone_and_unthrottled(fake_nvml: FakeNvml) -> None:
    fake_nvml.compute_procs = [process(os.getpid(), 512)]
    fake_nvml.reasons = fake_nvml.nvmlClocksEventReasonGpuIdle
    result = preflight(module=fake_nvml)
    assert isinstance(result, Preflight) and result.ok and result.problems == ()
    assert result.device.clock_reasons == ("gpu_idle",)


def test_preflight_names_other_processes(fake_nvml: FakeNvml) -> None:
    fake_nvml.compute_procs = [process(os.getpid(), 512), process(4242, 30_000)]
    result = preflight(module=fake_nvml)
    assert isinstance(result, Preflight) and not result.ok
    assert result.problems == ("other processes use GPU 0: pid 4242 (compute, 30000 MiB)",)
    assert preflight(own_pids=[os.getpid(), 4242], module=fake_nvml).ok  # type: ignore[union-attr]


def test_preflight_names_throttling(fake_nvml: FakeNvml) -> None:
    fake_nvml.reasons = (
        fake_nvml.nvmlClocksEventReasonSwThermalSlowdown | fake_nvml.nvmlClocksEventReasonSwPowerCap
    )
    result = preflight(module=fake_nvml)
    assert isinstance(result, Preflight) and not result.ok
    assert result.problems == ("GPU 0 clocks are throttled: sw_power_cap, sw_thermal_slowdown",)


def test_gpm_metrics_from_fake(fake_nvml: FakeNvml) -> None:
    ran = []
    result = gpm_metrics(lambda: ran.append(1), module=fake_nvml)
    assert isinstance(result, GpmMetrics)
    assert result.values_pct == {"sm_occupancy": 47.5, "sm_util": 91.0, "tensor_util": 63.0}
    assert ran == [1]
    # The run was shorter than NVML's minimum sample spacing: padded, and said so.
    assert result.padded_s > 0 and result.window_s >= 0.1
    assert fake_nvml.samples_alloc == fake_nvml.samples_freed == 2


def test_gpm_unsupported_before_hopper(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpm_supported = False
    fake_nvml.name = "NVIDIA A100-SXM4-80GB"
    result = gpm_metrics(module=fake_nvml)
    assert isinstance(result, Unavailable)
    assert result.reason == "GPM is not supported on NVIDIA A100-SXM4-80GB (needs Hopper or later)"


def test_gpm_rejects_unknown_metric_names(fake_nvml: FakeNvml) -> None:
    with pytest.raises(ValueError, match="unknown GPM metric"):
        gpm_metrics(metrics=("sm_busy",), module=fake_nvml)
