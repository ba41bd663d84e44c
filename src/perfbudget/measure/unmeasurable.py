"""The typed answer "this cannot be measured here", with the reason; never replaced by an estimate."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Unmeasurable"]


@dataclass(frozen=True, kw_only=True)
class Unmeasurable:
    """A measurement (or the device state it needs) is not available on this machine; returned in place
    of a value, and falsy, so ``if not got: skip(got.reason)`` reads naturally."""

    reason: str
    """Why, in one sentence that names what is missing (no RAPL, no NVML, a GPU before Hopper...)."""

    def __bool__(self) -> bool:
        return False
