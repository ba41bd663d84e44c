"""Workloads by name: ``config_for(name, size, device)`` and ``build_workload``."""

from __future__ import annotations

from typing import Any, Literal, get_args, overload

from .decoder import DecoderConfig, DecoderWorkload
from .encoder import EncoderConfig, EncoderWorkload
from .segmentation import SegConfig, SegWorkload
from .sizes import Size, check_size

__all__ = ["WORKLOADS", "WorkloadConfig", "WorkloadName", "build_workload", "config_for"]

WorkloadName = Literal["encoder", "decoder", "segmentation"]
WORKLOADS: tuple[WorkloadName, ...] = get_args(WorkloadName)

WorkloadConfig = EncoderConfig | DecoderConfig | SegConfig

_CONFIGS: dict[str, type[EncoderConfig] | type[DecoderConfig] | type[SegConfig]] = {
    "encoder": EncoderConfig,
    "decoder": DecoderConfig,
    "segmentation": SegConfig,
}


@overload
def config_for(
    name: Literal["encoder"], size: Size = ..., device: str = ..., **overrides: Any
) -> EncoderConfig: ...
@overload
def config_for(
    name: Literal["decoder"], size: Size = ..., device: str = ..., **overrides: Any
) -> DecoderConfig: ...
@overload
def config_for(
    name: Literal["segmentation"], size: Size = ..., device: str = ..., **overrides: Any
) -> SegConfig: ...
@overload
def config_for(
    name: str, size: str = ..., device: str = ..., **overrides: Any
) -> WorkloadConfig: ...
def config_for(
    name: str, size: str = "tiny", device: str = "cpu", **overrides: Any
) -> WorkloadConfig:
    """The configuration of workload ``name`` at ``size`` on ``device``.

    Args:
        name: ``"encoder"``, ``"decoder"`` or ``"segmentation"``.
        size: ``"tiny"`` (CPU suite), ``"small"`` or ``"large"`` (one H200).
        device: a ``torch.device`` string; not checked for availability here.
        **overrides: fields to replace, e.g. ``extra_ffn_matmul=True``.

    Returns:
        An :class:`EncoderConfig`, :class:`DecoderConfig` or :class:`SegConfig`.

    Raises:
        ValueError: unknown name, size or field, or a bad value (the message names it).
    """
    try:
        cls = _CONFIGS[name]
    except KeyError:
        allowed = ", ".join(repr(n) for n in WORKLOADS)
        raise ValueError(f"workload name: expected one of {allowed}, got {name!r}") from None
    return cls.for_size(check_size(size), device=device, **overrides)


def build_workload(
    config: WorkloadConfig, **injected: Any
) -> EncoderWorkload | DecoderWorkload | SegWorkload:
    """Build the workload a config describes.

    Args:
        config: from :func:`config_for` or a config class.
        **injected: keyword arguments of that workload's constructor (``precision``,
            ``clip``, ``norm_factory``, ``optimizer_factory``, ``sync``, ...).

    Returns:
        The workload object, model on ``config.device``.
    """
    if isinstance(config, EncoderConfig):
        return EncoderWorkload(config, **injected)
    if isinstance(config, DecoderConfig):
        return DecoderWorkload(config, **injected)
    if isinstance(config, SegConfig):
        return SegWorkload(config, **injected)
    raise TypeError(f"build_workload: expected a workload config, got {type(config).__name__}")
