"""The segmentation training step: shapes, channels_last, grouped convs, learning, determinism."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from torchlevers.workloads import SegWorkload, config_for


def tiny(**overrides: Any) -> SegWorkload:
    return SegWorkload(config_for("segmentation", "tiny", **overrides))


def test_shapes() -> None:
    w = tiny()
    batch = w.make_batch()
    cfg = w.config
    size = cfg.image_size
    assert batch.images.shape == (cfg.batch_size, cfg.in_channels, size, size)
    assert batch.masks.shape == (cfg.batch_size, size, size)
    assert batch.num_samples == w.samples_per_step
    assert batch.num_pixels == w.pixels_per_step
    assert w.model(batch.images).shape == (cfg.batch_size, cfg.n_classes, size, size)


def _conv_layouts(w: SegWorkload) -> list[tuple[str, bool, bool, int]]:
    """(name, weight channels_last, output channels_last, groups) of every convolution."""
    seen: list[tuple[str, bool, bool, int]] = []
    handles = []
    for name, m in w.model.named_modules():
        if isinstance(m, nn.Conv2d):

            def hook(mod: nn.Module, args: object, out: torch.Tensor, name: str = name) -> None:
                assert isinstance(mod, nn.Conv2d)
                seen.append(
                    (
                        name,
                        mod.weight.is_contiguous(memory_format=torch.channels_last),
                        out.is_contiguous(memory_format=torch.channels_last),
                        mod.groups,
                    )
                )

            handles.append(m.register_forward_hook(hook))
    try:
        w.step(w.make_batch())
    finally:
        for h in handles:
            h.remove()
    return seen


def test_channels_last_is_used_end_to_end() -> None:
    w = tiny()
    assert w.make_batch().images.is_contiguous(memory_format=torch.channels_last)
    layouts = _conv_layouts(w)
    assert len(layouts) >= 10
    assert all(weight_cl and out_cl for _, weight_cl, out_cl, _ in layouts), layouts
    assert {g for *_, g in layouts} >= {1, w.config.groups}  # grouped convs are there


def test_contiguous_variant_is_really_nchw() -> None:
    w = tiny(memory_format="contiguous")
    assert not w.make_batch().images.is_contiguous(memory_format=torch.channels_last)
    assert not any(out_cl for _, _, out_cl, _ in _conv_layouts(w))


def test_module_names() -> None:
    names = dict(tiny().model.named_modules())
    for name in (
        "stem.conv",
        "down.0.grouped.conv",
        "down.2.shortcut.pool",
        "up.0.fuse.bn",
        "up.2.refine.conv",
        "head",
    ):
        assert name in names, name
    assert names["down.0.grouped.conv"].groups == 4


def test_loss_decreases_and_is_deterministic() -> None:
    a, b = tiny(), tiny()
    batch = a.make_batch()
    losses_a = [float(a.step(batch)) for _ in range(6)]
    losses_b = [float(b.step(b.make_batch())) for _ in range(6)]
    assert losses_a == losses_b
    assert losses_a[-1] < 0.8 * losses_a[0], losses_a


@pytest.mark.parametrize("base_channels", [4, 8, 12])
def test_narrow_stems_train(base_channels: int) -> None:
    # Narrow first stages once crashed a strided 1x1 convolution's backward on CPU.
    w = tiny(base_channels=base_channels, groups=2)
    assert torch.isfinite(w.step(w.make_batch()))
