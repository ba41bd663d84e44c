"""Decoder serving: time to first token, per-token latency, end-to-end p50/p90, tokens/s."""

from __future__ import annotations

import pytest

from torchlevers.workloads import DecoderWorkload

pytestmark = pytest.mark.budget("decoder-serve")


def test_serving_latency(perf, decoder_serve: DecoderWorkload) -> None:
    w = decoder_serve

    def requests():
        # >= 64 requests per round, so a p90 has samples above it.
        return [lambda r=r: w.stream(r.prompt_ids, r.max_new_tokens) for r in w.requests()]

    perf.serve(requests)
