"""Collate that pads a batch to its bucket's length (never truncating silently), and one padded batch per bucket for warm-up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from torchlevers.bucketing.buckets import Buckets
from torchlevers.bucketing.lengths import LengthOverflowError

__all__ = ["BucketCollator", "CollateConfig", "shape_class_batches"]


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


def shape_class_batches(
    buckets: Buckets,
    *,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    pad_id: int = 0,
) -> list[dict[str, torch.Tensor]]:
    """One full padded batch per bucket: the shape classes a bucketed run produces.

    Feed them to a warm-up (``warmup.compile_and_warm``, or ``CompiledStep.warm``) so
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
