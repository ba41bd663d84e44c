"""Bucket boundaries fitted offline from a length sample: the exact 1-D partition (DP) or k-means, and the bucket-count rule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from torchlevers.bucketing.buckets import Buckets
from torchlevers.bucketing.lengths import LengthOverflowError, _as_lengths

__all__ = [
    "MAX_DISTINCT_LENGTHS",
    "BucketFit",
    "BucketFitConfig",
    "fit_buckets",
    "kmeans_buckets",
    "optimal_buckets",
    "padded_token_curve",
]


MAX_DISTINCT_LENGTHS = 4096
"""The DP holds a (distinct x distinct) table; beyond this, round lengths up to a multiple first."""


def _distinct(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values, counts = np.unique(lengths, return_counts=True)
    if len(values) > MAX_DISTINCT_LENGTHS:
        raise ValueError(
            f"{len(values)} distinct lengths (more than {MAX_DISTINCT_LENGTHS}); round them up to a "
            "multiple first, e.g. lengths = -(-lengths // 8) * 8 (multiples of 8 also suit tensor cores)"
        )
    return values.astype(np.int64), counts.astype(np.int64)


def _partition_tables(values: np.ndarray, counts: np.ndarray, max_buckets: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Dynamic programme over sorted distinct lengths.

    ``cost[k-1, j]`` is the fewest padded tokens that put the lengths
    ``values[:j+1]`` into at most ``k`` contiguous buckets, each padded to its
    largest member; ``back[k-2][j]`` is where the last bucket starts.
    Contiguous buckets are optimal for this cost (swapping two lengths across a
    boundary never lowers the padding), so the DP is exact.
    """
    m = len(values)
    cum_n = np.concatenate([[0], np.cumsum(counts)])
    cum_tok = np.concatenate([[0], np.cumsum(counts * values)])
    i = np.arange(m)[:, None]
    j = np.arange(m)[None, :]
    # Padded tokens of one bucket spanning values[i..j]: every member padded to values[j].
    group = values[None, :] * (cum_n[j + 1] - cum_n[i]) - (cum_tok[j + 1] - cum_tok[i])
    group = np.where(i <= j, group, np.inf).astype(np.float64)
    k_max = min(max_buckets, m)
    cost = np.empty((k_max, m), dtype=np.float64)
    cost[0] = group[0]
    back: list[np.ndarray] = []
    for k in range(1, k_max):
        # Previous buckets end at i-1, the new one spans i..j.
        prev = np.concatenate([[np.inf], cost[k - 1][:-1]])
        total = prev[:, None] + group
        arg = total.argmin(axis=0)
        best = total[arg, np.arange(m)]
        # "At most k" buckets: keep k-1 when an extra bucket does not help.
        keep = cost[k - 1] <= best
        cost[k] = np.where(keep, cost[k - 1], best)
        back.append(np.where(keep, -1, arg))
    return cost, back


def _boundaries_from_back(values: np.ndarray, back: list[np.ndarray], k: int) -> tuple[int, ...]:
    ends: list[int] = []
    j = len(values) - 1
    level = k - 1
    while level >= 1 and j >= 0:
        start = int(back[level - 1][j])
        if start == -1:  # this level reused the (k-1)-bucket answer
            level -= 1
            continue
        ends.append(j)
        j = start - 1
        level -= 1
    if j >= 0:
        ends.append(j)
    return tuple(int(values[e]) for e in sorted(ends))


def padded_token_curve(lengths: Sequence[int] | np.ndarray, max_buckets: int) -> np.ndarray:
    """Fewest padded tokens (pad-to-bucket-max) for 1..``max_buckets`` buckets.

    Args:
        lengths: sample of sequence lengths (tokens).
        max_buckets: largest bucket count to evaluate.

    Returns:
        float array, entry ``k-1`` = padded tokens of the optimal ``k``-bucket
        partition (flat once ``k`` reaches the number of distinct lengths).
    """
    arr = _as_lengths(lengths)
    if arr.size == 0:
        raise ValueError("lengths is empty")
    values, counts = _distinct(arr)
    cost, _ = _partition_tables(values, counts, max_buckets)
    curve = cost[:, -1]
    if len(curve) < max_buckets:
        curve = np.concatenate([curve, np.full(max_buckets - len(curve), curve[-1])])
    return curve


def optimal_buckets(lengths: Sequence[int] | np.ndarray, num_buckets: int) -> Buckets:
    """The ``num_buckets`` boundaries that minimise padded tokens on ``lengths`` (exact DP).

    Args:
        lengths: sample of sequence lengths (tokens).
        num_buckets: number of buckets (fewer are returned when there are fewer
            distinct lengths).

    Returns:
        the optimal :class:`Buckets`.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets!r}")
    arr = _as_lengths(lengths)
    if arr.size == 0:
        raise ValueError("lengths is empty")
    values, counts = _distinct(arr)
    cost, back = _partition_tables(values, counts, num_buckets)
    k = cost.shape[0]
    return Buckets(boundaries=_boundaries_from_back(values, back, k))


def kmeans_buckets(lengths: Sequence[int] | np.ndarray, num_buckets: int, *, max_iter: int = 100) -> Buckets:
    """Buckets from 1-D k-means on the lengths; each bucket ends at its cluster's longest member.

    k-means minimises squared distance to the centroids, not padding, so it is
    never better than :func:`optimal_buckets`; it is kept as the commonly used
    reference. Initialisation is at count-weighted quantiles, so it is deterministic.

    Args:
        lengths: sample of sequence lengths (tokens).
        num_buckets: number of clusters.
        max_iter: Lloyd iterations at most.

    Returns:
        :class:`Buckets` (fewer buckets if clusters come out empty).
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets!r}")
    arr = _as_lengths(lengths)
    if arr.size == 0:
        raise ValueError("lengths is empty")
    values, counts = _distinct(arr)
    x = values.astype(np.float64)
    w = counts.astype(np.float64)
    k = min(num_buckets, len(values))
    qs = (np.arange(k) + 0.5) / k
    cdf = np.cumsum(w) / w.sum()
    centers = x[np.searchsorted(cdf, qs, side="left").clip(0, len(x) - 1)]
    assign = np.zeros(len(x), dtype=np.int64)
    for _ in range(max_iter):
        assign = np.abs(x[:, None] - centers[None, :]).argmin(axis=1)
        mass = np.bincount(assign, weights=w, minlength=k)
        sums = np.bincount(assign, weights=w * x, minlength=k)
        # An emptied cluster keeps its centre (it then yields no bucket).
        new = np.where(mass > 0, sums / np.maximum(mass, 1e-300), centers)
        if np.allclose(new, centers):
            break
        centers = new
    ends = sorted({int(x[assign == c].max()) for c in range(k) if (assign == c).any()})
    return Buckets(boundaries=tuple(ends))


def _sorted_padding_tokens(lengths: np.ndarray, batch_size: int) -> int:
    """Pad tokens of length-sorted batching: the target ``select="lower_bound"`` fits to.

    An objective of the fit, computed on the length sample; padding of real batches is
    measured by the instrument (``perfbudget.measure.padding``), which this library cannot import.
    """
    s = np.sort(lengths)
    n = len(s)
    if n == 0:
        return 0
    starts = np.arange(0, n, batch_size)
    ends = np.minimum(starts + batch_size, n)
    batch_max = s[ends - 1]
    return int((batch_max * (ends - starts)).sum() - s.sum())


@dataclass(frozen=True, kw_only=True)
class BucketFitConfig:
    """How :func:`fit_buckets` chooses bucket boundaries."""

    method: Literal["dp", "kmeans"] = "dp"
    """"dp": exact minimum of padded tokens; "kmeans": 1-D k-means (the common heuristic)."""
    num_buckets: int | None = None
    """Fixed bucket count; None chooses it with ``select``."""
    max_buckets: int = 128
    """Most buckets considered (each bucket is one more padded shape to warm up or compile)."""
    select: Literal["lower_bound", "marginal_gain"] = "lower_bound"
    """"lower_bound": fewest buckets whose padding is within ``slack`` of length-sorted
    batching at ``batch_size`` (the best any batching of that size can do);
    "marginal_gain": stop when one more bucket saves less than ``min_gain``."""
    batch_size: int = 32
    """Batch size (samples) of the length-sorted reference used by ``select="lower_bound"``."""
    slack: float = 0.15
    """Allowed excess over the sorted-batching padded tokens (0.15 = 15 %)."""
    min_gain: float = 0.001
    """``select="marginal_gain"``: smallest saving worth a bucket, as a fraction of real tokens."""
    max_len: int | None = None
    """Longest length the buckets must cover (tokens); adds an empty last bucket up to it
    when the sample is shorter, so unseen long inputs are bucketed, not rejected. None: the
    sample's maximum."""

    def __post_init__(self) -> None:
        if self.method not in ("dp", "kmeans"):
            raise ValueError(f"method must be one of 'dp', 'kmeans', got {self.method!r}")
        if self.select not in ("lower_bound", "marginal_gain"):
            raise ValueError(
                f"select must be one of 'lower_bound', 'marginal_gain', got {self.select!r}"
            )
        if self.num_buckets is not None and self.num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1 or None, got {self.num_buckets!r}")
        if self.max_buckets < 1:
            raise ValueError(f"max_buckets must be >= 1, got {self.max_buckets!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")
        if not self.slack >= 0:
            raise ValueError(f"slack must be >= 0, got {self.slack!r}")
        if not self.min_gain >= 0:
            raise ValueError(f"min_gain must be >= 0, got {self.min_gain!r}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len must be >= 1 or None, got {self.max_len!r}")


@dataclass(frozen=True)
class BucketFit:
    """Result of :func:`fit_buckets`: the buckets and the token counts behind the choice.

    The counts are the fit's objective on its length sample; the padding of batches a
    plan or sampler produces is measured from their data (``BatchPlan.real_lens`` and
    ``padded_lens``).
    """

    buckets: Buckets
    real_tokens: int
    """Tokens in the length sample."""
    pad_tokens: int
    """Pad tokens the chosen buckets add on the sample (pad to bucket max)."""
    sorted_pad_tokens: int
    """Pad tokens of length-sorted batching at ``config.batch_size`` (the lower bound)."""
    curve: tuple[float, ...] = field(repr=False)
    """Padded tokens per bucket count 1..max_buckets (the DP optimum; the elbow plot)."""


def _bucket_padding_tokens(lengths: np.ndarray, buckets: Buckets) -> int:
    ids = buckets.bucket_ids(lengths)
    return int((np.asarray(buckets.boundaries)[ids] - lengths).sum())


def fit_buckets(lengths: Sequence[int] | np.ndarray, config: BucketFitConfig | None = None) -> BucketFit:
    """Fit bucket boundaries offline from a sample of lengths.

    Fix the result before training and load it from JSON (:func:`save_buckets`):
    buckets refitted online would change which samples share a batch from run
    to run and break reproducible shuffling.

    Args:
        lengths: sample of sequence lengths (tokens), e.g. the training set's.
        config: method and bucket-count rule; defaults to :class:`BucketFitConfig()`.

    Returns:
        :class:`BucketFit` with the buckets, their padding on the sample and the
        length-sorted lower bound.
    """
    cfg = config or BucketFitConfig()
    arr = _as_lengths(lengths)
    if arr.size == 0:
        raise ValueError("lengths is empty")
    if cfg.max_len is not None and arr.max() > cfg.max_len:
        i = int(arr.argmax())
        raise LengthOverflowError(f"lengths[{i}] = {int(arr[i])} exceeds max_len={cfg.max_len}")
    real = int(arr.sum())
    k_cap = cfg.num_buckets if cfg.num_buckets is not None else cfg.max_buckets
    curve = padded_token_curve(arr, k_cap)
    sorted_pad = _sorted_padding_tokens(arr, cfg.batch_size)
    if cfg.method == "dp":
        def cost_of(k: int) -> float:
            return float(curve[k - 1])
    else:
        kmeans_cost: dict[int, float] = {}

        def cost_of(k: int) -> float:
            if k not in kmeans_cost:
                kmeans_cost[k] = float(_bucket_padding_tokens(arr, kmeans_buckets(arr, k)))
            return kmeans_cost[k]

    if cfg.num_buckets is not None:
        k = cfg.num_buckets
    elif cfg.select == "lower_bound":
        target = (1.0 + cfg.slack) * sorted_pad
        k = next((k for k in range(1, k_cap + 1) if cost_of(k) <= target), k_cap)
    else:
        k = k_cap
        for cand in range(1, k_cap):
            if cost_of(cand) - cost_of(cand + 1) < cfg.min_gain * real:
                k = cand
                break
    buckets = optimal_buckets(arr, k) if cfg.method == "dp" else kmeans_buckets(arr, k)
    if cfg.max_len is not None and buckets.max_len < cfg.max_len:
        buckets = Buckets(boundaries=(*buckets.boundaries, cfg.max_len))
    return BucketFit(
        buckets=buckets,
        real_tokens=real,
        pad_tokens=_bucket_padding_tokens(arr, buckets),
        sorted_pad_tokens=sorted_pad,
        curve=tuple(float(c) for c in curve),
    )
