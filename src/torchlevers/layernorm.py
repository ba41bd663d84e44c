"""LayerNorm whose statistics are computed in fp32 for fp16/bf16 inputs (forward and backward), output in the input dtype; Triton kernel on CUDA, PyTorch elsewhere."""

from __future__ import annotations

import importlib.util
import math
import re
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from torchlevers.precision import autocast_off

__all__ = [
    "Backend",
    "FP32StatsLayerNorm",
    "fp32_stats_layer_norm",
    "select_backend",
    "swap_layernorms",
    "triton_available",
]

Backend = Literal["auto", "triton", "torch"]
_BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp16/bf16 -> fp32; fp32 stays; fp64 stays fp64 (never *less* precise than the input).
    return torch.promote_types(dtype, torch.float32)


class _TorchLayerNormFn(torch.autograd.Function):
    """LayerNorm over the last dim of a 2-D tensor, statistics and gradients in fp32."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        sd = _stat_dtype(x.dtype)
        # Autocast must not push these ops back down to fp16.
        with autocast_off(x.device.type):
            xf = x.to(sd)
            mean = xf.mean(dim=-1, keepdim=True)
            xc = xf - mean
            var = (xc * xc).mean(dim=-1, keepdim=True)
            rstd = torch.rsqrt(var + eps)
            y = xc * rstd
            if weight is not None:
                y = y * weight.to(sd)
            if bias is not None:
                y = y + bias.to(sd)
        # Keep x in its own (small) dtype and recompute x_hat in backward, as native LayerNorm does.
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        sd = mean.dtype
        with autocast_off(x.device.type):
            xhat = (x.to(sd) - mean) * rstd
            dyf = dy.to(sd)
            g = dyf * weight.to(sd) if weight is not None else dyf
            n = x.shape[-1]
            c1 = (g * xhat).sum(dim=-1, keepdim=True) / n
            c2 = g.sum(dim=-1, keepdim=True) / n
            dx = (g - xhat * c1 - c2) * rstd
            dw = (dyf * xhat).sum(0).to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
            db = None
            if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
                db = dyf.sum(0).to(ctx.bias_dtype)
        return dx.to(x.dtype), dw, db, None


def triton_available() -> bool:
    """Triton is installed and a CUDA device is present (the kernels' compiled target)."""
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


_TRITON_MIN = (3, 6)
_problems: dict[tuple[torch.device, torch.dtype, int], str | None] = {}
_warned: set[str] = set()


# Marked constant, like _warn_fallback below: torch.compile runs it as plain Python while
# tracing and bakes the answer into the graph, so no import, version check or probe launch
# runs per forward and none breaks a compiled graph.
@torch.compiler.assume_constant_result
def _triton_problem(device: torch.device, dtype: torch.dtype, n: int) -> str | None:
    """Why the Triton kernels cannot take this input (None if they can); found once per key."""
    key = (device, dtype, n)
    if key not in _problems:
        _problems[key] = _find_triton_problem(device, dtype, n)
    return _problems[key]


def _find_triton_problem(device: torch.device, dtype: torch.dtype, n: int) -> str | None:
    try:
        import triton
    except ImportError as exc:
        return f"triton cannot be imported ({exc}); pip install 'triton>=3.6'"
    version = tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:2])
    if version < _TRITON_MIN:
        return f"triton {triton.__version__} is older than 3.6; pip install 'triton>=3.6'"
    from torchlevers import _triton_layernorm

    return _triton_layernorm.problem(device, dtype, n)


@torch.compiler.assume_constant_result
def _warn_fallback(problem: str) -> bool:
    """Warn, once per reason, that backend="auto" runs the PyTorch path."""
    if problem not in _warned:
        _warned.add(problem)
        warnings.warn(f"fp32_stats_layer_norm: backend='auto' uses PyTorch, not Triton: {problem}", stacklevel=2)
    return True


def select_backend(x: torch.Tensor, normalized_numel: int, backend: Backend = "auto") -> Literal["triton", "torch"]:
    """Pick the implementation for ``x``.

    The checks run once per (device, dtype, width); under ``torch.compile`` they run while
    tracing, never in the compiled graph.

    Args:
        x: the input.
        normalized_numel: number of elements each row is normalised over.
        backend: "auto" = Triton for CUDA tensors, PyTorch for other devices; a CUDA input
            the kernels cannot take (triton missing or older than 3.6, a dtype other than
            fp16/bf16/fp32, more than 16384 features, a device this Triton cannot compile
            for) runs PyTorch too, with one warning per reason. "triton"/"torch" force one.
            An empty input always runs PyTorch.

    Returns:
        "triton" or "torch".

    Raises:
        RuntimeError: ``backend="triton"`` for a tensor the kernels cannot run on, with the reason.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and not x.is_cuda) or x.numel() == 0:
        return "torch"
    problem = _triton_problem(x.device, x.dtype, normalized_numel)
    if problem is None:
        return "triton"
    if backend == "triton":
        raise RuntimeError(f"backend='triton' cannot take this input: {problem}; use backend='auto' or 'torch'")
    _warn_fallback(problem)
    return "torch"


def fp32_stats_layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int] | int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """``F.layer_norm`` with mean/variance (and the backward's reductions) in fp32 for half inputs.

    Args:
        x: input of shape (..., *normalized_shape), any float dtype.
        normalized_shape: trailing dims to normalise over.
        weight, bias: optional affine parameters of shape ``normalized_shape``
            (usually fp32 master weights; applied in fp32).
        eps: added to the variance.
        backend: see :func:`select_backend`.

    Returns:
        Tensor of ``x``'s shape and dtype. Under autocast this keeps fp16/bf16
        activations in their dtype (unlike ``F.layer_norm``, which autocast runs
        in fp32 on CUDA), so the next matmul reads half the bytes.
    """
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[x.dim() - len(shape):] != shape:
        raise ValueError(f"input shape {tuple(x.shape)} does not end with normalized_shape {shape}")
    if not x.is_floating_point():
        raise ValueError(f"expected a floating-point input, got dtype {x.dtype}")
    # torch.Size compares with a tuple as it is: no copy on every call.
    if weight is not None and weight.shape != shape:
        raise ValueError(f"weight of shape {tuple(weight.shape)} does not match normalized_shape {shape}")
    if bias is not None and bias.shape != shape:
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not match normalized_shape {shape}")
    n = math.prod(shape)
    x2 = x.reshape(-1, n)
    w = weight.reshape(n) if weight is not None else None
    b = bias.reshape(n) if bias is not None else None
    if select_backend(x, n, backend) == "triton":
        from torchlevers._triton_layernorm import layer_norm

        y = layer_norm(x2, w, b, eps)
    else:
        y = _TorchLayerNormFn.apply(x2, w, b, eps)
    return y.reshape(x.shape)


class FP32StatsLayerNorm(nn.LayerNorm):
    """Drop-in ``nn.LayerNorm`` computing statistics in fp32 and returning the input dtype.

    A subclass, so ``isinstance(m, nn.LayerNorm)`` checks (weight-decay exclusion
    lists, for instance) still hold. Parameters and state-dict keys are the same.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        backend: Backend = "auto",
    ) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        self.backend: Backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp32_stats_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"

    @classmethod
    def from_layernorm(cls, ln: nn.LayerNorm, *, backend: Backend = "auto") -> FP32StatsLayerNorm:
        """Build one that *shares* ``ln``'s parameters (an existing optimizer keeps working)."""
        new = cls(
            ln.normalized_shape,
            eps=ln.eps,
            elementwise_affine=False,
            bias=False,
            backend=backend,
        )
        new.elementwise_affine = ln.elementwise_affine
        new.weight = ln.weight
        new.bias = ln.bias
        new.train(ln.training)
        return new


def swap_layernorms(model: nn.Module, *, backend: Backend = "auto") -> list[str]:
    """Replace every plain ``nn.LayerNorm`` inside ``model`` by :class:`FP32StatsLayerNorm`, in place.

    Subclasses of ``nn.LayerNorm`` are left alone (they may change behaviour).
    Parameters are shared, not copied. A LayerNorm carrying hooks or a wrapped ``forward``
    (e.g. from :meth:`PrecisionPolicy.apply <torchlevers.precision.PrecisionPolicy.apply>`) is
    refused, as its replacement would silently drop them: swap first.

    Args:
        model: the model to modify.
        backend: passed to each new module.

    Returns:
        Qualified names of the replaced modules.
    """
    if type(model) is nn.LayerNorm:
        raise ValueError("model is itself an nn.LayerNorm; use FP32StatsLayerNorm.from_layernorm(model)")
    found = [(parent, child_name, f"{parent_name}.{child_name}" if parent_name else child_name, child)
             for parent_name, parent in model.named_modules() for child_name, child in parent.named_children()
             if type(child) is nn.LayerNorm]
    for _, _, name, child in found:
        carried = [what for what in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                                     "_state_dict_hooks", "_load_state_dict_pre_hooks") if getattr(child, what, None)]
        if "forward" in child.__dict__:
            carried.append("a wrapped forward")
        if carried:
            raise ValueError(f"swap_layernorms: {name!r} carries {', '.join(carried)}, which its replacement would "
                             "drop: swap the LayerNorms before hooks or a precision policy are installed")
    for parent, child_name, _, child in found:
        setattr(parent, child_name, FP32StatsLayerNorm.from_layernorm(child, backend=backend))
    return [name for _, _, name, _ in found]
