"""Vocabulary-bound normalisation of hashed ids: map arbitrary int64 ids into [0, vocab_size) deterministically, keeping reserved ids for padding and unknown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = ["IdSpace", "check_ids", "normalize_ids"]

# Mersenne prime 2**31 - 1: residues fit 31 bits, so a product of two fits int64 exactly.
_P = (1 << 31) - 1
# An id is hashed as three limbs of 21, 21 and 22 (signed) bits: each below _P, so distinct ids give
# distinct limb tuples (two words reduced mod _P would not: x and x + _P share a residue).
_LIMB = 21
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    # Exact Python-int version, only to derive the hash constants from a seed.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@dataclass(frozen=True, kw_only=True)
class IdSpace:
    """Target id range of an embedding table and how raw ids are folded into it."""

    vocab_size: int
    """Rows of the embedding table; every output id is in [0, vocab_size)."""
    num_reserved: int = 2
    """Ids [0, num_reserved) are never produced by folding: kept for pad/unknown/specials
    (0: none; then neither ``input_pad`` nor ``input_unknown`` can be given)."""
    pad_id: int = 0
    """Output id for padding positions (must be reserved; unchecked when nothing is reserved)."""
    unk_id: int = 1
    """Output id for unknown/missing values (must be reserved; unchecked when nothing is reserved)."""
    method: Literal["hash", "modulo"] = "hash"
    """"hash": a seeded universal hash then modulo, so structured ids (multiples of the
    vocabulary size, sequential ranges) spread evenly; "modulo": floor modulo of the raw
    id (keeps ids already in range distinct and ordered; structured ids collide)."""
    seed: int = 0
    """"hash" only: picks the hash function; the same seed always gives the same mapping."""
    input_pad: int | None = None
    """Raw value that marks padding in the input (e.g. -1 or 0); mapped to ``pad_id``
    instead of being hashed into a real row."""
    input_unknown: int | None = None
    """Raw value that marks a missing feature; mapped to ``unk_id``."""

    def __post_init__(self) -> None:
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int):
            raise ValueError(f"vocab_size must be an int, got {self.vocab_size!r}")
        if not 0 <= self.num_reserved < self.vocab_size:
            raise ValueError(
                f"num_reserved must be in [0, vocab_size={self.vocab_size}), got {self.num_reserved!r}"
            )
        if self.vocab_size - self.num_reserved > _P:
            raise ValueError(f"vocab_size - num_reserved must be <= {_P}, got {self.vocab_size - self.num_reserved}")
        for name, marker in (("pad_id", "input_pad"), ("unk_id", "input_unknown")):
            v = getattr(self, name)
            if not 0 <= v < self.num_reserved and (self.num_reserved or getattr(self, marker) is not None):
                raise ValueError(f"{name} must be a reserved id in [0, num_reserved={self.num_reserved}) "
                                 f"(for {marker}), got {v!r}")
        if self.num_reserved >= 2 and self.pad_id == self.unk_id:
            raise ValueError(f"pad_id and unk_id must differ, both are {self.pad_id!r}")
        if self.method not in ("hash", "modulo"):
            raise ValueError(f"method must be one of 'hash', 'modulo', got {self.method!r}")
        if self.input_pad is not None and self.input_pad == self.input_unknown:
            raise ValueError(f"input_pad and input_unknown must differ, both are {self.input_pad!r}")

    @property
    def num_buckets(self) -> int:
        """Ids available to real values (vocab_size - num_reserved)."""
        return self.vocab_size - self.num_reserved

    def _constants(self) -> tuple[int, int, int, int]:
        """The hash's three limb coefficients (non-zero) and its offset, from the seed."""
        a = [_splitmix64(self.seed * 4 + i) % (_P - 1) + 1 for i in (1, 2, 3)]
        return a[0], a[1], a[2], _splitmix64(self.seed * 4 + 4) % _P


def _as_int_ids(ids: Any, name: str) -> torch.Tensor:
    t = ids if isinstance(ids, torch.Tensor) else torch.as_tensor(ids)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(
            f"{name} must be an integer tensor, got dtype {t.dtype}: hashed ids stored as floats "
            "have already lost bits (fp32 is exact only below 2**24, fp16 below 2**11), "
            "so distinct ids collide; keep them int64 end to end"
        )
    return t.to(torch.int64)


def normalize_ids(ids: Any, space: IdSpace) -> torch.Tensor:
    """Fold raw (hashed) ids into ``space``.

    Args:
        ids: integer tensor (or nested list) of any shape and value, negative included.
        space: the target :class:`IdSpace`.

    Returns:
        int64 tensor of the same shape, every value in [0, vocab_size); real
        values land in [num_reserved, vocab_size), ``input_pad`` positions in
        ``pad_id`` and ``input_unknown`` positions in ``unk_id``. Deterministic
        across runs, devices and processes (integer arithmetic only).
    """
    h = _as_int_ids(ids, "ids")
    m = space.num_buckets
    if space.method == "modulo":
        # remainder is floor-mod: non-negative for negative ids, unlike C's % or torch.fmod.
        folded = torch.remainder(h, m)
    else:
        a1, a2, a3, b = space._constants()
        limb = (1 << _LIMB) - 1
        hi = torch.remainder(h >> (2 * _LIMB), _P)  # arithmetic shift: the signed top 22 bits
        mid = (h >> _LIMB) & limb
        lo = h & limb
        # Each product < 2**62: exact in int64. ((a1*hi + a2*mid + a3*lo + b) mod p) is a universal hash
        # of the limb tuple, and distinct ids have distinct tuples.
        x = torch.remainder(hi * a1, _P) + mid * a2 % _P + lo * a3 % _P + b
        folded = torch.remainder(torch.remainder(x, _P), m)
    out = folded + space.num_reserved
    if space.input_pad is not None:
        out = torch.where(h == space.input_pad, torch.full_like(out, space.pad_id), out)
    if space.input_unknown is not None:
        out = torch.where(h == space.input_unknown, torch.full_like(out, space.unk_id), out)
    return out


def check_ids(ids: Any, vocab_size: int, *, name: str = "ids") -> None:
    """Raise if any id is outside [0, vocab_size), naming the first bad position and value.

    An out-of-range index fails inside ``nn.Embedding`` with an opaque message
    (a device-side assert on CUDA); checking at the data boundary says which
    sample is wrong. One host sync.
    """
    t = _as_int_ids(ids, name)
    if t.numel() == 0:
        return
    bad = (t < 0) | (t >= vocab_size)
    if bool(bad.any()):
        pos = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}{list(pos)} = {int(t[pos])} is outside [0, {vocab_size})")
