"""A small vector-search library: normalise embeddings, find nearest neighbours, tokenise, smooth a signal."""

from __future__ import annotations

import re

import numpy as np
import torch

SMOOTH_PASSES = 10
_WORD = re.compile(r"[a-z0-9]+")


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm."""
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def cosine_topk(queries: torch.Tensor, corpus: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` corpus rows most similar (cosine) to each query."""
    return (normalize(queries) @ normalize(corpus).T).topk(k, dim=1).indices


def tokenize(text: str) -> list[str]:
    """Lower-case words and numbers of ``text``."""
    return _WORD.findall(text.lower())


def sort_inplace(values: np.ndarray) -> np.ndarray:
    """``values`` sorted in place (and returned)."""
    values.sort()
    return values


def smooth(x: np.ndarray, window: int = 5) -> np.ndarray:
    """``SMOOTH_PASSES`` passes of a box filter of ``window`` samples."""
    kernel = np.full(window, 1.0 / window)
    for _ in range(SMOOTH_PASSES):
        x = np.convolve(x, kernel, mode="same")
    return x
