"""Triton LayerNorm kernels with fp32 statistics (forward and backward), registered as the custom operators ``torchlevers::ln_fwd``/``ln_bwd``.

Import this module only when a Triton kernel is wanted: ``triton.jit`` decides at
decoration time whether kernels run compiled (GPU) or under the interpreter, so on a
CPU ``TRITON_INTERPRET=1`` must be set before the first import.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["INTERPRET", "MAX_FEATURES", "layer_norm", "ln_bwd", "ln_fwd", "problem"]

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
"""Kernels were decorated for the Triton interpreter (CPU tensors allowed)."""

MAX_FEATURES = 16384
"""Largest normalised size the one-block-per-row kernels take (elements); larger rows use PyTorch."""


@triton.jit
def _ln_fwd(
    X, Y, W, B, Mean, Rstd,
    stride_x, stride_y, N, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # One program per row; the whole row sits in one block, statistics in fp32. Offsets in int64:
    # rows x N reaches 2**31 elements on a large GPU (a 4 GiB fp16 activation).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def _ln_bwd(
    X, DY, DX, W, Mean, Rstd, DW_part, DB_part,
    stride_x, stride_dy, stride_dx, M, N, rows_per_prog,
    HAS_W: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Each program owns a contiguous run of rows: it writes their dx and one fp32 partial
    # sum of dw/db; the partials are reduced afterwards (no atomics, deterministic).
    pid = tl.program_id(0).to(tl.int64)  # int64 offsets, as in the forward
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        w = tl.where(cmask, 1.0, 0.0)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    # The last program's run ends at M through the loop bound, not a row mask, so every mask
    # is a block-shaped comparison: the interpreter broadcasts a scalar `row < M` into the
    # block as int32 data, which Triton 3.7 loads through and 3.9 refuses ("mask has
    # unsupported dtype"). Compiled, the bound also skips the masked-off iterations.
    first = pid * rows_per_prog
    end = tl.minimum(first + rows_per_prog, M)
    for row in range(first, end):
        x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + row)
        rstd = tl.load(Rstd + row)
        xhat = tl.where(cmask, (x - mean) * rstd, 0.0)
        g = dy * w
        c1 = tl.sum(xhat * g, axis=0) / N
        c2 = tl.sum(g, axis=0) / N
        dx = (g - (xhat * c1 + c2)) * rstd
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=cmask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(DW_part + pid * N + cols, dw_acc, mask=cmask)
    tl.store(DB_part + pid * N + cols, db_acc, mask=cmask)


def _num_programs(x: torch.Tensor, m: int) -> int:
    if x.is_cuda:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        return max(1, min(m, 4 * sms))
    # The interpreter runs programs one after another: few programs, longer loops.
    return max(1, min(m, 8))


def _num_warps(block_n: int) -> int:
    """Warps per program for a row of ``block_n`` elements: one per 256 elements, 1 to 8.

    Triton's default of 4 for every width leaves each thread 128 fp32 values per row tensor
    at 16384 features (the backward keeps five such tensors): registers spill. The rule is
    Triton's own LayerNorm tutorial's.
    """
    return min(max(block_n // 256, 1), 8)


def _interpretable(t: torch.Tensor) -> torch.Tensor:
    # The interpreter computes with numpy, which has no bfloat16: its bf16 loads/stores
    # do not round like the GPU does. Run bf16 through fp32 there; torch rounds on the way back.
    return t.float() if INTERPRET and t.dtype == torch.bfloat16 else t


# Registered as custom operators so that torch.compile treats each as one opaque op: dynamo
# never traces into the launch (where a dynamic row width made ``num_warps`` symbolic, which
# dynamo cannot launch with), and the launch runs on real tensors whose shapes are Python
# ints. Autograd through ``register_autograd`` rather than an autograd.Function around the
# ops: torch's custom-op guide warns that the latter composition has been silently wrong
# under torch.compile, and opcheck tests the registration.
@torch.library.custom_op(
    "torchlevers::ln_fwd", mutates_args=(),
    schema="(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
)
def ln_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dim of a 2-D (rows, N) tensor: (y in x's dtype, fp32 mean, fp32 rstd)."""
    xk = _interpretable(x.contiguous())
    m, n = xk.shape
    y = torch.empty_like(xk)
    mean = torch.empty(m, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n)
    # Placeholders for absent affine parameters: never read (HAS_W/HAS_B are False).
    w = _interpretable(weight.contiguous()) if weight is not None else xk
    b = _interpretable(bias.contiguous()) if bias is not None else xk
    _ln_fwd[(m,)](
        xk, y, w, b, mean, rstd, xk.stride(0), y.stride(0), n, eps,
        HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_N=block, num_warps=_num_warps(block),
    )
    return y.to(x.dtype), mean, rstd


@ln_fwd.register_fake
def _ln_fwd_fake(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = x.shape
    return x.new_empty((m, n)), x.new_empty((m,), dtype=torch.float32), x.new_empty((m,), dtype=torch.float32)


@torch.library.custom_op(
    "torchlevers::ln_bwd", mutates_args=(),
    schema="(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd) -> (Tensor, Tensor, Tensor)",
)
def ln_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`ln_fwd`'s y: (dx in x's dtype, fp32 dw, fp32 db), dw/db summed over rows."""
    xk = _interpretable(x.contiguous())
    dyk = _interpretable(dy.contiguous())
    m, n = xk.shape
    dx = torch.empty_like(xk)
    progs = _num_programs(xk, m)
    rows_per_prog = -(-m // progs)
    dw_part = torch.empty((progs, n), dtype=torch.float32, device=x.device)
    db_part = torch.empty((progs, n), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n)
    _ln_bwd[(progs,)](
        xk, dyk, dx, _interpretable(weight.contiguous()) if weight is not None else xk, mean, rstd, dw_part, db_part,
        xk.stride(0), dyk.stride(0), dx.stride(0), m, n, rows_per_prog,
        HAS_W=weight is not None, BLOCK_N=block, num_warps=_num_warps(block),
    )
    return dx.to(x.dtype), dw_part.sum(0), db_part.sum(0)


@ln_bwd.register_fake
def _ln_bwd_fake(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = x.shape
    return x.new_empty((m, n)), mean.new_empty((n,)), mean.new_empty((n,))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, weight, bias, _ = inputs
    _, mean, rstd = output
    # x in its own (small) dtype: the backward recomputes x_hat, as native LayerNorm does.
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx: Any, dy: torch.Tensor, _dmean: Any, _drstd: Any) -> tuple[Any, ...]:
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = torch.ops.torchlevers.ln_bwd(dy, x, weight, mean, rstd)
    dw = dw.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
    db = db.to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] else None
    return dx, dw, db, None


ln_fwd.register_autograd(_backward, setup_context=_setup_context)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim of a 2-D (rows, N) tensor through ``torchlevers::ln_fwd``; output in x's dtype."""
    return torch.ops.torchlevers.ln_fwd(x, weight, bias, eps)[0]


def problem(device: torch.device, dtype: torch.dtype, n: int) -> str | None:
    """Why these kernels cannot take ``dtype`` tensors on ``device`` normalised over ``n`` elements, or None.

    On a CUDA device this compiles and runs both kernels once on a small tensor, so a device
    or dtype this Triton cannot compile for is found here, not inside a user's model.
    """
    if n > MAX_FEATURES:
        return f"{n} features; the kernels take at most {MAX_FEATURES}"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {dtype}; the kernels take float16, bfloat16 and float32"
    if device.type == "cpu":
        return None if INTERPRET else (
            "a CPU tensor needs the Triton interpreter: set TRITON_INTERPRET=1 before "
            "torchlevers._triton_layernorm is first imported"
        )
    if device.type != "cuda":
        return f"device {device}; the kernels run on CUDA devices (and on CPU under TRITON_INTERPRET=1)"
    # Real tensors even when asked under a fake or meta mode (non-strict export, a dry run).
    with _disable_current_modes():
        try:
            x = torch.ones((2, 16), device=device, dtype=dtype)
            _, mean, rstd = ln_fwd(x, None, None, 1e-5)
            ln_bwd(x, x, None, mean, rstd)
        except Exception as exc:  # any failure to compile or launch is the reason
            return f"triton {triton.__version__} cannot run them on {device} ({dtype}): {type(exc).__name__}: {exc}"
    return None
