"""Profiler event fields read by their current names, with fallbacks to older torch spellings."""

from __future__ import annotations

from typing import Any

__all__ = ["read_event_field"]


# torch 2.4 renamed the CUDA-specific profiler fields to device-neutral ones (PR #123247);
# FunctionEventAvg in 2.13 has no ``self_cuda_time_total`` alias at all, older releases have
# only the CUDA names. Every read goes through these fallbacks, newest name first.
_FIELD_FALLBACKS: dict[str, tuple[str, ...]] = {
    "self_device_time_total": ("self_device_time_total", "self_cuda_time_total"),
    "device_time_total": ("device_time_total", "cuda_time_total"),
    "self_device_memory_usage": ("self_device_memory_usage", "self_cuda_memory_usage"),
    "device_memory_usage": ("device_memory_usage", "cuda_memory_usage"),
}


def read_event_field(event: Any, name: str, default: Any = 0) -> Any:
    """Read a profiler event field by its current name, falling back to older spellings.

    Args:
        event: a ``FunctionEvent``/``FunctionEventAvg`` (or anything with those attributes).
        name: the current (torch >= 2.4) field name, e.g. ``"self_device_time_total"``.
        default: returned when no spelling exists on the event.
    """
    for attr in _FIELD_FALLBACKS.get(name, (name,)):
        try:
            value = getattr(event, attr)
        except (AttributeError, NotImplementedError):
            continue
        if value is not None:
            return value
    return default
