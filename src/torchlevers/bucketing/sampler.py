"""A streaming bucketed batch sampler that keeps shuffling: one bucket per batch, seeded per epoch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from torchlevers.bucketing.buckets import Buckets
from torchlevers.bucketing.lengths import _as_lengths

__all__ = ["BucketBatchSampler"]


class BucketBatchSampler(Sampler[list[int]]):
    """Streaming bucketed batch sampler: yields lists of dataset indices, one bucket per batch.

    Each epoch walks a fresh seeded permutation of all indices and drops each
    index into its bucket's pending list; a list is yielded as soon as it is
    full, so batches of different buckets interleave in random order and
    memory is one pending batch per bucket. Leftover partial batches are yielded
    at the end of the epoch in a seeded random order (or dropped with
    ``drop_last``). Every index appears exactly once per epoch unless dropped.

    Use as ``DataLoader(ds, batch_sampler=sampler, collate_fn=BucketCollator(buckets))``
    and call :meth:`set_epoch` each epoch; without it, each new iteration uses
    the next epoch, so shuffling never stalls.

    Shapes: with pad-to-bucket-max each bucket is one (capacity, length) shape,
    plus a smaller batch dimension for its partial last batch; a compiled step
    with static shapes needs ``drop_last=True`` or a dynamic batch dimension.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        """
        Args:
            lengths: length (tokens) of every dataset item, by index.
            buckets: fitted bucket boundaries; a length above the last raises here.
            batch_size: samples per batch (exactly one of batch_size / max_tokens).
            max_tokens: token budget per batch counted after padding to the
                bucket maximum, so a bucket of length L holds ``max_tokens // L``.
            shuffle: shuffle within epochs (False: dataset order, still bucketed).
            seed: seed of the per-epoch permutation.
            drop_last: drop each bucket's partial last batch.
        """
        if (batch_size is None) == (max_tokens is None):
            raise ValueError(
                f"give exactly one of batch_size or max_tokens, got batch_size={batch_size!r}, "
                f"max_tokens={max_tokens!r}"
            )
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens!r}")
        self._lengths = _as_lengths(lengths)
        self.buckets = buckets
        self._bucket_of = buckets.bucket_ids(self._lengths)
        if max_tokens is not None:
            used = sorted({int(b) for b in np.unique(self._bucket_of)})
            too_long = [buckets.boundaries[b] for b in used if buckets.boundaries[b] > max_tokens]
            if too_long:
                raise ValueError(
                    f"max_tokens={max_tokens} is smaller than bucket length {too_long[-1]}; "
                    "a batch must hold at least one padded sequence"
                )
            self._capacity = [max(1, max_tokens // b) for b in buckets.boundaries]
        else:
            assert batch_size is not None
            self._capacity = [batch_size] * len(buckets)
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration uses."""
        self.epoch = epoch

    def capacity(self, bucket: int) -> int:
        """Samples per full batch of ``bucket``."""
        return self._capacity[bucket]

    def __len__(self) -> int:
        counts = np.bincount(self._bucket_of, minlength=len(self.buckets))
        total = 0
        for b, c in enumerate(counts):
            cap = self._capacity[b]
            total += int(c) // cap if self.drop_last else -(-int(c) // cap)
        return total

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        # Advance so that a loop without set_epoch still reshuffles every epoch.
        self.epoch = epoch + 1
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + epoch)
        n = len(self._lengths)
        order = torch.randperm(n, generator=g).tolist() if self.shuffle else list(range(n))
        pending: list[list[int]] = [[] for _ in self.buckets.boundaries]
        bucket_of = self._bucket_of.tolist()
        for idx in order:
            b = bucket_of[idx]
            pending[b].append(idx)
            if len(pending[b]) == self._capacity[b]:
                yield pending[b]
                pending[b] = []
        if self.drop_last:
            return
        rest = [p for p in pending if p]
        if self.shuffle:
            perm = torch.randperm(len(rest), generator=g).tolist()
            rest = [rest[i] for i in perm]
        yield from rest
