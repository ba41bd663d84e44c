"""Padding-rate accounting: the share of computed tokens that are padding."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PaddingStats",
    "padding_rate",
    "padding_rate_by_width",
    "padding_rate_from_mask",
    "padding_stats",
    "sorted_batching_padding_rate",
]


@dataclass(frozen=True, kw_only=True)
class PaddingStats:
    """Token accounting over a set of padded batches."""

    real_tokens: int
    """Tokens that carry data."""
    padded_tokens: int
    """Tokens computed after padding (batch size x padded length, summed)."""
    batches: int

    @property
    def pad_tokens(self) -> int:
        """Tokens that are padding."""
        return self.padded_tokens - self.real_tokens

    @property
    def rate(self) -> float:
        """Padding tokens / padded tokens, 0-1 (0 for no tokens at all)."""
        return self.pad_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def __add__(self, other: PaddingStats) -> PaddingStats:
        return PaddingStats(
            real_tokens=self.real_tokens + other.real_tokens,
            padded_tokens=self.padded_tokens + other.padded_tokens,
            batches=self.batches + other.batches,
        )


def padding_stats(
    lengths_per_batch: Iterable[Sequence[int]], padded_len_per_batch: Iterable[int]
) -> PaddingStats:
    """Real and padded token counts of batches.

    Args:
        lengths_per_batch: for each batch, the true length of every sequence in it.
        padded_len_per_batch: for each batch, the length it was padded to.

    Raises:
        ValueError: batch counts differ, a length is negative, or a sequence is longer than
            its batch's padded length (a truncation must not pass silently).
    """
    lengths = [list(b) for b in lengths_per_batch]
    padded = list(padded_len_per_batch)
    if len(lengths) != len(padded):
        raise ValueError(f"got {len(lengths)} batches of lengths but {len(padded)} padded lengths")
    real = total = 0
    for i, (batch, pad_to) in enumerate(zip(lengths, padded, strict=True)):
        if pad_to < 0:
            raise ValueError(f"batch {i}: padded length must be >= 0, got {pad_to}")
        for j, n in enumerate(batch):
            if n < 0:
                raise ValueError(f"batch {i}, sequence {j}: length must be >= 0, got {n}")
            if n > pad_to:
                raise ValueError(
                    f"batch {i}, sequence {j}: length {n} exceeds the padded length {pad_to} "
                    f"(truncation)"
                )
        real += sum(batch)
        total += pad_to * len(batch)
    return PaddingStats(real_tokens=real, padded_tokens=total, batches=len(lengths))


def padding_rate(
    lengths_per_batch: Iterable[Sequence[int]], padded_len_per_batch: Iterable[int]
) -> float:
    """Padded-away tokens / total padded tokens over all batches, 0-1.

    Example: batches ``[[3, 5], [2]]`` padded to ``[5, 4]`` compute ``2*5 + 1*4 = 14`` tokens
    of which ``10`` are real: rate ``4/14`` (0 without tokens). Arguments as :func:`padding_stats`.
    """
    return padding_stats(lengths_per_batch, padded_len_per_batch).rate


def padding_rate_by_width(
    lengths_per_batch: Iterable[Sequence[int]], padded_len_per_batch: Iterable[int]
) -> dict[int, float]:
    """Padding rate of the batches padded to each width (one width per bucket when bucketed).

    Example: batches ``[[3, 5], [2], [4]]`` padded to ``[5, 4, 4]``: width 5 holds 8 real of
    10 tokens (rate ``0.2``), width 4 holds 6 real of 8 (rate ``0.25``). Arguments and errors as
    :func:`padding_stats`; returns ``{padded width: padding rate}``, widths ascending.
    """
    lengths = [list(b) for b in lengths_per_batch]
    padded = list(padded_len_per_batch)
    # Checked on the whole list first, so an error names the batch's index in it.
    padding_stats(lengths, padded)
    by_width: dict[int, list[list[int]]] = {}
    for batch, width in zip(lengths, padded, strict=True):
        by_width.setdefault(width, []).append(batch)
    return {
        width: padding_rate(by_width[width], [width] * len(by_width[width]))
        for width in sorted(by_width)
    }


def padding_rate_from_mask(mask: Any) -> float:
    """Share of zero entries of an attention mask (``[batch, seq]``, non-zero/True = real token):
    a torch tensor, numpy array or nested sequence."""
    if hasattr(mask, "numel") and hasattr(mask, "count_nonzero"):  # torch.Tensor
        total = int(mask.numel())
        real = int(mask.count_nonzero())
    else:
        import numpy as np

        arr = np.asarray(mask)
        total = int(arr.size)
        real = int(np.count_nonzero(arr))
    return (total - real) / total if total else 0.0


def sorted_batching_padding_rate(lengths: Sequence[int], batch_size: int) -> float:
    """Padding rate of batching ``lengths`` in sorted order, ``batch_size`` a batch (the last may be
    smaller), each padded to its maximum: the lower bound for a bucketing sampler of that batch size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    xs = sorted(lengths)
    batches = [xs[i : i + batch_size] for i in range(0, len(xs), batch_size)]
    return padding_rate(batches, [max(b) for b in batches])
