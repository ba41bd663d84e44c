"""Tests of measure.energy: "unmeasurable" here, RAPL on a constructed powercap tree, NVML on a fake."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from perfbudget.measure.energy import (
    RAPL_ROOT,
    EnergySamples,
    Unmeasurable,
    energy_per_sample,
    rapl_domains,
)

from .support import FakeNvml


def test_this_machine_has_no_rapl() -> None:
    if RAPL_ROOT.is_dir():
        pytest.skip("this machine exposes powercap")
    result = energy_per_sample(lambda: None, device="cpu", min_window_s=0.01)
    assert isinstance(result, Unmeasurable) and not result
    assert str(RAPL_ROOT) in result.reason


def test_cuda_energy_without_nvml_is_unmeasurable() -> None:
    result = energy_per_sample(lambda: None, device="cuda", min_window_s=0.01)
    if isinstance(result, EnergySamples):
        pytest.skip("NVML is present on this machine")
    assert isinstance(result, Unmeasurable) and "NVML" in result.reason


def make_powercap(root: Path, start_uj: int, max_uj: int = 262_143_328_850) -> Path:
    """A powercap tree with one package and one sub-zone (which must not be counted)."""
    pkg = root / "intel-rapl:0"
    sub = root / "intel-rapl:0:0"
    for zone, name in ((pkg, "package-0"), (sub, "core")):
        zone.mkdir(parents=True)
        (zone / "name").write_text(name + "\n")
        (zone / "energy_uj").write_text(f"{start_uj}\n")
        (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return pkg / "energy_uj"


def burn_one_joule(counter: Path, max_uj: int = 262_143_328_850) -> None:
    value = int(counter.read_text())
    counter.write_text(f"{(value + 1_000_000) % max_uj}\n")


def test_rapl_joules_per_sample(tmp_path: Path) -> None:
    counter = make_powercap(tmp_path, start_uj=5_000_000)
    result = energy_per_sample(
        lambda: burn_one_joule(counter),
        samples_per_call=4,
        device="cpu",
        windows=3,
        min_window_s=0.01,
        rapl_root=tmp_path,
    )
    assert isinstance(result, EnergySamples)
    assert result.source == "rapl" and result.domain == "package-0"
    # Every call burns exactly 1 J for 4 samples, whatever the window length.
    assert result.j_per_sample == pytest.approx((0.25, 0.25, 0.25))
    assert all(w >= 0.01 for w in result.window_s)
    assert all(n % 4 == 0 for n in result.samples_per_window)
    assert result.summary().median == pytest.approx(0.25)


def test_rapl_counter_wraparound(tmp_path: Path) -> None:
    max_uj = 10_000_000  # wraps every 10 calls
    counter = make_powercap(tmp_path, start_uj=max_uj - 1_500_000, max_uj=max_uj)

    def step() -> None:
        burn_one_joule(counter, max_uj)
        # Each call takes >= 4 ms, so a 5 ms window holds at most 2 calls: less than one wrap,
        # as real windows are far shorter than the real counter's wrap period (minutes).
        time.sleep(0.004)

    result = energy_per_sample(
        step, device="cpu", windows=6, min_window_s=0.005, rapl_root=tmp_path
    )
    assert isinstance(result, EnergySamples)
    assert result.j_per_sample == pytest.approx((1.0,) * 6)


def test_rapl_without_zones(tmp_path: Path) -> None:
    result = rapl_domains(tmp_path)
    assert isinstance(result, Unmeasurable) and "no intel-rapl:N zone" in result.reason


def test_rapl_unreadable_counter(tmp_path: Path) -> None:
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "energy_uj").mkdir()  # reading a directory fails like an unreadable file
    result = rapl_domains(tmp_path)
    assert isinstance(result, Unmeasurable) and "cannot be read" in result.reason


def test_nvml_joules_per_sample(fake_nvml: FakeNvml) -> None:
    def step() -> None:
        fake_nvml.gpu.energy_mj += 2_000  # 2 J per call

    result = energy_per_sample(
        step, samples_per_call=8, device="cuda", windows=2, min_window_s=0.01, nvml_module=fake_nvml
    )
    assert isinstance(result, EnergySamples)
    assert result.source == "nvml" and result.domain == "GPU 0 (cuda:0), NVIDIA H200"
    assert result.j_per_sample == pytest.approx((0.25, 0.25))
    # One NVML session for every read of the measurement.
    assert fake_nvml.inits == fake_nvml.shutdowns == 1


def test_nvml_energy_of_a_worker_pinned_to_gpu2_reads_gpu2(worker_on_gpu2: FakeNvml) -> None:
    def step() -> None:
        for g in worker_on_gpu2.gpus:  # the other workers burn far more on their own GPUs
            g.energy_mj += 2_000 if g.index == 2 else 50_000

    result = energy_per_sample(
        step, samples_per_call=8, device="cuda", windows=2, min_window_s=0.01, nvml_module=worker_on_gpu2
    )
    assert isinstance(result, EnergySamples)
    assert result.domain == "GPU 2 (cuda:0), NVIDIA H200"
    assert result.j_per_sample == pytest.approx((0.25, 0.25))


def test_nvml_without_energy_counter(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu.energy_supported = False
    result = energy_per_sample(lambda: None, device="cuda", nvml_module=fake_nvml)
    assert isinstance(result, Unmeasurable) and result.reason.startswith("no NVML energy counter on GPU 0 (cuda:0)")
    assert fake_nvml.inits == fake_nvml.shutdowns == 1


def test_nvml_energy_of_a_device_not_visible(fake_nvml: FakeNvml) -> None:
    result = energy_per_sample(lambda: None, device="cuda", device_index=1, nvml_module=fake_nvml)
    assert isinstance(result, Unmeasurable) and "CUDA device 1 is not visible" in result.reason


def test_energy_and_nvml_share_one_unmeasurable_type() -> None:
    from perfbudget.measure import nvml, unmeasurable

    assert Unmeasurable is nvml.Unmeasurable is unmeasurable.Unmeasurable


def test_argument_validation() -> None:
    with pytest.raises(ValueError, match="samples_per_call"):
        energy_per_sample(lambda: None, samples_per_call=0)
    with pytest.raises(ValueError, match="min_window_s"):
        energy_per_sample(lambda: None, min_window_s=0)
