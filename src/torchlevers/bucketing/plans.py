"""Batch plans over a dataset (static, length-sorted, bucketed): which samples share a batch, the width each is padded to, and the real lengths."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from torchlevers.bucketing.buckets import Buckets
from torchlevers.bucketing.collate import _to_long_1d
from torchlevers.bucketing.lengths import LengthOverflowError, _as_lengths
from torchlevers.bucketing.sampler import BucketBatchSampler

__all__ = ["BatchPlan", "pad_batches", "plan_bucketed", "plan_sorted", "plan_static"]


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """One batching strategy over a dataset: which samples share a batch, the width each batch
    is padded to, and the real lengths in it.

    The plan carries data, not accounting: padding is measured from ``real_lens`` and
    ``padded_lens`` (e.g. ``perfbudget.measure.padding.padding_stats(plan.real_lens,
    plan.padded_lens)``).
    """

    strategy: Literal["static", "sorted", "bucketed"]
    """Which batching made the plan."""
    batches: tuple[tuple[int, ...], ...]
    """Dataset indices per batch."""
    padded_lens: tuple[int, ...]
    """Sequence length (tokens) each batch is padded to."""
    real_lens: tuple[tuple[int, ...], ...]
    """Real length (tokens) of every member of each batch, in the order of ``batches``."""

    def __post_init__(self) -> None:
        if not len(self.batches) == len(self.padded_lens) == len(self.real_lens):
            raise ValueError(
                f"BatchPlan({self.strategy!r}): {len(self.batches)} batches, "
                f"{len(self.padded_lens)} padded_lens, {len(self.real_lens)} real_lens; expected one each"
            )
        for i, (batch, real) in enumerate(zip(self.batches, self.real_lens, strict=True)):
            if len(batch) != len(real):
                raise ValueError(
                    f"BatchPlan({self.strategy!r}).real_lens[{i}]: {len(real)} lengths for a batch of "
                    f"{len(batch)} samples"
                )

    @property
    def num_samples(self) -> int:
        """Samples covered by the plan."""
        return sum(len(b) for b in self.batches)


def _plan(
    strategy: Literal["static", "sorted", "bucketed"],
    lengths: np.ndarray,
    batches: Sequence[tuple[int, ...]],
    widths: Sequence[int],
) -> BatchPlan:
    return BatchPlan(
        strategy=strategy,
        batches=tuple(batches),
        padded_lens=tuple(int(w) for w in widths),
        real_lens=tuple(tuple(int(n) for n in lengths[list(b)]) for b in batches),
    )


def plan_static(
    lengths: Sequence[int] | np.ndarray, *, batch_size: int, max_len: int, seed: int = 0, shuffle: bool = True
) -> BatchPlan:
    """Reference: shuffled batches, every sequence padded to a fixed ``max_len``.

    Raises:
        LengthOverflowError: if a length exceeds ``max_len``.
    """
    arr = _as_lengths(lengths)
    if arr.size and arr.max() > max_len:
        i = int(arr.argmax())
        raise LengthOverflowError(f"lengths[{i}] = {int(arr[i])} exceeds max_len={max_len}")
    g = torch.Generator()
    g.manual_seed(seed)
    order = torch.randperm(len(arr), generator=g).tolist() if shuffle else list(range(len(arr)))
    batches = tuple(tuple(order[i : i + batch_size]) for i in range(0, len(order), batch_size))
    return _plan("static", arr, batches, [max_len] * len(batches))


def plan_sorted(
    lengths: Sequence[int] | np.ndarray, *, batch_size: int | None = None, max_tokens: int | None = None
) -> BatchPlan:
    """Reference lower bound: sort by length, cut consecutive batches, pad each to its own max.

    No shuffling at all, which is why it is a bound and not a training recipe. It
    bounds batchings with the same batch size; bucketing on a small dataset, where
    many buckets end in partial (smaller) batches, can come out below it.
    With ``max_tokens``, a batch grows while ``count x longest <= max_tokens``.
    """
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("give exactly one of batch_size or max_tokens")
    arr = _as_lengths(lengths)
    order = np.argsort(arr, kind="stable").tolist()
    batches: list[tuple[int, ...]] = []
    widths: list[int] = []
    if batch_size is not None:
        for i in range(0, len(order), batch_size):
            b = tuple(order[i : i + batch_size])
            batches.append(b)
            widths.append(int(arr[b[-1]]))
    else:
        assert max_tokens is not None
        cur: list[int] = []
        for idx in order:
            if cur and (len(cur) + 1) * int(arr[idx]) > max_tokens:
                batches.append(tuple(cur))
                widths.append(int(arr[cur[-1]]))
                cur = []
            cur.append(idx)
        if cur:
            batches.append(tuple(cur))
            widths.append(int(arr[cur[-1]]))
    return _plan("sorted", arr, batches, widths)


def plan_bucketed(
    lengths: Sequence[int] | np.ndarray,
    buckets: Buckets,
    *,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    pad_to: Literal["bucket_max", "batch_max"] = "bucket_max",
) -> BatchPlan:
    """One epoch of :class:`BucketBatchSampler` as a plan (same batches the sampler yields)."""
    arr = _as_lengths(lengths)
    sampler = BucketBatchSampler(arr, buckets, batch_size=batch_size, max_tokens=max_tokens, seed=seed)
    sampler.set_epoch(epoch)
    batches = tuple(tuple(b) for b in sampler)
    if pad_to == "bucket_max":
        widths = tuple(buckets.padded_length(int(arr[list(b)].max())) for b in batches)
    else:
        widths = tuple(int(arr[list(b)].max()) for b in batches)
    return _plan("bucketed", arr, batches, widths)


def pad_batches(
    sequences: Sequence[Sequence[int] | torch.Tensor], plan: BatchPlan, *, pad_id: int = 0
) -> Iterator[dict[str, torch.Tensor]]:
    """Materialise a plan: yield ``input_ids``/``attention_mask`` batches padded to the plan's widths.

    Lets a throughput comparison feed the *same* samples through static, sorted
    and bucketed batching.

    Raises:
        LengthOverflowError: a sequence is longer than its batch's width.
        ValueError: a sequence's length differs from the plan's ``real_lens`` (the plan
            was made from other lengths, so padding measured from it would be wrong).
    """
    for batch, width, real in zip(plan.batches, plan.padded_lens, plan.real_lens, strict=True):
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        lengths = torch.empty(len(batch), dtype=torch.long)
        for row, idx in enumerate(batch):
            t = _to_long_1d(sequences[idx], f"sequences[{idx}]")
            if len(t) > width:
                raise LengthOverflowError(f"sequences[{idx}] has {len(t)} tokens, plan pads to {width}")
            if len(t) != real[row]:
                raise ValueError(
                    f"sequences[{idx}] has {len(t)} tokens, the {plan.strategy!r} plan was made "
                    f"with length {real[row]}"
                )
            ids[row, : len(t)] = t
            lengths[row] = len(t)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        yield {"input_ids": ids, "attention_mask": mask, "lengths": lengths}
