"""A fixed reference workload whose time tracks the machine's speed of the moment."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["REFERENCE_VERSION", "machine_reference", "reference_step"]

#: Bump when the reference changes: budgets normalised to an older reference are not comparable.
REFERENCE_VERSION = 1


def reference_step(device: Literal["cpu", "cuda"] = "cpu", *, repeat: int = 3) -> Callable[[], Any]:
    """A warm, deterministic callable: ``repeat`` training steps (about 2 ms each on one CPU core)
    of a small MLP with LayerNorm and AdamW, on ``device``.

    Its mix resembles a small model's step, so host contention and frequency changes slow it by
    about the same factor as the code under test; it is the fixed yardstick samples are normalised by.
    """
    import torch
    from torch import nn

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = nn.Sequential(
            nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 256), nn.LayerNorm(256), nn.Linear(256, 10)
        ).to(device)
        x = torch.randn(64, 128, device=device)
        y = torch.randint(0, 10, (64,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        for _ in range(repeat):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    for _ in range(2):
        step()
    return step


@functools.cache
def machine_reference(device: Literal["cpu", "cuda"] = "cpu") -> Callable[[], Any]:
    """The device's reference workload, built once per process (every check shares it)."""
    return reference_step(device)
