"""Energy per sample of the encoder step and per generated token of the decoder: NVML on GPUs,
RAPL where readable, otherwise unmeasurable with the reason."""

from __future__ import annotations

import pytest

from fixtures.workloads import TrainStep
from torchlevers.workloads import DecoderWorkload


@pytest.mark.budget("encoder-train")
def test_energy_per_sample(perf, encoder_train: TrainStep) -> None:
    perf.energy(encoder_train.step, per_call=encoder_train.samples_per_step, unit="sample")


@pytest.mark.budget("decoder-serve")
def test_energy_per_token(perf, decoder_serve: DecoderWorkload) -> None:
    requests = decoder_serve.requests()[:8]

    def serve() -> None:
        for r in requests:
            for _ in decoder_serve.stream(r.prompt_ids, r.max_new_tokens):
                pass

    perf.energy(serve, per_call=sum(r.max_new_tokens for r in requests), unit="token")
