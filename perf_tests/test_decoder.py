"""Decoder serving: time to first token, per-token latency, end-to-end p50/p90, tokens/s."""

from __future__ import annotations

import time

import pytest
import torch

from fixtures.measuring import machine_reference
from perfbudget.measure.timing import pinned_threads
from torchlevers.workloads import DecoderWorkload

pytestmark = pytest.mark.budget("decoder-serve")

Round = dict[str, tuple[list[float], list[float]]]


def _serve(w: DecoderWorkload) -> Round:
    """One round of >= 64 requests (so a p90 has samples above it), each followed by the
    machine-speed reference; every latency is paired with its request's reference time."""
    ref = machine_reference(w.device.type)
    sync = torch.cuda.synchronize if w.device.type == "cuda" else (lambda: None)
    out: Round = {m: ([], []) for m in ("ttft_ms", "token_ms", "e2e_ms_p50", "e2e_ms_p90", "tokens_per_s")}
    with pinned_threads(1 if w.device.type == "cpu" else None):
        for req in w.requests():
            t = w.generate(req.prompt_ids, req.max_new_tokens)
            start = time.perf_counter()
            ref()
            sync()
            r = (time.perf_counter() - start) * 1e3
            values = {"ttft_ms": [t.ttft_ms], "token_ms": list(t.token_latencies_ms), "e2e_ms_p50": [t.e2e_ms],
                      "e2e_ms_p90": [t.e2e_ms], "tokens_per_s": [t.tokens_per_s]}
            for metric, xs in values.items():
                out[metric][0].extend(xs)
                out[metric][1].extend([r] * len(xs))
    return out


def test_serving_latency(perf, decoder_serve: DecoderWorkload) -> None:
    first = _serve(decoder_serve)
    fresh: list[Round] = []

    def more(metric: str):
        asked = [0]

        def again() -> tuple[list[float], list[float]]:
            while len(fresh) <= asked[0]:  # one fresh serving round serves every metric
                fresh.append(_serve(decoder_serve))
            asked[0] += 1
            return fresh[asked[0] - 1][metric]

        return again

    for metric, (samples, refs) in first.items():
        perf.record(metric, samples, reference=refs, more=more(metric))
