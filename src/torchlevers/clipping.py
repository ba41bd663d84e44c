"""Gradient clipping: per-layer adaptive clipping (threshold = k x the layer's gradient std) beside the global-norm baseline, each returning a per-layer report."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

__all__ = [
    "ClipReport",
    "LayerClip",
    "PerLayerClipConfig",
    "PerLayerClipper",
    "clip_global_norm",
]

NamedParams = Iterable[tuple[str, nn.Parameter]]


@dataclass(frozen=True)
class LayerClip:
    """What clipping did to one layer (one parameter tensor)."""

    name: str
    """Qualified parameter name."""
    std: float
    """Gradient std of this step before clipping: root mean square of the elements."""
    threshold: float
    """Limit it was held to: for per-layer "running", k x the layer's running std;
    for "per_step", the elementwise bound k x std; for the global clip, the
    global max_norm. nan while a layer is still in warm-up."""
    scale: float
    """Factor the whole gradient was multiplied by (1.0 = untouched in scale)."""
    clipped_elements: int
    """Elements whose value changed."""
    finite: bool = True
    """False when the gradient held inf/nan; such a layer is left for the loss scaler."""

    @property
    def clipped(self) -> bool:
        """The gradient was changed."""
        return self.clipped_elements > 0


@dataclass(frozen=True)
class ClipReport:
    """Per-layer outcome of one clipping call."""

    method: Literal["per_layer_running", "per_layer_step", "global_norm"]
    layers: tuple[LayerClip, ...]
    total_norm: float
    """Global L2 norm of all gradients before clipping."""

    @property
    def clipped(self) -> tuple[str, ...]:
        """Names of the layers whose gradient changed."""
        return tuple(layer.name for layer in self.layers if layer.clipped)

    def __getitem__(self, name: str) -> LayerClip:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"no layer {name!r} in this report (layers: {[lc.name for lc in self.layers]})")


def _with_grads(named_params: NamedParams) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.grad) for n, p in named_params if p.grad is not None]


def _grad_stats(grads: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor gradient std (root mean square of the elements) and the global L2 norm.

    Both stay on the gradients' device (no host sync, no host-built tensor meeting a
    device one): the global norm is the norm of the per-tensor norms, in fp64 so that
    squaring a large norm cannot overflow.
    """
    # One fused norm per tensor; divide by sqrt(numel) to get the per-element spread.
    norms = torch._foreach_norm([g.float() if g.dtype != torch.float32 else g for g in grads])
    stds = torch._foreach_div(norms, [math.sqrt(g.numel()) for g in grads])
    total = torch.linalg.vector_norm(torch.stack(norms).double())
    return torch.stack(stds), total


def clip_global_norm(named_params: NamedParams, max_norm: float = 1.0) -> ClipReport:
    """Baseline: ``torch.nn.utils.clip_grad_norm_`` over all gradients, reported per layer.

    Every layer gets the same factor ``min(1, max_norm / total_norm)``, so one
    large-gradient layer scales all the others down too. A non-finite total norm leaves every
    gradient as it is (for the loss scaler or the step skip), where ``clip_grad_norm_`` would
    multiply the finite layers by zero.

    Args:
        named_params: ``model.named_parameters()``.
        max_norm: limit on the global L2 norm.

    Returns:
        :class:`ClipReport` (one host sync).
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm!r}")
    params = [(n, p) for n, p in named_params if p.grad is not None]
    if not params:
        return ClipReport("global_norm", (), 0.0)
    items = [(n, p.grad) for n, p in params if p.grad is not None]
    grads = [g for _, g in items]
    stds, total = _grad_stats(grads)
    # clip_grad_norm_'s coefficient (1e-6 added, clamped at 1), 1 where the norm is not finite.
    factor = torch.where(torch.isfinite(total), (max_norm / (total + 1e-6)).clamp(max=1.0), 1.0)
    torch._foreach_mul_(grads, factor.float())
    stats = torch.cat([stds, total.reshape(1).float(), factor.reshape(1).float()]).tolist()
    total_norm, coef = stats[-2], stats[-1]
    layers = tuple(
        LayerClip(
            name=n,
            std=s,
            threshold=max_norm,
            scale=coef,
            clipped_elements=g.numel() if coef < 1.0 else 0,
            finite=math.isfinite(s),
        )
        for (n, g), s in zip(items, stats[:-2], strict=True)
    )
    return ClipReport("global_norm", layers, total_norm)


@dataclass(frozen=True, kw_only=True)
class PerLayerClipConfig:
    """Per-layer adaptive clipping settings.

    "Layer" is one parameter tensor (a weight or a bias: their gradients live
    on different scales). "Std" is the root mean square of its gradient
    elements, i.e. the spread about zero: it equals ``grad.std()`` when the mean
    is ~0 and, unlike it, still sees a gradient that is uniformly large and is
    defined for one-element parameters.
    """

    k: float = 2.5
    """Threshold multiplier (dimensionless)."""
    mode: Literal["running", "per_step"] = "running"
    """"running": a layer whose gradient std exceeds k x its *running* std (EMA over earlier
    steps) is rescaled, whole, down to that threshold; direction is kept and a layer at
    its usual scale is untouched. "per_step": each element is clamped to +-k x this
    step's std (removes within-layer outliers only; touches ~1 % of a Gaussian's
    elements every step and never limits a layer-wide spike)."""
    ema_decay: float = 0.9
    """Running std update: ``ema = decay * ema + (1 - decay) * std_after_clipping``."""
    warmup_steps: int = 5
    """"running": steps per layer that only record statistics before clipping starts."""

    def __post_init__(self) -> None:
        if not (self.k > 0 and math.isfinite(self.k)):
            raise ValueError(f"k must be a positive finite number, got {self.k!r}")
        if self.mode not in ("running", "per_step"):
            raise ValueError(f"mode must be one of 'running', 'per_step', got {self.mode!r}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay!r}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (the first step defines the scale), got {self.warmup_steps!r}")


class PerLayerClipper:
    """Per-layer adaptive gradient clipping with running statistics (see :class:`PerLayerClipConfig`).

    Call :meth:`clip` after ``backward`` (after ``GradScaler.unscale_`` for
    fp16) and before ``optimizer.step``; keep one clipper per model and save its
    :meth:`state_dict` with checkpoints.
    """

    def __init__(self, config: PerLayerClipConfig | None = None) -> None:
        self.config = config or PerLayerClipConfig()
        self._ema: dict[str, float] = {}
        self._seen: dict[str, int] = {}

    def running_std(self, name: str) -> float | None:
        """Running gradient std of a layer, None before its first step."""
        return self._ema.get(name)

    def clip(self, named_params: NamedParams) -> ClipReport:
        """Clip gradients in place and report per layer (one host sync).

        Args:
            named_params: ``model.named_parameters()``; parameters without a gradient are skipped.

        Returns:
            :class:`ClipReport`.
        """
        items = _with_grads(named_params)
        if not items:
            return ClipReport(self._method(), (), 0.0)
        grads = [g for _, g in items]
        stds, total = _grad_stats(grads)
        if self.config.mode == "per_step":
            return self._clip_per_step(items, stds, total)
        host = torch.cat([stds.double(), total.reshape(1)]).tolist()
        return self._clip_running(items, host[:-1], host[-1])

    def _method(self) -> Literal["per_layer_running", "per_layer_step"]:
        return "per_layer_running" if self.config.mode == "running" else "per_layer_step"

    def _clip_running(self, items: list[tuple[str, torch.Tensor]], stds: list[float], total: float) -> ClipReport:
        cfg = self.config
        layers = []
        for (name, grad), std in zip(items, stds, strict=True):
            if not math.isfinite(std):
                # Leave non-finite gradients to the loss scaler / step skip; never fold them into the EMA.
                layers.append(LayerClip(name, std, float("nan"), 1.0, 0, finite=False))
                continue
            if std == 0.0:
                # No gradient reached the layer (not routed, not used, a zero-initialised branch): nothing
                # to clip and nothing learnt of its scale. Folded in, a zero running std would clip every
                # later gradient of the layer to zero, for good.
                layers.append(LayerClip(name, std, float("nan"), 1.0, 0))
                continue
            seen = self._seen.get(name, 0)
            ema = self._ema.get(name)
            scale = 1.0
            threshold = float("nan")
            if ema and seen >= cfg.warmup_steps:
                threshold = cfg.k * ema
                if std > threshold:
                    scale = threshold / std
                    grad.mul_(scale)
            kept = std * scale
            self._ema[name] = kept if ema is None else cfg.ema_decay * ema + (1 - cfg.ema_decay) * kept
            self._seen[name] = seen + 1
            layers.append(LayerClip(name, std, threshold, scale, grad.numel() if scale < 1.0 else 0))
        return ClipReport("per_layer_running", tuple(layers), total)

    def _clip_per_step(
        self, items: list[tuple[str, torch.Tensor]], stds: torch.Tensor, total: torch.Tensor
    ) -> ClipReport:
        k = self.config.k
        counts = []
        for (_, grad), std in zip(items, stds, strict=True):
            bound = (k * std).to(grad.dtype)
            counts.append((grad.abs() > bound).sum())
            # A non-finite std means inf/nan in the gradient: leave it for the loss scaler.
            grad.copy_(torch.where(torch.isfinite(bound), grad.clamp(-bound, bound), grad))
        host = torch.cat([stds.double(), torch.stack(counts).double(), total.reshape(1)]).tolist()
        n = len(items)
        layers = tuple(
            LayerClip(
                name,
                host[i],
                k * host[i],
                1.0,
                int(host[n + i]) if math.isfinite(host[i]) else 0,
                finite=math.isfinite(host[i]),
            )
            for i, (name, _) in enumerate(items)
        )
        return ClipReport("per_layer_step", layers, host[-1])

    def state_dict(self) -> dict[str, Any]:
        """Running statistics, for checkpoints."""
        return {"ema": dict(self._ema), "seen": dict(self._seen)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._ema = {str(k): float(v) for k, v in state["ema"].items()}
        self._seen = {str(k): int(v) for k, v in state["seen"].items()}
