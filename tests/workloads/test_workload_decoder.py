"""The decoder serving path: KV-cache equivalence, requests, generation timing."""

from __future__ import annotations

import itertools

import pytest
import torch

from torchlevers.workloads import DecoderWorkload, GenerationTiming, config_for


@pytest.fixture(scope="module")
def decoder() -> DecoderWorkload:
    return DecoderWorkload(config_for("decoder", "tiny"))


def test_kv_cache_gives_the_logits_of_a_full_recompute(decoder: DecoderWorkload) -> None:
    prompt = decoder.requests(3)[2].prompt_ids
    p = prompt.shape[0]
    generated = decoder.generate(prompt, 12).token_ids
    full_ids = torch.cat([prompt, torch.tensor(generated)])
    with torch.inference_mode():
        full = decoder.model(full_ids[None])[0]  # no cache: every position recomputed
    # Greedy: each generated token is the argmax of the recomputed logits before it.
    assert list(generated) == full[p - 1 : -1].argmax(dim=-1).tolist()
    logits, cache = decoder.prefill(prompt)
    torch.testing.assert_close(logits[0], full[p - 1], atol=1e-5, rtol=0)
    for i, token in enumerate(generated[:-1]):
        logits = decoder.decode_step(torch.tensor([token]), cache)
        torch.testing.assert_close(logits[0], full[p + i], atol=1e-5, rtol=0)
    assert cache.length == p + len(generated) - 1


def test_chunked_prefill_matches_one_prefill(decoder: DecoderWorkload) -> None:
    # Feeding the prompt in chunks exercises the shifted causal mask (queries after cached keys).
    prompt = decoder.requests(1, seed=4)[0].prompt_ids
    ids = prompt[None]
    split = ids.shape[1] // 2
    model = decoder.model
    with torch.inference_mode():
        full = model(ids)
        cache = model.new_cache(1, ids.shape[1])
        first = model(ids[:, :split], cache)
        second = model(ids[:, split:], cache)
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, atol=1e-5, rtol=0)


def test_requests_are_many_varied_and_deterministic(decoder: DecoderWorkload) -> None:
    reqs = decoder.requests()
    cfg = decoder.config
    assert len(reqs) == cfg.n_requests >= 64
    lengths = [r.prompt_tokens for r in reqs]
    assert len(set(lengths)) >= 20
    assert min(lengths) >= 2 and max(lengths) <= cfg.max_prompt_tokens
    assert [r.request_id for r in reqs] == list(range(len(reqs)))
    again = decoder.requests()
    assert all(torch.equal(a.prompt_ids, b.prompt_ids) for a, b in zip(reqs, again, strict=True))
    assert not torch.equal(decoder.requests(1, seed=9)[0].prompt_ids, reqs[0].prompt_ids)


def test_generation_is_greedy_and_deterministic(decoder: DecoderWorkload) -> None:
    prompt = decoder.requests(1)[0].prompt_ids
    a = decoder.generate(prompt, 6)
    b = DecoderWorkload(config_for("decoder", "tiny")).generate(prompt, 6)
    assert a.token_ids == b.token_ids
    assert a.new_tokens == 6 and a.prompt_tokens == prompt.shape[0]
    assert len(a.token_latencies_ms) == 5
    assert a.ttft_ms > 0 and a.e2e_ms >= a.ttft_ms + sum(a.token_latencies_ms) - 1e-6


def test_timing_reads_the_clock_after_each_sync() -> None:
    events: list[str] = []
    ticks = itertools.count()

    def clock() -> float:
        events.append("clock")
        return float(next(ticks))  # one second per reading

    w = DecoderWorkload(
        config_for("decoder", "tiny"), sync=lambda: events.append("sync"), clock=clock
    )
    timing = w.generate(w.requests(1)[0].prompt_ids, 4)
    assert timing == GenerationTiming(
        prompt_tokens=timing.prompt_tokens,
        ttft_ms=1000.0,
        token_latencies_ms=(1000.0, 1000.0, 1000.0),
        e2e_ms=4000.0,
        token_ids=timing.token_ids,
    )
    assert timing.tokens_per_s == pytest.approx(1.0)
    assert events == ["sync", "clock"] * 5


def test_serve_times_every_request(decoder: DecoderWorkload) -> None:
    reqs = decoder.requests(3)
    timings = decoder.serve(reqs)
    assert [t.prompt_tokens for t in timings] == [r.prompt_tokens for r in reqs]
    assert all(t.new_tokens == decoder.config.max_new_tokens for t in timings)


def test_cache_limits_are_enforced(decoder: DecoderWorkload) -> None:
    logits, cache = decoder.prefill(torch.tensor([5, 6, 7]), capacity=4)
    decoder.decode_step(logits.argmax(-1), cache)
    with pytest.raises(ValueError, match=r"KV cache is full \(4 tokens\)"):
        decoder.decode_step(logits.argmax(-1), cache)
    with pytest.raises(ValueError, match="exceeds capacity"):
        decoder.prefill(torch.arange(2, 12), capacity=5)


def test_module_names_and_tied_head(decoder: DecoderWorkload) -> None:
    names = dict(decoder.model.named_modules())
    for name in (
        "embed.tok",
        "embed.pos",
        "blocks.1.attn.qkv",
        "blocks.1.ffn.fc2",
        "final_norm",
        "lm_head",
    ):
        assert name in names, name
    assert decoder.model.lm_head.weight is decoder.model.embed.tok.weight
