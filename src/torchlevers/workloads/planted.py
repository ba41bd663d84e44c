"""Small models with a planted numerical hazard, for showing what a lever protects against."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["OverflowProne", "TwoScale", "overflow_batches", "two_scale_batch"]


class _Embeddings(nn.Module):
    """Table + projection + LayerNorm, like BERT's embeddings module."""

    def __init__(self, vocab: int, dim: int, hidden: int, init_std: float) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, dim)
        nn.init.normal_(self.table.weight, std=init_std)
        self.proj = nn.Linear(dim, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(self.table(ids)))


class OverflowProne(nn.Module):
    """Embedding projections reach ~1e5 (fp16's max is 65504); after the LayerNorm all is O(1).

    Whole-model fp16 overflows in the embedding projection; a policy that keeps the
    embeddings in fp32 does not. Modules: ``embed.{table,proj,norm}``, ``block``, ``head``.
    """

    def __init__(self, vocab: int = 64, dim: int = 16, hidden: int = 32, classes: int = 4, *, seed: int = 0) -> None:
        super().__init__()
        g = torch.random.fork_rng()
        with g:
            torch.manual_seed(seed)
            self.embed = _Embeddings(vocab, dim, hidden, init_std=5e4)
            self.block = nn.Sequential(nn.Linear(hidden, 64), nn.GELU(), nn.Linear(64, hidden))
            self.head = nn.Linear(hidden, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.block(h)
        return self.head(h[:, 0])


def overflow_batches(steps: int, *, seed: int = 1, vocab: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of 16 x 8 ids; the label is a function of token 0, so loss can fall."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(0, vocab, (16, 8), generator=g) for _ in range(steps)]
    return [(x, x[:, 0] % 4) for x in xs]


class TwoScale(nn.Module):
    """Two independent paths: ``small`` sees inputs x0.01 (gradients ~100x smaller, like an
    embedding), ``large`` sees them as they are (like an FFN)."""

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.small = nn.Linear(16, 4)
            self.large = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.small(0.01 * x), self.large(x)


def two_scale_batch(g: torch.Generator, spike: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs and targets for :class:`TwoScale`; ``spike`` scales the large path's target."""
    x = torch.randn(32, 16, generator=g)
    return x, torch.randn(32, 4, generator=g), spike * torch.randn(32, 4, generator=g)
