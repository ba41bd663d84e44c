"""Decoder serving: time to first token, per-token latency, end-to-end p50/p90, tokens/s."""

from __future__ import annotations

import pytest

from perfbudget.workloads import DecoderWorkload

pytestmark = pytest.mark.budget("decoder-serve")


def _serve(w: DecoderWorkload) -> dict[str, list[float]]:
    # >= 64 requests per round, so the p90 has enough samples above it to mean something.
    timings = w.serve(w.requests())
    return {
        "ttft_ms": [t.ttft_ms for t in timings],
        "token_ms": [x for t in timings for x in t.token_latencies_ms],
        "e2e_ms_p50": [t.e2e_ms for t in timings],
        "e2e_ms_p90": [t.e2e_ms for t in timings],
        "tokens_per_s": [t.tokens_per_s for t in timings],
    }


def test_serving_latency(perf, decoder_serve: DecoderWorkload) -> None:
    first = _serve(decoder_serve)
    fresh: list[dict[str, list[float]]] = []

    def more(metric: str):
        asked = [0]

        def again() -> list[float]:
            while len(fresh) <= asked[0]:  # one fresh serving round serves every metric
                fresh.append(_serve(decoder_serve))
            asked[0] += 1
            return fresh[asked[0] - 1][metric]

        return again

    for metric, samples in first.items():
        perf.record(metric, samples, more=more(metric))
