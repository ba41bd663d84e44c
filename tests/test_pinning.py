"""One GPU per xdist worker: visible GPUs, the worker -> GPU mapping, when -n auto counts GPUs."""

from __future__ import annotations

import functools
import os
import sys

import pytest

# In-process pytester runs restore sys.modules afterwards; keep torch loaded across them.
import torch

from perfbudget.pinning import gpu_for_worker, nvml_gpu_count, visible_gpus, wants_gpu_workers
from tests.measure.support import FakeNvml


@pytest.mark.parametrize(
    ("env", "count", "expected"),
    [
        (None, 4, ["0", "1", "2", "3"]),  # unset: every GPU the driver reports
        (None, 0, []),
        ("2,3", 8, ["2", "3"]),  # a runner limited to some GPUs keeps that limit
        (" 1 , 0 ", 2, ["1", "0"]),
        ("GPU-8f2a,GPU-11c0", 2, ["GPU-8f2a", "GPU-11c0"]),
        ("MIG-5b1e", 1, ["MIG-5b1e"]),
        ("", 4, []),  # empty: no GPU visible
        ("-1", 4, []),
        ("0,-1,1", 4, ["0"]),  # CUDA ignores everything after an invalid entry
        ("0,,1", 4, ["0"]),
    ],
)
def test_visible_gpus(env: str | None, count: int, expected: list[str]) -> None:
    assert visible_gpus(env, count) == expected


def test_each_worker_gets_its_own_gpu_then_round_robin() -> None:
    gpus = ["0", "1", "2", "3"]
    assert [gpu_for_worker(f"gw{i}", gpus) for i in range(4)] == ["0", "1", "2", "3"]
    assert gpu_for_worker("gw5", gpus) == "1"  # more workers than GPUs share
    assert gpu_for_worker("gw1", ["2", "3"]) == "3"  # indices of the runner's own list
    assert gpu_for_worker("gw0", []) is None
    assert gpu_for_worker("master", gpus) is None
    assert gpu_for_worker("gw", gpus) is None


@pytest.mark.parametrize(
    ("expr", "wanted"),
    [("gpu", True), ("gpu and not slow", True), ("(cpu or gpu)", True), ("not gpu", False), ("cpu", False),
     ("", False), ("gpus", False)],
)
def test_auto_workers_follow_gpus_only_when_gpu_tests_are_selected(expr: str, wanted: bool) -> None:
    assert wants_gpu_workers(expr) is wanted


def test_nvml_count_and_no_driver() -> None:
    import pynvml

    eight = FakeNvml(gpus=8)
    assert nvml_gpu_count(module=eight) == 8 and eight.inits == eight.shutdowns == 1
    no_driver = FakeNvml()
    no_driver.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert nvml_gpu_count(module=no_driver) == 0


def test_xdist_workers_are_pinned_one_gpu_each(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # The controller sees two GPUs through CUDA_VISIBLE_DEVICES (no driver needed to map them);
    # `-n auto -m gpu` starts one worker per GPU and each worker sees only its own.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    pytester.makeconftest("""
import os

def pytest_sessionstart(session):
    wid = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    with open(os.path.join(str(session.config.rootpath), f"seen-{wid}.txt"), "w") as fh:
        fh.write(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
""")
    pytester.makepyfile("""
import pytest

# In-process pytester runs restore sys.modules afterwards; keep torch loaded across them.
import torch  # noqa: F401

@pytest.mark.gpu
@pytest.mark.parametrize("i", range(4))
def test_g(i):
    pass
""")
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-n", "auto", "-m", "gpu")
    r.stdout.fnmatch_lines(["*2 workers*"])
    seen = {p.name: p.read_text() for p in pytester.path.glob("seen-gw*.txt")}
    assert seen == {"seen-gw0.txt": "5", "seen-gw1.txt": "7"}


class FakeDriver:
    """libcuda's ``cuDeviceGetCount``: CUDA_ERROR_NOT_INITIALIZED (3) until cuInit ran in the process."""

    def __init__(self, *, initialised: bool) -> None:
        self.rc = 0 if initialised else 3

    def cuDeviceGetCount(self, count: object) -> int:
        return self.rc


def fake_torch(*, initialized: bool = False, cached: int | None = None, lru_count_called: bool = False) -> object:
    """``torch`` as far as pinning looks at it; ``lru_count_called``: an older torch whose
    ``device_count`` is an ``lru_cache`` that has answered once."""
    from types import SimpleNamespace

    if lru_count_called:
        device_count = functools.lru_cache(maxsize=1)(lambda: 2)
        device_count()
    else:
        def device_count() -> int:
            return 2
    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: initialized, _cached_device_count=cached,
                                                device_count=device_count))


def pin(monkeypatch: pytest.MonkeyPatch, torch_module: object | None, driver: FakeDriver | None) -> object:
    from types import SimpleNamespace

    from perfbudget import pinning, xdist

    if torch_module is None:
        monkeypatch.delitem(sys.modules, "torch")
    else:
        monkeypatch.setitem(sys.modules, "torch", torch_module)
    # Fakes for what needs a GPU: the driver library (absent here).
    monkeypatch.setattr(pinning, "cuda_driver", lambda: driver, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    session = SimpleNamespace(pinned_gpu=None)
    xdist.pin_worker(session, "1")  # type: ignore[arg-type]
    return session


def test_a_worker_is_pinned_while_its_device_list_is_still_open(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch imported, device_count() asked through NVML before CUDA initialised (torch >= 2.3
    # does not cache that count, and CUDA reads CUDA_VISIBLE_DEVICES when the driver starts).
    session = pin(monkeypatch, fake_torch(), FakeDriver(initialised=False))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1" and session.pinned_gpu == "1"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("torch_module", "driver", "said"),
    [
        (fake_torch(initialized=True), FakeDriver(initialised=True), "torch initialised CUDA"),
        (fake_torch(cached=2), FakeDriver(initialised=True), "torch.cuda.device_count() cached its count"),
        # An older torch: device_count() is an lru_cache, filled by the first call even before CUDA starts.
        (fake_torch(lru_count_called=True), FakeDriver(initialised=False), "torch.cuda.device_count() cached its count"),
        # torch.cuda.is_available() (and device_count() where NVML cannot count) call
        # cudaGetDeviceCount: the driver starts and reads CUDA_VISIBLE_DEVICES, torch keeps no trace.
        (fake_torch(), FakeDriver(initialised=True), "the CUDA driver was initialised in this process"),
        (None, FakeDriver(initialised=True), "the CUDA driver was initialised in this process"),  # another library
    ],
)
def test_a_worker_is_not_pinned_once_its_device_list_is_fixed(
    monkeypatch: pytest.MonkeyPatch, torch_module: object | None, driver: FakeDriver, said: str
) -> None:
    with pytest.warns(UserWarning, match="could be pinned to GPU 1") as got:
        session = pin(monkeypatch, torch_module, driver)
    assert said in str(got[0].message)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and session.pinned_gpu is None  # type: ignore[attr-defined]


def test_this_machine_without_a_driver_keeps_its_device_list_open() -> None:
    from perfbudget.pinning import cuda_device_list_fixed

    # The real torch (a CPU build, CUDA never initialised) and the real driver lookup (none here).
    assert cuda_device_list_fixed(torch) is None
