"""The encoder training step: shapes, determinism, learning, padding mask, planted regression, injection points."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from torchlevers.workloads import (
    PAD_ID,
    EncoderConfig,
    EncoderWorkload,
    SupportsMixedPrecision,
    TokenBatch,
    config_for,
)


def tiny(**overrides: Any) -> EncoderWorkload:
    return EncoderWorkload(config_for("encoder", "tiny", **overrides))


def test_batch_and_logits_shapes() -> None:
    w = tiny()
    batch = w.make_batch()
    cfg = w.config
    assert batch.input_ids.shape == (cfg.batch_size, cfg.seq_len)
    assert batch.num_samples == w.samples_per_step
    assert batch.num_tokens == w.tokens_per_step == batch.num_positions
    logits = w.model(batch.input_ids, batch.attention_mask)
    assert logits.shape == (cfg.batch_size, cfg.n_classes)
    loss = w.step(batch)
    assert loss.shape == () and not loss.requires_grad and torch.isfinite(loss)


def test_make_batch_with_lengths_pads_to_the_longest_or_to_seq_len() -> None:
    w = tiny()
    b = w.make_batch([5, 9, 2])
    assert b.seq_len == 9 and b.num_tokens == 16
    assert b.attention_mask.sum(dim=1).tolist() == [5, 9, 2]
    assert w.make_batch([5, 9, 2], seq_len=16).seq_len == 16
    with pytest.raises(ValueError, match=r"exceeds EncoderConfig\.max_seq_len"):
        w.make_batch([600])
    with pytest.raises(ValueError, match="lengths or batch_size, not both"):
        w.make_batch([3], batch_size=2)


def _losses(w: EncoderWorkload, batch: TokenBatch, steps: int) -> list[float]:
    return [float(w.step(batch)) for _ in range(steps)]


def test_same_seed_same_weights_batches_and_losses() -> None:
    a, b = tiny(seed=1), tiny(seed=1)
    assert torch.equal(a.make_batch().input_ids, b.make_batch().input_ids)
    assert _losses(a, a.make_batch(), 3) == _losses(b, b.make_batch(), 3)
    other = tiny(seed=2)
    assert not torch.equal(
        other.model.state_dict()["blocks.0.ffn.fc1.weight"],
        a.model.state_dict()["blocks.0.ffn.fc1.weight"],
    )


def test_building_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny()
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_loss_decreases(norm_position: str) -> None:
    w = tiny(norm_position=norm_position)
    batch = w.make_batch([20, 64, 33, 7, 50, 12, 64, 3])
    losses = _losses(w, batch, 8)
    # Post-LN learns more slowly from N(0, 0.02) weights; both clearly learn.
    assert losses[-1] < 0.85 * losses[0], losses


def test_module_names_are_stable() -> None:
    names = dict(tiny(extra_ffn_matmul=True).model.named_modules())
    for name in (
        "embed.tok",
        "embed.pos",
        "blocks.0.norm1",
        "blocks.0.attn.qkv",
        "blocks.0.attn.out",
        "blocks.1.norm2",
        "blocks.1.ffn.fc1",
        "blocks.1.ffn.fc2",
        "blocks.1.ffn.extra",
        "final_norm",
        "pooler",
        "head",
    ):
        assert name in names, name
    assert "embed.norm" in dict(tiny(norm_position="post").model.named_modules())


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_padding_does_not_change_real_tokens(norm_position: str) -> None:
    w = tiny(norm_position=norm_position)
    model = w.model.eval()
    lengths = [7, 19, 1, 12]
    tight = w.make_batch(lengths)
    wide = w.make_batch(lengths, seq_len=40)
    # Garbage (not PAD) in the padding: it must still be ignored.
    noisy_ids = wide.input_ids.clone()
    pad = ~wide.attention_mask
    noisy_ids[pad] = torch.randint(2, w.config.vocab_size, (int(pad.sum()),))
    assert bool((noisy_ids[pad] != PAD_ID).all())
    with torch.no_grad():
        h_tight = model.encode(tight.input_ids, tight.attention_mask)
        h_wide = model.encode(noisy_ids, wide.attention_mask)
        logits_wide = model(noisy_ids, wide.attention_mask)
        for i, n in enumerate(lengths):
            alone = model.encode(tight.input_ids[i : i + 1, :n])  # no padding, no mask
            torch.testing.assert_close(h_tight[i, :n], alone[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(h_wide[i, :n], alone[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            logits_wide, model(tight.input_ids, tight.attention_mask), atol=1e-5, rtol=1e-5
        )


def _op_counts(w: EncoderWorkload, batch: TokenBatch) -> dict[str, int]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        w.step(batch)
    return {e.key: e.count for e in prof.key_averages()}


def test_planted_matmul_adds_mm_calls_and_flops_but_not_numerics() -> None:
    base, planted = tiny(), tiny(extra_ffn_matmul=True)
    batch = base.make_batch()
    n_layers, d, d_ff = base.config.n_layers, base.config.d_model, base.config.d_ff
    before, after = _op_counts(base, batch), _op_counts(planted, batch)
    # One aten::mm in forward and one in backward (input gradient) per FFN.
    assert after["aten::mm"] - before["aten::mm"] == 2 * n_layers
    assert after["aten::addmm"] == before["aten::addmm"]

    flops = []
    for w in (base, planted):
        with FlopCounterMode(display=False) as counter:
            w.step(batch)
        flops.append(counter.get_total_flops())
    tokens = batch.num_positions
    assert flops[1] - flops[0] == n_layers * 2 * (2 * tokens * d_ff * d)

    # Multiplying by a zero matrix and adding is exact: the same losses, bit for bit.
    a, b = tiny(), tiny(extra_ffn_matmul=True)
    assert _losses(a, batch, 3) == _losses(b, batch, 3)


def test_phases_run_in_named_profiler_ranges() -> None:
    w = tiny()
    counts = _op_counts(w, w.make_batch())
    for phase in ("perfbudget::forward", "perfbudget::backward", "perfbudget::optimizer"):
        assert counts.get(phase) == 1, phase


def test_split_phases_equal_one_step() -> None:
    a, b = tiny(), tiny()
    batch = a.make_batch()
    for _ in range(2):
        whole = a.step(batch)
        loss = b.forward_loss(batch)
        b.backward(loss)
        b.optimizer_step()
        assert torch.equal(whole, loss.detach())
    assert all(p.grad is None for p in b.model.parameters())


def test_step_accepts_a_collate_dict() -> None:
    w = tiny()
    batch = w.make_batch([4, 6])
    as_dict = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "labels": batch.labels,
    }
    assert torch.equal(tiny().step(batch), w.step(as_dict))


class RecordingNorm(nn.LayerNorm):
    built: ClassVar[list[float]] = []

    def __init__(self, normalized_shape: int, *, eps: float) -> None:
        super().__init__(normalized_shape, eps=eps)
        RecordingNorm.built.append(eps)


def test_norm_factory_builds_every_norm() -> None:
    RecordingNorm.built = []
    w = EncoderWorkload(EncoderConfig(norm_eps=1e-6), norm_factory=RecordingNorm)
    norms = [m for m in w.model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * w.config.n_layers + 1
    assert all(isinstance(m, RecordingNorm) for m in norms)
    assert RecordingNorm.built == [1e-6] * len(norms)


class FakePolicy:
    """Records how the workload drives a precision policy."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        self.log.append("autocast enter")
        yield
        self.log.append("autocast exit")

    def backward_and_step(
        self,
        loss: Tensor,
        optimizer: torch.optim.Optimizer,
        *,
        before_step: Callable[[], object] | None = None,
    ) -> str:
        self.log.append(f"backward_and_step loss dtype {loss.dtype}")
        loss.backward()
        assert before_step is not None
        before_step()
        optimizer.step()
        return "step report"


def test_precision_policy_and_clipper_are_called_in_order() -> None:
    log: list[str] = []

    def clip(named_params: Iterator[tuple[str, nn.Parameter]]) -> str:
        params = dict(named_params)
        assert "blocks.0.ffn.fc1.weight" in params
        assert all(p.grad is not None for p in params.values())
        log.append("clip")
        return "clip report"

    policy = FakePolicy(log)
    assert isinstance(policy, SupportsMixedPrecision)
    w = EncoderWorkload(EncoderConfig(), precision=policy, clip=clip)
    w.step(w.make_batch())
    assert log == [
        "autocast enter",
        "autocast exit",
        "backward_and_step loss dtype torch.float32",
        "clip",
    ]
    assert (w.last_step_report, w.last_clip_report) == ("step report", "clip report")
    assert all(p.grad is None for p in w.model.parameters())  # zero_grad ran
    with pytest.raises(RuntimeError, match="unavailable with a precision policy"):
        w.backward(w.forward_loss(w.make_batch()))


def test_precision_factory_is_applied_to_the_model_before_the_optimizer() -> None:
    seen: list[nn.Module] = []

    def apply(model: nn.Module) -> FakePolicy:
        seen.append(model)
        return FakePolicy([])

    w = EncoderWorkload(EncoderConfig(), precision=apply)
    assert seen == [w.model] and isinstance(w.precision, FakePolicy)
    with pytest.raises(TypeError, match="lacks the methods of SupportsMixedPrecision"):
        EncoderWorkload(EncoderConfig(), precision=lambda m: object())  # type: ignore[arg-type]


def test_clipper_without_policy_runs_between_backward_and_step() -> None:
    def clip(named_params: Iterator[tuple[str, nn.Parameter]]) -> float:
        return float(torch.nn.utils.clip_grad_norm_([p for _, p in named_params], 1e-3))

    w = EncoderWorkload(EncoderConfig(), clip=clip)
    w.step(w.make_batch())
    assert isinstance(w.last_clip_report, float) and w.last_clip_report > 0
