"""Sequence lengths: the checks every bucketing function applies, and a query-like length distribution."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LengthOverflowError", "QueryLengthDistribution", "query_lengths"]


class LengthOverflowError(ValueError):
    """A sequence is longer than the last bucket (or the collate's maximum length)."""


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


def _is_int(value: object) -> bool:
    # bool is an int subclass; True is never a token count.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class QueryLengthDistribution:
    """Token lengths shaped like search queries: a log-normal body with a log-uniform long tail.

    The defaults match an e-commerce query log (mean 47 tokens, std 32, a tail to 512):
    most queries are short, a few are long, so padding every batch to its longest member
    wastes about two thirds of the positions at batch size 32, the waste length bucketing
    removes. The body's parameters are solved so that the whole mixture (body and tail)
    has ``mean_tokens`` and ``std_tokens``; rounding and clipping to
    ``[min_tokens, max_tokens]`` move them by well under a token.
    """

    mean_tokens: float = 47.0
    """Mean length of the mixture before rounding and clipping, in tokens."""
    std_tokens: float = 32.0
    """Standard deviation of the mixture before rounding and clipping, in tokens."""
    min_tokens: int = 2
    """Shortest length, in tokens (2 = the CLS token plus one word)."""
    max_tokens: int = 512
    """Longest length, in tokens; the tail reaches it and the body is clipped here."""
    tail_fraction: float = 0.005
    """Share of lengths drawn from the tail, in [0, 1); 0 gives a plain clipped log-normal."""
    tail_start_tokens: int = 128
    """Where the log-uniform tail ``[tail_start_tokens, max_tokens]`` starts, in tokens
    (below ``max_tokens``; not used when ``tail_fraction`` is 0)."""

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("mean_tokens", "std_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
                raise ValueError(f"{owner}.{name}: expected a number in (0.0, inf], got {value!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 1:
            raise ValueError(f"{owner}.min_tokens: expected an int >= 1, got {self.min_tokens!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < self.min_tokens:
            raise ValueError(
                f"{owner}.max_tokens: expected an int >= {self.min_tokens}, got {self.max_tokens!r}"
            )
        fraction = self.tail_fraction
        if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 <= fraction < 1):
            raise ValueError(f"{owner}.tail_fraction: expected a number in [0, 1), got {fraction!r}")
        start = self.tail_start_tokens
        if fraction > 0 and not (_is_int(start) and 1 <= start < self.max_tokens):
            raise ValueError(
                f"{owner}.tail_start_tokens: expected an int in [1, max_tokens={self.max_tokens}), "
                f"got {start!r} (or tail_fraction=0.0 for no tail)"
            )
        body_mean, body_var = self._body_moments()
        if body_mean <= 0 or body_var <= 0:
            raise ValueError(
                f"{owner}: mean_tokens={self.mean_tokens!r}, std_tokens={self.std_tokens!r} cannot "
                f"be reached with tail_fraction={fraction!r} on [{start}, {self.max_tokens}]"
            )

    def _tail_log_span(self) -> float:
        return math.log(self.max_tokens / self.tail_start_tokens)

    def _body_moments(self) -> tuple[float, float]:
        """Mean and variance of the body that give the mixture its mean and std."""
        f, mean, std = self.tail_fraction, self.mean_tokens, self.std_tokens
        if f == 0:
            return mean, std**2
        log_span = self._tail_log_span()
        lo, hi = self.tail_start_tokens, self.max_tokens
        tail_mean = (hi - lo) / log_span
        tail_m2 = (hi**2 - lo**2) / (2.0 * log_span)
        body_mean = (mean - f * tail_mean) / (1.0 - f)
        body_m2 = (std**2 + mean**2 - f * tail_m2) / (1.0 - f)
        return body_mean, body_m2 - body_mean**2

    @property
    def log_params(self) -> tuple[float, float]:
        """``(mu, sigma)`` of the normal under the log-normal body."""
        body_mean, body_var = self._body_moments()
        sigma2 = math.log1p(body_var / body_mean**2)
        return math.log(body_mean) - sigma2 / 2.0, math.sqrt(sigma2)

    def sample(self, n: int, *, seed: int = 0) -> list[int]:
        """Draw ``n`` lengths, deterministically for a given seed.

        Args:
            n: number of lengths (>= 0).
            seed: seed of numpy's ``default_rng``; the same seed gives the same list on
                every machine.

        Returns:
            ``n`` ints in ``[min_tokens, max_tokens]``.
        """
        if not _is_int(n) or n < 0:
            raise ValueError(f"QueryLengthDistribution.sample.n: expected an int >= 0, got {n!r}")
        mu, sigma = self.log_params
        rng = np.random.default_rng(seed)
        # Body first, then the tail's two draws: with a tail the stream is the one the
        # suite's padding budgets were measured on, so keep this order.
        lengths = rng.lognormal(mu, sigma, n)
        if self.tail_fraction > 0:
            tail = self.tail_start_tokens * np.exp(rng.random(n) * self._tail_log_span())
            in_tail = rng.random(n) < self.tail_fraction
            lengths = np.where(in_tail, tail, lengths)
        clipped = np.clip(np.rint(lengths), self.min_tokens, self.max_tokens)
        return [int(v) for v in clipped.astype(np.int64)]


def query_lengths(n: int, *, seed: int = 0, max_tokens: int = 512) -> list[int]:
    """``n`` query-like lengths with the default distribution (mean 47, std 32, tail to ``max_tokens``)."""
    return QueryLengthDistribution(max_tokens=max_tokens).sample(n, seed=seed)
