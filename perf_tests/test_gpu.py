"""GPU-only budgets of the encoder step: SM occupancy (from launch resources and NVML GPM), tensor use."""

from __future__ import annotations

import pytest

from fixtures.workloads import TrainStep

pytestmark = [
    pytest.mark.budget("encoder-train"),
    # Only the CUDA variant of the device fixture: these metrics have no CPU meaning.
    pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")], indirect=True),
]


def test_sm_occupancy_and_kernels(perf, encoder_train: TrainStep) -> None:
    perf.occupancy(encoder_train.step)


def test_gpm_utilisation(perf, encoder_train: TrainStep) -> None:
    def window() -> None:
        # Ten of the CUDA-size (128x512) steps: a window GPM samples whole, about a second.
        for _ in range(10):
            encoder_train.step()
        encoder_train.sync()

    perf.gpm(window)
