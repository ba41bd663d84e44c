"""Colour conversions of float32 image batches ``(B, 3, H, W)`` in [0, 1], written as an image library writes them:
whole-tensor operations, each returning a new tensor (an 8x3x512x512 batch is 25 MB)."""

from __future__ import annotations

import torch

__all__ = ["rgb_to_grayscale", "rgb_to_hsv"]

_LUMA = (0.299, 0.587, 0.114)


def rgb_to_grayscale(image: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma of an RGB batch: ``(B, 1, H, W)``."""
    r, g, b = image.unbind(dim=-3)
    return (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).unsqueeze(-3)


def rgb_to_hsv(image: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Hue (radians, [0, 2pi)), saturation and value of an RGB batch: ``(B, 3, H, W)``."""
    maxc, argmax = image.max(dim=-3)
    minc = image.min(dim=-3).values
    delta = maxc - minc
    s = delta / (maxc + eps)
    delta = torch.where(delta == 0, torch.ones_like(delta), delta)
    r, g, b = image.unbind(dim=-3)
    rc, gc, bc = maxc - r, maxc - g, maxc - b
    h = torch.stack((bc - gc, 2.0 * delta + rc - bc, 4.0 * delta + gc - rc), dim=-3)
    h = torch.gather(h, dim=-3, index=argmax.unsqueeze(-3)).squeeze(-3) / delta
    h = (h / 6.0) % 1.0 * (2 * torch.pi)
    return torch.stack((h, s, maxc), dim=-3)
