"""pytest-xdist glue: one GPU per worker, and each worker's records sent to the controller, which writes once."""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import pytest

from . import pinning
from .results import Record
from .session import PerfSession, settings_of

__all__ = ["GPU_KEY", "WORKER_KEY", "ControllerHooks", "auto_num_workers", "pin_worker", "worker_output"]

WORKER_KEY = "perfbudget_records"
GPU_KEY = "perfbudget_cuda_visible_devices"


class ControllerHooks:
    """Controller side of xdist: pin workers to GPUs, collect each worker's records once it finishes."""

    def __init__(self, session: PerfSession) -> None:
        self.session = session
        self._gpus: list[str] | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if not self.session.settings.pin_gpus:
            return
        if self._gpus is None:
            self._gpus = pinning.visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), pinning.nvml_gpu_count())
        gpu = pinning.gpu_for_worker(node.workerinput["workerid"], self._gpus)
        if gpu is not None:
            node.workerinput[GPU_KEY] = gpu

    @pytest.hookimpl
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        data = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if data:
            got = json.loads(data)
            self.session.records.extend(Record.from_dict(r) for r in got["records"])
            self.session.errors.extend(got["errors"])
            if got.get("known_keys") is not None:
                self.session.known_keys = (self.session.known_keys or set()) | set(got["known_keys"])


def worker_output(session: PerfSession) -> str:
    """What a worker sends to the controller when it finishes."""
    keys = None if session.known_keys is None else sorted(session.known_keys)
    return json.dumps({"records": [r.as_dict() for r in session.records], "errors": session.errors, "known_keys": keys})


def pin_worker(session: PerfSession, gpu: str) -> None:
    """Give this xdist worker its one GPU; once its CUDA devices are fixed
    (:func:`~perfbudget.pinning.cuda_device_list_fixed`) it is left unpinned, with a warning."""
    fixed = pinning.cuda_device_list_fixed(sys.modules.get("torch"))
    if fixed:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        warnings.warn(f"perfbudget: {fixed} before this worker could be pinned to GPU {gpu}: it sees every GPU "
                      f"visible then (CUDA_VISIBLE_DEVICES={'unset' if visible is None else repr(visible)}); "
                      "ask nothing of CUDA at import or configure time (conftest.py, plugins)", stacklevel=1)
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    session.pinned_gpu = gpu


def auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` with ``-m gpu`` on a GPU machine: one worker per visible GPU."""
    if not pinning.wants_gpu_workers(str(config.getoption("markexpr", "") or "")):
        return None
    if not settings_of(config).pin_gpus:
        return None
    gpus = pinning.visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), pinning.nvml_gpu_count())
    return len(gpus) or None
