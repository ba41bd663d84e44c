"""Tests of measure.nvml: the real library is absent here (typed Unmeasurable); the rest on a fake NVML."""

from __future__ import annotations

import os
from typing import Any

import pytest

from perfbudget.measure import machine, nvml
from perfbudget.measure.nvml import (
    GpmMetrics,
    GpuInfo,
    GpuPreflight,
    NvmlGpu,
    Unmeasurable,
    driver_version,
    gpm_metrics,
    gpu_count,
    gpu_info,
    gpu_preflight,
    open_session,
    power_w,
    total_energy_mj,
)

from .support import FakeNvml, cuda_properties, process


def test_missing_nvml_is_a_typed_unmeasurable_not_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", None)
    info = gpu_info()
    if not isinstance(info, Unmeasurable):
        pytest.skip("NVML is present on this machine")
    assert "NVML Shared Library Not Found" in info.reason
    assert "NVMLError_LibraryNotFound" in info.reason
    assert not info
    for result in (total_energy_mj(), power_w(), gpu_preflight(), gpm_metrics(), gpu_count(), driver_version()):
        assert isinstance(result, Unmeasurable)


def test_gpu_info_from_fake(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu.compute_procs = [process(os.getpid(), 1024)]
    info = gpu_info(module=fake_nvml)
    assert isinstance(info, GpuInfo)
    assert info.name == "NVIDIA H200" and info.label == "GPU 0 (cuda:0)"
    assert info.cuda_index == info.nvml_index == 0 and info.uuid == fake_nvml.gpu.uuid
    assert info.memory_total_mib == 141 * 1024 and info.memory_used_mib == 2048
    assert info.power_w == 350.0 and info.energy_mj == 1_000_000
    assert info.sm_clock_mhz == 1980 and info.clock_reasons == ()
    assert info.processes[0].pid == os.getpid() and info.processes[0].used_mib == 1024
    assert info.driver_version == "560.35.03" and info.cuda_driver_version == "12.6"
    assert info.compute_capability == (9, 0)
    assert fake_nvml.inits == fake_nvml.shutdowns == 1


def test_module_seam(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "NVML_MODULE", fake_nvml)
    assert isinstance(gpu_info(), GpuInfo)


def test_unsupported_getter_gives_none(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu.energy_supported = False
    info = gpu_info(module=fake_nvml)
    assert isinstance(info, GpuInfo) and info.energy_mj is None
    energy = total_energy_mj(module=fake_nvml)
    assert isinstance(energy, Unmeasurable) and "Not Supported" in energy.reason


def test_init_failure_and_a_cuda_device_that_is_not_there(fake_nvml: FakeNvml) -> None:
    import pynvml

    fake_nvml.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    result = gpu_info(module=fake_nvml)
    assert isinstance(result, Unmeasurable) and result.reason.startswith("NVML unavailable")
    fake_nvml.init_error = None
    bad = gpu_info(3, module=fake_nvml)
    assert isinstance(bad, Unmeasurable)
    assert bad.reason == "CUDA device 3 is not visible: NVML reports 1 GPU(s) and CUDA_VISIBLE_DEVICES is unset"
    assert fake_nvml.inits == fake_nvml.shutdowns == 1


def test_power_prefers_the_instant_field(fake_nvml: FakeNvml) -> None:
    assert power_w(module=fake_nvml) == 420.0
    assert power_w(instant=False, module=fake_nvml) == 350.0
    fake_nvml.gpu.power_instant_mw = None
    assert power_w(module=fake_nvml) == 350.0


def test_total_energy(fake_nvml: FakeNvml) -> None:
    assert total_energy_mj(module=fake_nvml) == 1_000_000


def test_preflight_ok_when_alone_and_unthrottled(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu.compute_procs = [process(os.getpid(), 512)]
    fake_nvml.gpu.reasons = fake_nvml.nvmlClocksEventReasonGpuIdle
    result = gpu_preflight(module=fake_nvml)
    assert isinstance(result, GpuPreflight) and result.ok and result.problems == ()
    assert result.gpu.clock_reasons == ("gpu_idle",)


def test_preflight_is_not_ok_when_nvml_cannot_say_who_shares_the_gpu_or_whether_it_throttles(
        fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_permission(h: object) -> None:
        raise fake_nvml._error(fake_nvml._real.NVML_ERROR_NO_PERMISSION)

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetComputeRunningProcesses", no_permission)
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetCurrentClocksEventReasons", no_permission)
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", no_permission, raising=False)
    result = gpu_preflight(module=fake_nvml)
    assert isinstance(result, GpuPreflight) and not result.ok
    assert result.problems == (
        "cannot list the processes using GPU 0 (cuda:0) (NVML did not answer): another may share it",
        "cannot read whether GPU 0 (cuda:0)'s clocks are throttled (NVML did not answer)")
    assert result.gpu.processes is None and result.gpu.clock_reasons is None
    # A GPU without graphics that cannot list graphics processes is no problem.
    monkeypatch.undo()
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetGraphicsRunningProcesses", no_permission)
    assert gpu_preflight(module=fake_nvml).ok  # type: ignore[union-attr]


def test_preflight_names_other_processes(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu.compute_procs = [process(os.getpid(), 512), process(4242, 30_000)]
    result = gpu_preflight(module=fake_nvml)
    assert isinstance(result, GpuPreflight) and not result.ok
    assert result.problems == ("other processes use GPU 0 (cuda:0): pid 4242 (compute, 30000 MiB)",)
    assert gpu_preflight(own_pids=[os.getpid(), 4242], module=fake_nvml).ok  # type: ignore[union-attr]


def test_preflight_takes_this_process_listed_under_a_host_pid_as_itself(fake_nvml: FakeNvml) -> None:
    # In a container with its own PID namespace NVML lists host PIDs: this process, which holds
    # a CUDA context, appears under a PID that this /proc does not have.
    host_pid = 99_999_999  # above any pid_max: no process here has it
    fake_nvml.gpu.compute_procs = [process(host_pid, 900)]
    result = gpu_preflight(holds_context=True, module=fake_nvml)
    assert isinstance(result, GpuPreflight) and result.ok
    # Without a context here, the listed process is another one.
    assert not gpu_preflight(holds_context=False, module=fake_nvml).ok  # type: ignore[union-attr]
    # Two foreign PIDs: one is this process, the other is reported, with the assumption said.
    fake_nvml.gpu.compute_procs = [process(host_pid, 900), process(host_pid + 1, 30_000)]
    result = gpu_preflight(holds_context=True, module=fake_nvml)
    assert isinstance(result, GpuPreflight) and not result.ok
    assert result.problems == (f"other processes use GPU 0 (cuda:0): pid {host_pid + 1} (compute, 30000 MiB) "
                               f"(pid {host_pid}, not in this PID namespace, was taken to be this process)",)
    # A process listed under its own PID is never joined by a guess.
    fake_nvml.gpu.compute_procs = [process(os.getpid(), 512), process(host_pid, 900)]
    assert not gpu_preflight(holds_context=True, module=fake_nvml).ok  # type: ignore[union-attr]


def test_preflight_names_throttling(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu.reasons = (
        fake_nvml.nvmlClocksEventReasonSwThermalSlowdown | fake_nvml.nvmlClocksEventReasonSwPowerCap
    )
    result = gpu_preflight(module=fake_nvml)
    assert isinstance(result, GpuPreflight) and not result.ok
    assert result.problems == ("GPU 0 (cuda:0) clocks are throttled: sw_power_cap, sw_thermal_slowdown",)


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
    fake_nvml.gpu.gpm_supported = False
    fake_nvml.gpu.name = "NVIDIA A100-SXM4-80GB"
    result = gpm_metrics(module=fake_nvml)
    assert isinstance(result, Unmeasurable)
    assert result.reason == "GPM is not supported on NVIDIA A100-SXM4-80GB (needs Hopper or later)"


def test_gpm_rejects_unknown_metric_names(fake_nvml: FakeNvml) -> None:
    with pytest.raises(ValueError, match="unknown GPM metric"):
        gpm_metrics(metrics=("sm_busy",), module=fake_nvml)


# --------------------------------------------------------------------------- CUDA device -> NVML device


def test_preflight_of_a_worker_pinned_to_gpu2_sees_only_gpu2(worker_on_gpu2: FakeNvml) -> None:
    """The bug this guards against: NVML GPU 0 holds worker 0's process, and a worker pinned to
    GPU 2 that looked there skipped its own timing."""
    result = gpu_preflight(module=worker_on_gpu2)
    assert isinstance(result, GpuPreflight) and result.ok, result
    assert result.gpu.nvml_index == 2 and result.gpu.uuid == worker_on_gpu2.gpus[2].uuid
    assert [p.pid for p in result.gpu.processes] == [os.getpid()]
    worker_on_gpu2.gpus[2].compute_procs.append(process(4242, 512))
    busy = gpu_preflight(module=worker_on_gpu2)
    assert isinstance(busy, GpuPreflight)
    assert busy.problems == ("other processes use GPU 2 (cuda:0): pid 4242 (compute, 512 MiB)",)


def test_gpm_of_a_worker_pinned_to_gpu2_opens_gpu2(worker_on_gpu2: FakeNvml) -> None:
    worker_on_gpu2.gpus[2].gpm_values = {3: 12.5}
    result = gpm_metrics(module=worker_on_gpu2, metrics=("sm_occupancy",))
    assert isinstance(result, GpmMetrics) and result.values_pct == {"sm_occupancy": 12.5}
    assert [g.gpm_samples for g in worker_on_gpu2.gpus] == [0, 0, 2, 0]


def test_energy_counter_and_power_of_a_worker_pinned_to_gpu2(worker_on_gpu2: FakeNvml) -> None:
    worker_on_gpu2.gpus[2].power_instant_mw = 123_000
    assert total_energy_mj(module=worker_on_gpu2) == 3_000_000
    assert power_w(module=worker_on_gpu2) == 123.0


def _found(nv: FakeNvml, device_index: int | None = None) -> NvmlGpu | Unmeasurable:
    opened = open_session(nv)
    assert not isinstance(opened, Unmeasurable)
    with opened as session:
        return session.gpu(device_index)


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({"uuid": True, "pci": True}, "uuid"),
        ({"uuid": False, "pci": True}, "pci_bus_id"),  # torch without a UUID field
        (None, "cuda_visible_devices"),  # no CUDA in this process: the variable decides
    ],
)
def test_cuda_device_is_matched_by_uuid_then_pci_bus_id_then_the_variable(
    monkeypatch: pytest.MonkeyPatch, props: dict[str, bool] | None, expected: str
) -> None:
    nv = FakeNvml(gpus=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    provider = None if props is None else cuda_properties(nv, [2, 0], **props)
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", provider)
    first, second = _found(nv, 0), _found(nv, 1)
    assert isinstance(first, NvmlGpu) and isinstance(second, NvmlGpu)
    assert (first.nvml_index, first.found_by, first.label) == (2, expected, "GPU 2 (cuda:0)")
    assert (second.nvml_index, second.found_by) == (0, expected)


def test_torch_knows_better_than_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_DEVICE_ORDER=FASTEST_FIRST (CUDA's default) may number GPUs unlike NVML's PCI order:
    where torch can say which device it is, its UUID wins over reading the variable."""
    nv = FakeNvml(gpus=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", cuda_properties(nv, [3]))
    found = _found(nv)
    assert isinstance(found, NvmlGpu) and found.nvml_index == 3 and found.found_by == "uuid"


@pytest.mark.parametrize(
    ("visible", "device_index", "expected"),
    [
        (None, 3, 3),  # unset: every GPU, in NVML's order
        ("GPU-0002", 0, 2),  # a unique UUID prefix, as CUDA accepts
        (" 3 , 1 ", 1, 1),
    ],
)
def test_the_variable_read_as_cuda_reads_it(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, device_index: int, expected: int
) -> None:
    nv = FakeNvml(gpus=4)
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", None)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = _found(nv, device_index)
    assert isinstance(found, NvmlGpu) and found.nvml_index == expected


@pytest.mark.parametrize(
    ("visible", "device_index", "needle"),
    [
        ("2", 1, "CUDA device 1 is not visible: CUDA_VISIBLE_DEVICES='2' leaves 1 of the 4 GPU(s)"),
        ("7", 0, "CUDA_VISIBLE_DEVICES entry '7' names no GPU: NVML reports 4"),
        ("GPU-", 0, "CUDA_VISIBLE_DEVICES entry 'GPU-' matches 4 of the 4 GPU UUIDs"),
        ("GPU-ffff", 0, "CUDA_VISIBLE_DEVICES entry 'GPU-ffff' matches 0 of the 4 GPU UUIDs"),
        ("MIG-5b1e", 0, "CUDA_VISIBLE_DEVICES entry 'MIG-5b1e': NVML knows no such MIG device"),
        ("", 0, "CUDA device 0 is not visible: CUDA_VISIBLE_DEVICES='' leaves 0 of the 4 GPU(s)"),
    ],
)
def test_a_device_the_variable_cannot_name_is_unmeasurable(
    monkeypatch: pytest.MonkeyPatch, visible: str, device_index: int, needle: str
) -> None:
    nv = FakeNvml(gpus=4)
    monkeypatch.setattr(nvml, "CUDA_PROPERTIES", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = _found(nv, device_index)
    assert isinstance(found, Unmeasurable) and needle in found.reason


def test_negative_device_index_is_refused(fake_nvml: FakeNvml) -> None:
    with pytest.raises(ValueError, match="device_index must be a CUDA device index >= 0, got -1"):
        gpu_info(-1, module=fake_nvml)


def test_one_session_serves_many_reads(worker_on_gpu2: FakeNvml) -> None:
    opened = open_session(worker_on_gpu2)
    assert not isinstance(opened, Unmeasurable)
    with opened as session:
        gpu = session.gpu()
        assert isinstance(gpu, NvmlGpu)
        reads: list[Any] = [session.total_energy_mj(gpu) for _ in range(3)]
        assert reads == [3_000_000] * 3 and session.gpu_count() == 4
    assert worker_on_gpu2.inits == worker_on_gpu2.shutdowns == 1


def test_machine_description_reads_the_driver_through_the_same_session(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml, "NVML_MODULE", fake_nvml)
    assert driver_version() == "560.35.03"
    assert machine._nvml_driver() == "560.35.03"
    assert fake_nvml.inits == fake_nvml.shutdowns == 2
