"""Tests of measure.numerics: gradient norms, planted non-finite gradients, scaler skips, loss drift."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from perfbudget.measure.numerics import (
    check_grads,
    compare_to_reference,
    count_scaler_skips,
    grad_norms,
    loss_drift,
    record_losses,
)


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)
    )


def weight_of(model: nn.Sequential, i: int) -> torch.Tensor:
    layer = model[i]
    assert isinstance(layer, nn.Linear)
    return layer.weight


def planted_step(model: nn.Sequential, bad_step: int, value: float) -> Callable[[], torch.Tensor]:
    """A training step whose ``bad_step``-th call puts ``value`` into layer 2's weight gradient."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    calls = [0]

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - y).square().mean()
        if calls[0] == bad_step:
            # d/dW of sum(W * value) is `value` everywhere: only this parameter goes bad.
            loss = loss + (weight_of(model, 2) * value).sum()
        calls[0] += 1
        loss.backward()
        opt.step()
        return loss

    return step


def test_planted_inf_gradient_is_named_by_layer_and_step() -> None:
    model = make_model()
    report = check_grads(planted_step(model, bad_step=2, value=math.inf), model, steps=5)
    first = report.first
    assert first is not None
    assert (first.step, first.parameter, first.layer, first.kind) == (2, "2.weight", "2", "inf")
    # Stopped at the first bad step; the steps before were healthy.
    assert report.steps == 3 and report.nonfinite_grads == 1
    assert all(math.isfinite(n) for step in report.norms[:2] for n in step.values())
    assert set(report.norms[0]) == {"0", "2", "4"}
    assert "step 2 in 2.weight" in report.lines()[0]


def test_planted_nan_and_continue_after_first() -> None:
    model = make_model()
    report = check_grads(
        planted_step(model, bad_step=0, value=math.nan), model, steps=2, stop_at_first=False
    )
    assert report.steps == 2
    # The NaN step also poisons the weights through SGD, so step 1 is bad everywhere.
    assert (
        report.first is not None
        and report.first.kind == "nan"
        and report.first.parameter == "2.weight"
    )
    assert {g.step for g in report.nonfinite} == {0, 1}


def test_healthy_run_reports_nothing_and_hooks_are_removed() -> None:
    model = make_model()
    report = check_grads(
        planted_step(model, bad_step=-1, value=0.0), model, steps=2, by="parameter"
    )
    assert report.first is None and report.nonfinite_grads == 0
    assert set(report.norms[0]) == {f"{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")}
    assert report.lines() == ["all gradients finite over 2 step(s)"]
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def test_grad_norms_literal() -> None:
    layer = nn.Linear(2, 2)
    layer.weight.grad = torch.full((2, 2), 3.0)
    layer.bias.grad = torch.tensor([0.0, 4.0])
    assert grad_norms(layer, by="parameter") == {
        "weight": pytest.approx(6.0),
        "bias": pytest.approx(4.0),
    }
    assert grad_norms(layer) == {"": pytest.approx(math.sqrt(52.0))}
    with pytest.raises(ValueError, match="by must be"):
        grad_norms(layer, by="module")  # type: ignore[arg-type]


def test_grad_scaler_skipped_steps_are_counted() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    calls = [0]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - y).square().mean()
        if calls[0] == 1:
            loss = loss + (weight_of(model, 0) * math.inf).sum()  # planted overflow
        calls[0] += 1
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    report = count_scaler_skips(step, scaler, steps=4)
    assert report.skipped_steps == 1 and report.skipped_at == (1,)
    assert report.scales[0] == 2.0**10 and report.scales[1] == 2.0**9


def test_disabled_scaler_never_skips() -> None:
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    report = count_scaler_skips(lambda: None, scaler, steps=2)
    assert report.skipped_steps == 0


def test_loss_drift_literal() -> None:
    d = loss_drift([1.0, 1.02, 0.5], [1.0, 1.0, 0.4], rtol=0.05)
    assert d.max_abs == pytest.approx(0.1)
    assert d.max_rel == pytest.approx(0.25)
    assert d.final_rel == pytest.approx(0.25)
    assert d.first_step_over == 2 and not d.ok
    assert loss_drift([1.0], [1.0]).ok
    nan = loss_drift([1.0, math.nan], [1.0, 1.0])
    assert nan.first_step_over == 1 and math.isinf(nan.max_rel)
    with pytest.raises(ValueError, match="same length"):
        loss_drift([1.0], [1.0, 2.0])


def train_loop(model: nn.Module, *, autocast: bool) -> Callable[[], torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        loss = (out.float() - y).square().mean()
        loss.backward()
        opt.step()
        return loss

    return step


def test_bf16_run_drifts_a_little_from_fp32_reference() -> None:
    base = make_model()
    same = compare_to_reference(
        train_loop(copy.deepcopy(base), autocast=False),
        train_loop(copy.deepcopy(base), autocast=False),
        steps=5,
    )
    assert same.max_abs == 0.0 and same.ok
    bf16 = compare_to_reference(
        train_loop(copy.deepcopy(base), autocast=True),
        train_loop(copy.deepcopy(base), autocast=False),
        steps=5,
        rtol=0.05,
    )
    assert 0.0 < bf16.max_rel < 0.05


def test_record_losses_accepts_numbers_and_tensors() -> None:
    values = iter([torch.tensor(2.0), 3])
    assert record_losses(lambda: next(values), steps=2) == (2.0, 3.0)
