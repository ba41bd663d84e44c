"""Length buckets: boundaries, and which bucket (and padded length) each sequence gets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchlevers.bucketing.lengths import LengthOverflowError, _as_lengths

__all__ = ["Buckets"]


@dataclass(frozen=True, kw_only=True)
class Buckets:
    """Length buckets: bucket ``i`` holds lengths in ``(boundaries[i-1], boundaries[i]]``."""

    boundaries: tuple[int, ...]
    """Inclusive upper length of each bucket (tokens), strictly increasing, all >= 1.
    A batch from bucket ``i`` is padded to ``boundaries[i]``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "boundaries", tuple(self.boundaries))
        _check_boundaries(self.boundaries, where="Buckets.boundaries")

    @property
    def max_len(self) -> int:
        """Longest length the buckets cover (tokens)."""
        return self.boundaries[-1]

    def __len__(self) -> int:
        return len(self.boundaries)

    def bucket_ids(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """Bucket index of each length.

        Raises:
            LengthOverflowError: naming the first length above :attr:`max_len`.
        """
        arr = _as_lengths(lengths)
        if arr.size and arr.max() > self.max_len:
            i = int(np.argmax(arr > self.max_len))
            raise LengthOverflowError(
                f"lengths[{i}] = {int(arr[i])} is longer than the last bucket ({self.max_len}); "
                "refit the buckets with a larger max_len or filter/truncate the data explicitly"
            )
        return np.searchsorted(np.asarray(self.boundaries), arr, side="left")

    def bucket_of(self, length: int) -> int:
        """Bucket index of one length (see :meth:`bucket_ids`)."""
        return int(self.bucket_ids([length])[0])

    def padded_length(self, length: int) -> int:
        """Length a sequence of ``length`` tokens is padded to (its bucket's maximum)."""
        return self.boundaries[self.bucket_of(length)]


def _check_boundaries(values: Sequence[Any], *, where: str) -> None:
    if len(values) == 0:
        raise ValueError(f"{where}: expected at least one boundary, got []")
    prev: int | None = None
    for i, v in enumerate(values):
        # bool is an int subclass; a JSON `true` is never a length.
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{where}[{i}]: expected an integer length, got {v!r}")
        if v < 1:
            raise ValueError(f"{where}[{i}]: expected a length >= 1, got {v!r}")
        if prev is not None and v <= prev:
            raise ValueError(
                f"{where}[{i}]: expected a length greater than {where}[{i - 1}] ({prev}), got {v!r}"
            )
        prev = int(v)
