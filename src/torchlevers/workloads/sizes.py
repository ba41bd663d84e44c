"""The size knob shared by every workload, and the field checks their configs use."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar, cast, get_args

import torch

__all__ = ["SIZES", "Size", "check_size"]

Size = Literal["tiny", "small", "large"]
"""How big a workload is built.

- ``tiny``: a training step of ~5-40 ms on one CPU thread; what the CPU suite and
  the unit tests run.
- ``small``: a few times ``tiny``; for multi-threaded CPU runs and quick GPU checks.
- ``large``: sized for one H200 (BERT-base / GPT-2-small geometry); far too slow on
  a small CPU.
"""

SIZES: tuple[Size, ...] = get_args(Size)


def check_size(size: object) -> Size:
    """Return ``size`` if it is one of :data:`SIZES`.

    Raises:
        ValueError: naming the bad value and the allowed ones.
    """
    if size not in SIZES:
        allowed = ", ".join(repr(s) for s in SIZES)
        raise ValueError(f"size: expected one of {allowed}, got {size!r}")
    return cast(Size, size)


# --- field checks for the configs' __post_init__ ------------------------------------------
# Every message has the form "<Owner>.<field>: expected ..., got <value>" so a bad value in
# a budget file or a test parameter is found without reading a traceback.


def _where(owner: str, field: str) -> str:
    return f"{owner}.{field}"


def check_int(owner: str, field: str, value: object, *, minimum: int = 1) -> None:
    """Raise ``ValueError`` unless ``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{_where(owner, field)}: expected an int >= {minimum}, got {value!r}")


def check_float(
    owner: str,
    field: str,
    value: object,
    *,
    low: float,
    high: float,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise ``ValueError`` unless ``value`` is a real number in the given interval."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = (v >= low if low_inclusive else v > low) and (
            v <= high if high_inclusive else v < high
        )
    if not ok:
        lo = "[" if low_inclusive else "("
        hi = "]" if high_inclusive else ")"
        raise ValueError(
            f"{_where(owner, field)}: expected a number in {lo}{low}, {high}{hi}, got {value!r}"
        )


def check_choice(owner: str, field: str, value: object, allowed: Iterable[object]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        names = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{_where(owner, field)}: expected one of {names}, got {value!r}")


def check_bool(owner: str, field: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is a bool (an int 0/1 is a likely typo)."""
    if not isinstance(value, bool):
        raise ValueError(f"{_where(owner, field)}: expected True or False, got {value!r}")


def check_divisible(owner: str, field: str, value: int, by: int, by_name: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a multiple of ``by``."""
    if value % by:
        raise ValueError(
            f"{_where(owner, field)}: expected a multiple of {by_name} ({by}), got {value!r}"
        )


def check_device(owner: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` parses as a ``torch.device`` string.

    Availability is not checked here: a config may describe a GPU run on a CPU host
    (to print it, or to key a budget); the workload checks availability when built.
    """
    if not isinstance(value, str):
        raise ValueError(
            f"{_where(owner, 'device')}: expected a device string such as 'cpu' or 'cuda:0', "
            f"got {value!r}"
        )
    try:
        torch.device(value)
    except RuntimeError as exc:
        raise ValueError(
            f"{_where(owner, 'device')}: expected a device string such as 'cpu' or 'cuda:0', "
            f"got {value!r} ({exc})"
        ) from None


C = TypeVar("C")


def preset_with_overrides(
    cls: type[C], preset: Mapping[str, Any], device: str, overrides: Mapping[str, Any]
) -> C:
    """Build config class ``cls`` from a size preset, the device and field overrides.

    Raises:
        ValueError: an override names no field of ``cls`` (the known ones are listed),
            or the resulting config fails its own checks.
    """
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"{cls.__name__}: unknown field(s) {unknown}; known: {', '.join(sorted(fields))}"
        )
    return cls(**{**preset, "device": device, **overrides})
