"""Length bucketing: offline bucket fitting, a JSON bucket file, a streaming bucketed batch sampler, a padding collate and padding-rate accounting."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = [
    "BUCKET_FILE_FORMAT",
    "BUCKET_FILE_VERSION",
    "BatchPlan",
    "BucketBatchSampler",
    "BucketCollator",
    "BucketFileError",
    "BucketFit",
    "BucketFitConfig",
    "Buckets",
    "CollateConfig",
    "LengthOverflowError",
    "PaddingStats",
    "fit_buckets",
    "kmeans_buckets",
    "load_buckets",
    "optimal_buckets",
    "pad_batches",
    "padded_token_curve",
    "padding_stats",
    "plan_bucketed",
    "plan_sorted",
    "plan_static",
    "save_buckets",
    "shape_class_batches",
    "skewed_lengths",
]

BUCKET_FILE_FORMAT = "perfbudget.buckets"
BUCKET_FILE_VERSION = 1


class LengthOverflowError(ValueError):
    """A sequence is longer than the last bucket (or the collate's maximum length)."""


class BucketFileError(ValueError):
    """A bucket JSON file is unreadable or invalid; the message names file, key and value."""


# --------------------------------------------------------------------------- lengths


def skewed_lengths(
    n: int,
    *,
    seed: int = 0,
    mean: float = 47.0,
    std: float = 32.0,
    max_len: int = 512,
    tail_fraction: float = 0.005,
    tail_start: int = 128,
) -> np.ndarray:
    """Sample token lengths shaped like short search queries with a long tail.

    A mixture of a log-normal body and a log-uniform tail on
    ``[tail_start, max_len]``; the body's parameters are solved so that the
    mixture has the requested mean and standard deviation (before rounding and
    clipping to ``[1, max_len]``, which move them by well under a token).

    Args:
        n: number of lengths.
        seed: seed of the numpy ``Generator``; the same seed gives the same lengths.
        mean: target mean length (tokens).
        std: target standard deviation (tokens).
        max_len: longest length (tokens); the tail reaches it.
        tail_fraction: share of samples drawn from the tail.
        tail_start: where the tail starts (tokens).

    Returns:
        int64 array of ``n`` lengths in ``[1, max_len]``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    if not 0.0 <= tail_fraction < 1.0:
        raise ValueError(f"tail_fraction must be in [0, 1), got {tail_fraction!r}")
    if not 1 <= tail_start < max_len:
        raise ValueError(f"tail_start must be in [1, max_len={max_len}), got {tail_start!r}")
    log_span = math.log(max_len / tail_start)
    tail_mean = (max_len - tail_start) / log_span
    tail_m2 = (max_len**2 - tail_start**2) / (2.0 * log_span)
    body_mean = (mean - tail_fraction * tail_mean) / (1.0 - tail_fraction)
    body_m2 = (std**2 + mean**2 - tail_fraction * tail_m2) / (1.0 - tail_fraction)
    body_var = body_m2 - body_mean**2
    if body_mean <= 0 or body_var <= 0:
        raise ValueError(
            f"mean={mean!r}, std={std!r} cannot be reached with tail_fraction={tail_fraction!r}"
        )
    sigma2 = math.log1p(body_var / body_mean**2)
    mu = math.log(body_mean) - sigma2 / 2.0
    rng = np.random.default_rng(seed)
    body = rng.lognormal(mu, math.sqrt(sigma2), n)
    tail = tail_start * np.exp(rng.random(n) * log_span)
    in_tail = rng.random(n) < tail_fraction
    lengths = np.where(in_tail, tail, body)
    return np.clip(np.rint(lengths), 1, max_len).astype(np.int64)


def _as_lengths(lengths: Sequence[int] | np.ndarray, what: str = "lengths") -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        i = int(arr.argmin())
        raise ValueError(f"{what}[{i}] is negative: {int(arr[i])}")
    return arr


# --------------------------------------------------------------------------- buckets


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
    """Result of :func:`fit_buckets`: the buckets and the numbers behind the choice."""

    buckets: Buckets
    real_tokens: int
    """Tokens in the length sample."""
    pad_tokens: int
    """Pad tokens the chosen buckets add on the sample (pad to bucket max)."""
    sorted_pad_tokens: int
    """Pad tokens of length-sorted batching at ``config.batch_size`` (the lower bound)."""
    curve: tuple[float, ...] = field(repr=False)
    """Padded tokens per bucket count 1..max_buckets (the DP optimum; the elbow plot)."""

    @property
    def padding_rate(self) -> float:
        """Padded / total tokens with the chosen buckets."""
        return self.pad_tokens / max(1, self.pad_tokens + self.real_tokens)

    @property
    def sorted_padding_rate(self) -> float:
        """Padded / total tokens of length-sorted batching (the lower bound)."""
        return self.sorted_pad_tokens / max(1, self.sorted_pad_tokens + self.real_tokens)


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


# --------------------------------------------------------------------------- JSON


def save_buckets(buckets: Buckets, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None) -> None:
    """Write buckets to a versioned JSON file, atomically (write then rename).

    Args:
        buckets: the boundaries to save.
        path: destination file.
        meta: optional JSON-serialisable provenance (sample size, padding rate, date...).
    """
    doc: dict[str, Any] = {
        "format": BUCKET_FILE_FORMAT,
        "version": BUCKET_FILE_VERSION,
        "boundaries": [int(b) for b in buckets.boundaries],
    }
    if meta is not None:
        doc["meta"] = dict(meta)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_buckets(path: str | os.PathLike[str]) -> Buckets:
    """Read and validate a bucket file written by :func:`save_buckets`.

    Raises:
        BucketFileError: naming the file, the key and the offending value.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BucketFileError(f"{p}: cannot read bucket file: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BucketFileError(
            f"{p}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"
        ) from exc
    if not isinstance(doc, dict):
        raise BucketFileError(f"{p}: expected a JSON object at the top level, got {type(doc).__name__}")
    allowed = {"format", "version", "boundaries", "meta"}
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise BucketFileError(f"{p}: {unknown[0]}: unknown key (allowed: {', '.join(sorted(allowed))})")
    for key in ("format", "version", "boundaries"):
        if key not in doc:
            raise BucketFileError(f"{p}: {key}: missing required key")
    if doc["format"] != BUCKET_FILE_FORMAT:
        raise BucketFileError(f"{p}: format: expected {BUCKET_FILE_FORMAT!r}, got {doc['format']!r}")
    version = doc["version"]
    if isinstance(version, bool) or version != BUCKET_FILE_VERSION:
        raise BucketFileError(
            f"{p}: version: unsupported version {version!r} (this perfbudget reads {BUCKET_FILE_VERSION})"
        )
    bounds = doc["boundaries"]
    if not isinstance(bounds, list):
        raise BucketFileError(f"{p}: boundaries: expected a list of integers, got {bounds!r}")
    try:
        _check_boundaries(bounds, where="boundaries")
    except ValueError as exc:
        raise BucketFileError(f"{p}: {exc}") from None
    if "meta" in doc and not isinstance(doc["meta"], dict):
        raise BucketFileError(f"{p}: meta: expected a JSON object, got {doc['meta']!r}")
    return Buckets(boundaries=tuple(bounds))


# --------------------------------------------------------------------------- sampler


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


# --------------------------------------------------------------------------- collate


@dataclass(frozen=True, kw_only=True)
class CollateConfig:
    """How :class:`BucketCollator` pads a batch."""

    pad_id: int = 0
    """Token id written into pad positions. The attention mask comes from lengths,
    never from ``ids != pad_id``, so a real token equal to ``pad_id`` stays visible."""
    pad_to: Literal["bucket_max", "batch_max"] = "bucket_max"
    """"bucket_max": pad to the bucket's upper length (one shape per bucket: compiles and
    CUDA graphs see few shapes); "batch_max": pad to the longest sequence in the batch."""
    overflow: Literal["error", "truncate"] = "error"
    """A sequence longer than ``max_len`` (or the last bucket): "error" raises naming it;
    "truncate" cuts it and counts the cut tokens in ``truncated_tokens``."""
    max_len: int | None = None
    """Longest allowed sequence (tokens); None: the last bucket (or unlimited without buckets)."""
    key: str = "input_ids"
    """Key of the token sequence when samples are mappings."""

    def __post_init__(self) -> None:
        if self.pad_to not in ("bucket_max", "batch_max"):
            raise ValueError(f"pad_to must be one of 'bucket_max', 'batch_max', got {self.pad_to!r}")
        if self.overflow not in ("error", "truncate"):
            raise ValueError(f"overflow must be one of 'error', 'truncate', got {self.overflow!r}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len must be >= 1 or None, got {self.max_len!r}")


def _to_long_1d(seq: Any, where: str) -> torch.Tensor:
    t = seq if isinstance(seq, torch.Tensor) else torch.as_tensor(seq)
    if t.dim() != 1:
        raise ValueError(f"{where}: expected a 1-D token sequence, got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{where}: expected integer token ids, got dtype {t.dtype}")
    return t.to(torch.long)


class BucketCollator:
    """Collate a list of samples into one padded batch (all samples, never a subset).

    A sample is a token sequence (list, tuple or 1-D tensor) or a mapping with
    ``config.key`` holding it; other mapping keys are stacked (tensors) or
    turned into tensors (numbers) under the same key.

    Returns a dict with ``input_ids`` (B, L) long, ``attention_mask`` (B, L)
    long, ``lengths`` (B,) kept tokens per sample, ``truncated_tokens`` (B,)
    tokens cut by an explicit truncate policy (zeros otherwise), plus the
    extra keys.
    """

    def __init__(self, buckets: Buckets | None = None, config: CollateConfig | None = None) -> None:
        """
        Args:
            buckets: bucket boundaries for ``pad_to="bucket_max"``; None pads to the batch max.
            config: padding options; defaults to :class:`CollateConfig()`.
        """
        self.buckets = buckets
        self.config = config or CollateConfig()
        limit = self.config.max_len
        if buckets is not None:
            limit = buckets.max_len if limit is None else min(limit, buckets.max_len)
        self.max_len = limit

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        cfg = self.config
        if len(samples) == 0:
            raise ValueError("cannot collate an empty batch")
        seqs: list[torch.Tensor] = []
        extras: dict[str, list[Any]] = {}
        for i, s in enumerate(samples):
            if isinstance(s, Mapping):
                if cfg.key not in s:
                    raise KeyError(f"sample {i}: missing key {cfg.key!r} (keys: {sorted(s)})")
                seqs.append(_to_long_1d(s[cfg.key], f"sample {i}[{cfg.key!r}]"))
                for k, v in s.items():
                    if k != cfg.key:
                        extras.setdefault(k, []).append(v)
            else:
                seqs.append(_to_long_1d(s, f"sample {i}"))
        raw = [len(t) for t in seqs]
        truncated = [0] * len(seqs)
        if self.max_len is not None:
            for i, n in enumerate(raw):
                if n > self.max_len:
                    if cfg.overflow == "error":
                        raise LengthOverflowError(
                            f"sample {i} has {n} tokens, more than max_len={self.max_len}; "
                            "refit the buckets with a larger max_len or set overflow='truncate' "
                            "to cut explicitly"
                        )
                    truncated[i] = n - self.max_len
                    seqs[i] = seqs[i][: self.max_len]
        kept = [len(t) for t in seqs]
        longest = max(kept)
        if cfg.pad_to == "bucket_max" and self.buckets is not None:
            # A batch that mixes buckets (e.g. from a plain sampler) pads to the largest one.
            width = self.buckets.padded_length(longest)
        else:
            width = longest
        width = max(width, 1)
        ids = torch.full((len(seqs), width), cfg.pad_id, dtype=torch.long)
        for i, t in enumerate(seqs):
            ids[i, : len(t)] = t
        lengths = torch.tensor(kept, dtype=torch.long)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        out: dict[str, torch.Tensor] = {
            "input_ids": ids,
            "attention_mask": mask,
            "lengths": lengths,
            "truncated_tokens": torch.tensor(truncated, dtype=torch.long),
        }
        for k, vals in extras.items():
            if k in out:
                raise ValueError(f"sample key {k!r} clashes with a collated output key")
            if len(vals) != len(samples):
                raise KeyError(f"key {k!r} is present in {len(vals)} of {len(samples)} samples")
            out[k] = torch.stack(vals) if isinstance(vals[0], torch.Tensor) else torch.as_tensor(vals)
        return out


# --------------------------------------------------------------------------- accounting


@dataclass(frozen=True)
class PaddingStats:
    """Token accounting of padded batches."""

    real_tokens: int
    """Tokens that carry data."""
    pad_tokens: int
    """Pad positions added."""

    @property
    def total_tokens(self) -> int:
        """Positions the model computes on (real + pad)."""
        return self.real_tokens + self.pad_tokens

    @property
    def padding_rate(self) -> float:
        """Pad tokens / total tokens, in [0, 1)."""
        return self.pad_tokens / self.total_tokens if self.total_tokens else 0.0

    def __add__(self, other: PaddingStats) -> PaddingStats:
        return PaddingStats(self.real_tokens + other.real_tokens, self.pad_tokens + other.pad_tokens)


def padding_stats(batch: Mapping[str, torch.Tensor]) -> PaddingStats:
    """Padding of one collated batch (uses its ``attention_mask``)."""
    mask = batch["attention_mask"]
    real = int(mask.sum())
    return PaddingStats(real_tokens=real, pad_tokens=int(mask.numel()) - real)


@dataclass(frozen=True)
class BatchPlan:
    """Which samples go together and the length each batch is padded to: one batching strategy over a dataset."""

    strategy: Literal["static", "sorted", "bucketed"]
    batches: tuple[tuple[int, ...], ...]
    """Dataset indices per batch."""
    padded_lens: tuple[int, ...]
    """Sequence length (tokens) each batch is padded to."""

    def padding(self, lengths: Sequence[int] | np.ndarray) -> PaddingStats:
        """Padding of the whole plan for the given per-index lengths."""
        arr = _as_lengths(lengths)
        real = sum(int(arr[list(b)].sum()) for b in self.batches)
        total = sum(len(b) * w for b, w in zip(self.batches, self.padded_lens, strict=True))
        return PaddingStats(real_tokens=real, pad_tokens=total - real)

    @property
    def num_samples(self) -> int:
        """Samples covered by the plan."""
        return sum(len(b) for b in self.batches)


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
    return BatchPlan("static", batches, tuple(max_len for _ in batches))


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
    return BatchPlan("sorted", tuple(batches), tuple(widths))


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
    return BatchPlan("bucketed", batches, widths)


def shape_class_batches(
    buckets: Buckets,
    *,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    pad_id: int = 0,
) -> list[dict[str, torch.Tensor]]:
    """One full padded batch per bucket: the shape classes a bucketed run produces.

    Feed them to a warm-up (``warmup.warm_up`` / ``warmup.compile_and_warm``) so
    every bucket shape is compiled before anything is measured. Token ids are
    ``pad_id`` and the mask is all ones (content does not matter for shapes).
    """
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("give exactly one of batch_size or max_tokens")
    out = []
    for width in buckets.boundaries:
        rows = batch_size if batch_size is not None else max(1, (max_tokens or 0) // width)
        out.append(
            {
                "input_ids": torch.full((rows, width), pad_id, dtype=torch.long),
                "attention_mask": torch.ones((rows, width), dtype=torch.long),
                "lengths": torch.full((rows,), width, dtype=torch.long),
            }
        )
    return out


def pad_batches(
    sequences: Sequence[Sequence[int] | torch.Tensor], plan: BatchPlan, *, pad_id: int = 0
) -> Iterator[dict[str, torch.Tensor]]:
    """Materialise a plan: yield ``input_ids``/``attention_mask`` batches padded to the plan's widths.

    Lets a throughput comparison feed the *same* samples through static, sorted
    and bucketed batching.
    """
    for batch, width in zip(plan.batches, plan.padded_lens, strict=True):
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        lengths = torch.empty(len(batch), dtype=torch.long)
        for row, idx in enumerate(batch):
            t = _to_long_1d(sequences[idx], f"sequences[{idx}]")
            if len(t) > width:
                raise LengthOverflowError(f"sequences[{idx}] has {len(t)} tokens, plan pads to {width}")
            ids[row, : len(t)] = t
            lengths[row] = len(t)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        yield {"input_ids": ids, "attention_mask": mask, "lengths": lengths}
