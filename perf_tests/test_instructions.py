"""Instructions per step: a deterministic channel that does not drift with the machine's speed.

Counted by callgrind when the session runs under it (``perfbudget instructions -- perf_tests -m
instructions``), or by the CPU's instructions counter where one opens; elsewhere each test is
skipped as unmeasurable, with how to run it. Budgets are filed per machine identity: the count
depends on the kernels' ISA path. The tiny MLP's count comes from its timing test in
``test_tiny.py``, marked ``instructions``: a session under callgrind counts that step instead of
timing it.
"""

from __future__ import annotations

import pytest

from fixtures.workloads import TrainStep
from torchlevers.workloads import DecoderWorkload

pytestmark = [
    pytest.mark.instructions,
    # Only the CPU variant of the device fixture: instruction counts are a host-side channel.
    pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.cpu, id="cpu")], indirect=True),
]


@pytest.mark.budget("encoder-train")
def test_encoder_step_instructions(perf, encoder_train: TrainStep, device: str) -> None:
    # One counted step after one uncounted one (the fixture warmed it already): a count repeats
    # exactly, and every encoder step under valgrind costs a minute or more on a small runner.
    perf.instructions(encoder_train.step, steps=1, warmup=1)


@pytest.mark.budget("decoder-serve")
def test_decode_step_instructions(perf, decoder_serve: DecoderWorkload, device: str) -> None:
    w = decoder_serve
    prompt = w.requests()[0].prompt_ids
    logits, cache = w.prefill(prompt)
    token, position = logits.argmax(-1), cache.length

    def decode_one() -> None:
        cache.length = position  # every call decodes the same position: one step's work, repeated
        w.decode_step(token, cache)

    perf.instructions(decode_one, steps=2)
