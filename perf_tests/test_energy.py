"""Energy per sample of the encoder step: NVML on GPUs, RAPL where readable, otherwise unmeasurable."""

from __future__ import annotations

import pytest

from fixtures.workloads import TrainStep
from perfbudget.measure import energy


@pytest.mark.budget("encoder-train")
def test_energy_per_sample(perf, encoder_train: TrainStep) -> None:
    e = encoder_train
    got = energy.energy_per_sample(e.step, samples_per_call=e.samples_per_step, device=e.device)  # type: ignore[arg-type]
    if isinstance(got, energy.Unmeasurable):
        perf.unmeasurable("energy_j_per_sample", got.reason)
        return
    perf.record("energy_j_per_sample", list(got.j_per_sample))
