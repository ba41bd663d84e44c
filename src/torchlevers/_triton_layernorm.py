"""Triton LayerNorm kernels with fp32 statistics (forward and backward), wrapped in an autograd Function.

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

__all__ = ["INTERPRET", "MAX_FEATURES", "TritonLayerNormFn", "supports"]

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
    # One program per row; the whole row sits in one block, statistics in fp32.
    row = tl.program_id(0)
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
    pid = tl.program_id(0)
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


def supports(x: torch.Tensor, n: int) -> bool:
    """Whether these kernels can take ``x`` normalised over its last ``n`` elements."""
    if n > MAX_FEATURES or x.numel() == 0:
        return False
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    return x.is_cuda or (INTERPRET and x.device.type == "cpu")


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


class TritonLayerNormFn(torch.autograd.Function):
    """LayerNorm over the last dim of a 2-D (rows, N) tensor; output in the input dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        out_dtype = x.dtype
        x = _interpretable(x.contiguous())
        m, n = x.shape
        y = torch.empty_like(x)
        mean = torch.empty(m, dtype=torch.float32, device=x.device)
        rstd = torch.empty(m, dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(n)
        # Placeholders for absent affine parameters: never read (HAS_W/HAS_B are False).
        w = weight if weight is not None else x
        b = bias if bias is not None else x
        _ln_fwd[(m,)](
            x, y, w, b, mean, rstd, x.stride(0), y.stride(0), n, eps,
            HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_N=block, num_warps=_num_warps(block),
        )
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.out_dtype = out_dtype
        return y.to(out_dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        dy = _interpretable(dy.contiguous())
        m, n = x.shape
        dx = torch.empty_like(x)
        progs = _num_programs(x, m)
        rows_per_prog = -(-m // progs)
        dw_part = torch.empty((progs, n), dtype=torch.float32, device=x.device)
        db_part = torch.empty((progs, n), dtype=torch.float32, device=x.device)
        _ln_bwd[(progs,)](
            x, dy, dx, weight if weight is not None else x, mean, rstd, dw_part, db_part,
            x.stride(0), dy.stride(0), dx.stride(0), m, n, rows_per_prog,
            HAS_W=weight is not None, BLOCK_N=triton.next_power_of_2(n),
            num_warps=_num_warps(triton.next_power_of_2(n)),
        )
        dw = dw_part.sum(0).to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        db = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            db = db_part.sum(0).to(ctx.bias_dtype)
        return dx.to(ctx.out_dtype), dw, db, None
