"""fp32-statistics LayerNorm (PyTorch path): exactness vs F.layer_norm, fp16 large activations, drop-in module."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchlevers.layernorm import (
    FP32StatsLayerNorm,
    fp32_stats_layer_norm,
    select_backend,
    swap_layernorms,
)
from torchlevers.precision import PrecisionPolicy

LnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def _ours(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return fp32_stats_layer_norm(x, x.shape[-1:], w, b, eps, backend="torch")


def _naive_half(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """Statistics computed in the input's own dtype, op by op (what a hand-written fp16 LN does).
    CPU F.layer_norm upcasts internally, so the naive version has to be spelled out."""
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(-1, keepdim=True)  # squares above 256 overflow fp16
    return xc / torch.sqrt(var + eps) * w.to(x.dtype) + b.to(x.dtype)


def _seed_bf16_stats(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """Statistics in bf16, "to protect fp16": bf16 has fp32's range but only 8 significant bits."""
    xb = x.to(torch.bfloat16)
    mean = xb.mean(-1, keepdim=True)
    var = ((xb - mean) ** 2).mean(-1, keepdim=True)
    return ((xb - mean) / torch.sqrt(var + eps)).to(x.dtype) * w.to(x.dtype) + b.to(x.dtype)


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(x.double(), x.shape[-1:], w.double(), b.double(), eps)


# --------------------------------------------------------------------------- fp32 exactness


@pytest.mark.parametrize(
    ("shape", "normalized"),
    [((8, 64), (64,)), ((3, 5, 96), (96,)), ((4, 6, 8), (6, 8)), ((2, 3), (3,))],
)
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
def test_matches_f_layer_norm_in_fp32(shape: tuple[int, ...], normalized: tuple[int, ...], affine: str) -> None:
    """Target: forward and backward match F.layer_norm in fp32 to 1e-5."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3 + 1).requires_grad_()
    w = torch.randn(normalized, generator=g).requires_grad_() if affine != "none" else None
    b = torch.randn(normalized, generator=g).requires_grad_() if affine == "weight+bias" else None
    y = fp32_stats_layer_norm(x, normalized, w, b, backend="torch")
    ref = F.layer_norm(x, normalized, w, b)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn(shape, generator=g)
    inputs = [t for t in (x, w, b) if t is not None]
    got = torch.autograd.grad(y, inputs, dy)
    want = torch.autograd.grad(ref, inputs, dy)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_gradcheck_in_fp64() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c, d: fp32_stats_layer_norm(a, 7, c, d, backend="torch"), (x, w, b))


# --------------------------------------------------------------------------- fp16 large activations


def _large_fp16(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Residual-stream-like rows: offset ~2000, spread ~300 -> squares ~1e5 > fp16 max (65504).
    g = torch.Generator().manual_seed(seed)
    x = (2000 + 300 * torch.randn(16, 512, generator=g)).half()
    w = 1 + 0.1 * torch.randn(512, generator=g)
    b = 0.1 * torch.randn(512, generator=g)
    return x, w, b


def test_naive_fp16_statistics_overflow() -> None:
    x, _, _ = _large_fp16()
    xc = x - x.mean(-1, keepdim=True)
    assert torch.isinf(xc * xc).any()
    assert torch.isinf((xc * xc).mean(-1)).all()


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param(_ours, id="fp32-stats"),
        pytest.param(
            _naive_half,
            id="negative-control-fp16-stats",
            marks=pytest.mark.xfail(strict=True, reason="variance overflows to inf: output collapses to bias"),
        ),
        pytest.param(
            _seed_bf16_stats,
            id="negative-control-bf16-stats",
            marks=pytest.mark.xfail(strict=True, reason="bf16 mean is off by up to 4 at 2000"),
        ),
    ],
)
def test_large_fp16_activations_stay_finite_and_accurate(impl: LnFn) -> None:
    """Target: finite, fp16 output within 2 fp16 rounding steps of the exact result."""
    x, w, b = _large_fp16()
    y = impl(x, w, b, 1e-5)
    assert y.dtype == torch.float16
    assert torch.isfinite(y).all()
    ref = _ref(x, w, b)
    # fp16 spacing at |y| <= 4 is <= 2**-8; allow two steps plus a hair.
    assert (y.double() - ref).abs().max() <= 2 * 2**-8 + 1e-4


def test_large_fp16_backward_is_finite_and_accurate() -> None:
    x, w, b = _large_fp16(1)
    x.requires_grad_()
    wp, bp = w.clone().requires_grad_(), b.clone().requires_grad_()
    y = fp32_stats_layer_norm(x, 512, wp, bp, backend="torch")
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).half()
    dx, dw, db = torch.autograd.grad(y, (x, wp, bp), dy)
    assert dx.dtype == torch.float16 and dw.dtype == torch.float32
    assert all(torch.isfinite(t).all() for t in (dx, dw, db))
    xr = x.detach().double().requires_grad_()
    wr, br = w.double().requires_grad_(), b.double().requires_grad_()
    rx, rw, rb = torch.autograd.grad(F.layer_norm(xr, (512,), wr, br, 1e-5), (xr, wr, br), dy.double())
    # dx ~ 1/300: fp16 keeps ~3 significant digits of it.
    torch.testing.assert_close(dx.double(), rx, atol=1e-5, rtol=2e-3)
    torch.testing.assert_close(dw.double(), rw, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(db.double(), rb, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_output_keeps_the_input_dtype_under_autocast(dtype: torch.dtype) -> None:
    ln = FP32StatsLayerNorm(32)
    x = torch.randn(4, 32).to(dtype)
    with torch.autocast("cpu", dtype=dtype):
        y = ln(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), F.layer_norm(x.float(), (32,), ln.weight, ln.bias), atol=2e-2, rtol=1e-2)


# --------------------------------------------------------------------------- module


def test_module_is_a_drop_in_layernorm() -> None:
    ref = nn.LayerNorm(16, eps=1e-6)
    ours = FP32StatsLayerNorm(16, eps=1e-6)
    assert isinstance(ours, nn.LayerNorm)
    ours.load_state_dict(ref.state_dict())
    assert ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 16)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
    assert "backend='auto'" in repr(ours)
    with pytest.raises(ValueError, match="'cuda'"):
        FP32StatsLayerNorm(16, backend="cuda")  # type: ignore[arg-type]


def test_swap_layernorms_shares_parameters_and_keeps_outputs() -> None:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    before = copy.deepcopy(model)
    params_before = {n: id(p) for n, p in model.named_parameters()}
    replaced = swap_layernorms(model)
    assert replaced == ["norm1", "norm2"]
    assert isinstance(model.norm1, FP32StatsLayerNorm)
    assert {n: id(p) for n, p in model.named_parameters()} == params_before
    x = torch.randn(2, 5, 32)
    model.train()
    before.train()  # training mode: no fused inference fast path
    torch.testing.assert_close(model(x), before(x), atol=1e-5, rtol=1e-5)
    assert swap_layernorms(model) == []  # idempotent
    with pytest.raises(ValueError, match="from_layernorm"):
        swap_layernorms(nn.LayerNorm(4))


def test_swap_layernorms_refuses_a_layernorm_whose_hooks_or_wrapper_it_would_drop() -> None:
    hooked = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    hooked[1].register_forward_hook(lambda *_: None)
    with pytest.raises(ValueError, match="'1' carries _forward_hooks"):
        swap_layernorms(hooked)
    assert type(hooked[1]) is nn.LayerNorm  # nothing swapped
    wrapped = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    PrecisionPolicy(dtype="bf16", fp32_modules=("1",)).apply(wrapped)
    with pytest.raises(ValueError, match="a wrapped forward"):
        swap_layernorms(wrapped)


def test_auto_backend_is_pytorch_without_cuda() -> None:
    x = torch.randn(2, 8)
    assert select_backend(x, 8, "auto") == "torch"
    assert select_backend(x, 8, "torch") == "torch"
    with pytest.raises(ValueError, match="'cuda'"):
        select_backend(x, 8, "cuda")  # type: ignore[arg-type]


def test_shape_and_dtype_errors() -> None:
    with pytest.raises(ValueError, match="does not end with"):
        fp32_stats_layer_norm(torch.randn(2, 8), (4,))
    with pytest.raises(ValueError, match="floating-point"):
        fp32_stats_layer_norm(torch.ones(2, 8, dtype=torch.long), 8)
    with pytest.raises(ValueError, match=r"weight of shape \(8, 6\) does not match normalized_shape \(6, 8\)"):
        fp32_stats_layer_norm(torch.randn(2, 6, 8), (6, 8), torch.ones(8, 6))
    with pytest.raises(ValueError, match="bias of shape"):
        fp32_stats_layer_norm(torch.randn(2, 8), 8, None, torch.ones(4))
