"""GPU-only budgets of the encoder step: SM occupancy (estimated and GPM), tensor use, kernel count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fixtures.workloads import TrainStep
from perfbudget.measure import nvml, occupancy
from perfbudget.measure.operators import profile_steps

pytestmark = [
    pytest.mark.budget("encoder-train"),
    # Only the CUDA variant of the device fixture: these metrics have no CPU meaning.
    pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")], indirect=True),
]


def _rounds_of_occupancy(step, trace_dir: Path, rounds: int = 5) -> tuple[list[float], int]:
    occ: list[float] = []
    kernels = 0
    for i in range(rounds):
        path = trace_dir / f"step{i}.json"
        profile_steps(step, steps=2, warmup=1, device="cuda", trace_path=path, with_flops=False, peaks=None)
        got = occupancy.achieved_occupancy(path)
        if got.occupancy is not None:
            occ.append(got.occupancy)
        kernels = got.kernels // 2  # two profiled steps
    return occ, kernels


def test_sm_occupancy_and_kernels(perf, encoder_train: TrainStep, tmp_path: Path) -> None:
    e = encoder_train
    occ, kernels = _rounds_of_occupancy(e.step, tmp_path)
    perf.record("kernel_count", kernels)
    if not occ:
        perf.unmeasurable("sm_occupancy", "the profiler's kernel records carry no occupancy estimate")
    else:
        perf.record("sm_occupancy", occ, more=lambda: _rounds_of_occupancy(e.step, tmp_path)[0])


def test_gpm_utilisation(perf, encoder_train: TrainStep) -> None:
    e = encoder_train

    def window() -> None:
        for _ in range(50):
            e.step()
        torch.cuda.synchronize()

    samples: dict[str, list[float]] = {"sm_occupancy": [], "tensor_util": []}
    for _ in range(5):
        got = nvml.gpm_metrics(window, metrics=("sm_occupancy", "tensor_util"))
        if isinstance(got, nvml.Unmeasurable):
            perf.unmeasurable("tensor_util", got.reason)
            return
        for k in samples:
            samples[k].append(got.values_pct[k] / 100.0)
    perf.record("tensor_util", samples["tensor_util"], extra={"gpm_sm_occupancy": samples["sm_occupancy"]},
                attribution=[json.dumps({"gpm_sm_occupancy": samples["sm_occupancy"]})])
