"""A small convolutional encoder-decoder for per-pixel segmentation, and its training step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data import SegBatch, class_palette, synthetic_segmentation
from .sizes import (
    Size,
    check_choice,
    check_device,
    check_divisible,
    check_float,
    check_int,
    check_size,
    preset_with_overrides,
)
from .training import (
    GradClipper,
    OptimizerFactory,
    PrecisionArg,
    TrainingWorkload,
    resolve_device,
    seeded,
)

__all__ = ["MemoryFormat", "SegConfig", "SegNet", "SegWorkload"]

MemoryFormat = Literal["channels_last", "contiguous"]

_MEMORY_FORMATS: dict[str, torch.memory_format] = {
    "channels_last": torch.channels_last,
    "contiguous": torch.contiguous_format,
}


@dataclass(frozen=True, kw_only=True)
class SegConfig:
    """Geometry, default batch shape and optimiser of the segmentation workload."""

    in_channels: int = 3
    """Image channels."""
    n_classes: int = 4
    """Classes per pixel, background included."""
    image_size: int = 64
    """Height and width of the images, in pixels; a multiple of ``2 ** depth``."""
    base_channels: int = 16
    """Channels of the first stage; stage ``i`` has ``base_channels * 2 ** i``."""
    depth: int = 3
    """Downsampling stages (each halves the resolution)."""
    groups: int = 4
    """Groups of the 3x3 convolutions in every stage (ResNeXt-style); must divide every
    stage's channel count."""
    memory_format: MemoryFormat = "channels_last"
    """Layout of weights and activations. ``channels_last`` (NHWC) is what cuDNN and
    oneDNN convolutions prefer; ``contiguous`` (NCHW) is there to measure the difference."""
    batch_size: int = 2
    """Images in the default batch."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW decoupled weight decay."""
    seed: int = 0
    """Seed of the weights and of the default batch."""
    device: str = "cpu"
    """Where the workload runs, as a ``torch.device`` string."""

    def __post_init__(self) -> None:
        o = type(self).__name__
        for name in ("in_channels", "image_size", "base_channels", "depth", "groups", "batch_size"):
            check_int(o, name, getattr(self, name))
        check_int(o, "n_classes", self.n_classes, minimum=2)
        check_divisible(o, "image_size", self.image_size, 2**self.depth, "2 ** depth")
        check_divisible(o, "base_channels", self.base_channels, self.groups, "groups")
        check_choice(o, "memory_format", self.memory_format, tuple(_MEMORY_FORMATS))
        check_float(o, "lr", self.lr, low=0.0, high=math.inf, low_inclusive=False)
        check_float(o, "weight_decay", self.weight_decay, low=0.0, high=math.inf)
        check_int(o, "seed", self.seed, minimum=0)
        check_device(o, self.device)

    @property
    def torch_memory_format(self) -> torch.memory_format:
        """:attr:`memory_format` as a ``torch.memory_format``."""
        return _MEMORY_FORMATS[self.memory_format]

    @classmethod
    def for_size(cls, size: Size, *, device: str = "cpu", **overrides: Any) -> SegConfig:
        """The preset for ``size`` on ``device``, with ``overrides`` replacing fields.

        Raises:
            ValueError: unknown size, unknown field in ``overrides``, or a bad value.
        """
        return preset_with_overrides(cls, _SEG_PRESETS[check_size(size)], device, overrides)


_SEG_PRESETS: dict[str, dict[str, Any]] = {
    # Sized for one CPU thread: tens of milliseconds per training step.
    "tiny": {},
    "small": dict(image_size=128, base_channels=32, batch_size=8, groups=8),
    # 512 channels at the bottleneck in groups of 64, the shape the grouped-conv
    # occupancy fix is about.
    "large": dict(image_size=512, base_channels=64, groups=8, batch_size=16, n_classes=21),
}


class ConvBNAct(nn.Sequential):
    """Convolution (no bias: BatchNorm follows), BatchNorm, ReLU; names ``conv``, ``bn``, ``act``."""

    def __init__(
        self, c_in: int, c_out: int, *, kernel: int = 3, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            c_in, c_out, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False
        )
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.ReLU()


class GroupedBlock(nn.Module):
    """ResNeXt-style bottleneck: 1x1 reduce, grouped 3x3 (optionally strided), 1x1 expand, residual.

    Names: ``reduce``, ``grouped``, ``expand`` (each ``conv``/``bn``/``act``) and
    ``shortcut`` (``pool``, ``conv``, ``bn``: a 2x2 average pool and 1x1 projection when
    the shape changes).
    """

    def __init__(self, c_in: int, c_out: int, *, stride: int, groups: int) -> None:
        super().__init__()
        self.reduce = ConvBNAct(c_in, c_out, kernel=1)
        self.grouped = ConvBNAct(c_out, c_out, stride=stride, groups=groups)
        self.expand = nn.Sequential()
        self.expand.add_module("conv", nn.Conv2d(c_out, c_out, 1, bias=False))
        self.expand.add_module("bn", nn.BatchNorm2d(c_out))
        self.shortcut: nn.Module
        if stride != 1 or c_in != c_out:
            # Average-pool then a stride-1 1x1 conv (ResNet-D), not a strided 1x1 conv:
            # it sees every input pixel, and the strided 1x1 weight gradient crashes the
            # process (SIGSEGV) in torch 2.13 on CPU for channels_last inputs with 4-12
            # channels.
            self.shortcut = nn.Sequential()
            if stride != 1:
                self.shortcut.add_module("pool", nn.AvgPool2d(stride, ceil_mode=True))
            self.shortcut.add_module("conv", nn.Conv2d(c_in, c_out, 1, bias=False))
            self.shortcut.add_module("bn", nn.BatchNorm2d(c_out))
        else:
            self.shortcut = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.expand(self.grouped(self.reduce(x))) + self.shortcut(x))


class UpBlock(nn.Module):
    """Bilinear 2x upsampling, concatenation with the skip, then ``fuse`` (1x1) and ``refine`` (grouped 3x3)."""

    def __init__(self, c_in: int, c_skip: int, c_out: int, *, groups: int) -> None:
        super().__init__()
        self.fuse = ConvBNAct(c_in + c_skip, c_out, kernel=1)
        self.refine = ConvBNAct(c_out, c_out, groups=groups)

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
        return self.refine(self.fuse(torch.cat((x, skip), dim=1)))


class SegNet(nn.Module):
    """U-Net-shaped segmentation network with grouped convolutions and BatchNorm.

    Module names: ``stem``, ``down.{i}`` (:class:`GroupedBlock`, stride 2),
    ``up.{i}`` (:class:`UpBlock`, deepest first), ``head`` (1x1 to class logits).
    """

    def __init__(self, config: SegConfig) -> None:
        super().__init__()
        c = config.base_channels
        widths = [c * 2**i for i in range(config.depth + 1)]
        self.stem = ConvBNAct(config.in_channels, c)
        self.down = nn.ModuleList(
            GroupedBlock(widths[i], widths[i + 1], stride=2, groups=config.groups)
            for i in range(config.depth)
        )
        self.up = nn.ModuleList(
            UpBlock(widths[i + 1], widths[i], widths[i], groups=config.groups)
            for i in reversed(range(config.depth))
        )
        self.head = nn.Conv2d(c, config.n_classes, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` images to ``(N, n_classes, H, W)`` logits (same memory format)."""
        x = self.stem(images)
        skips = [x]
        for block in self.down:
            x = block(x)
            skips.append(x)
        skips.pop()  # the deepest output is x itself
        for block in self.up:
            x = block(x, skips.pop())
        return self.head(x)


class SegWorkload(TrainingWorkload[SegBatch]):
    """Training step of :class:`SegNet` with AdamW and per-pixel cross-entropy.

    Weights and input images use ``config.memory_format`` (channels_last by default),
    so convolutions run in NHWC.

    Args:
        config: the workload's configuration.
        precision: optional mixed-precision policy, applied or as a factory applied to
            the model (see ``training.PrecisionArg``).
        clip: optional gradient clipper, called with ``model.named_parameters()`` between
            backward and step (see ``training.GradClipper``).
        optimizer_factory: builds the optimizer from the model; default AdamW.
    """

    model: SegNet

    def __init__(
        self,
        config: SegConfig,
        *,
        precision: PrecisionArg | None = None,
        clip: GradClipper | None = None,
        optimizer_factory: OptimizerFactory | None = None,
    ) -> None:
        self.config = config
        self.device = resolve_device(config.device, type(config).__name__)
        with seeded(config.seed):
            model = SegNet(config)
        # nn.Module.to takes memory_format at run time; the type stubs leave it out.
        model.to(self.device, memory_format=config.torch_memory_format)  # type: ignore[call-overload]
        super().__init__(
            model,
            precision=precision,
            clip=clip,
            optimizer_factory=optimizer_factory or self._default_optimizer,
        )
        # One palette for every batch: a class keeps its colour, so there is something to learn.
        self._palette = class_palette(config.n_classes, config.in_channels, config.seed)

    def _default_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )

    @property
    def samples_per_step(self) -> int:
        """Images in the default batch."""
        return self.config.batch_size

    @property
    def pixels_per_step(self) -> int:
        """Labelled pixels in the default batch."""
        return self.config.batch_size * self.config.image_size**2

    def make_batch(self, batch_size: int | None = None, *, seed: int | None = None) -> SegBatch:
        """A batch of synthetic images and masks on the device, in the workload's memory format.

        Args:
            batch_size: images (default ``config.batch_size``).
            seed: data seed (default ``config.seed``); the same seed gives the same batch.
        """
        cfg = self.config
        n = cfg.batch_size if batch_size is None else batch_size
        check_int("SegWorkload.make_batch", "batch_size", n)
        g = torch.Generator().manual_seed(cfg.seed if seed is None else seed)
        images, masks = synthetic_segmentation(
            n,
            image_size=cfg.image_size,
            in_channels=cfg.in_channels,
            n_classes=cfg.n_classes,
            generator=g,
            palette=self._palette,
        )
        return SegBatch(images=images, masks=masks).to(
            self.device, memory_format=cfg.torch_memory_format
        )

    def _model_inputs(self, batch: SegBatch) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (batch.images,), {}

    def _loss(self, output: Tensor, batch: SegBatch) -> Tensor:
        return F.cross_entropy(output, batch.masks)
