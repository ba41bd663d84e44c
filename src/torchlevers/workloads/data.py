"""Synthetic data built in code: token and image/mask datasets and their batches (query-like lengths come from ``torchlevers.bucketing.lengths``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# Re-exported: one query-length generator, owned by the bucketing lever.
from torchlevers.bucketing.lengths import QueryLengthDistribution, query_lengths

from .sizes import check_int

__all__ = [
    "CLS_ID",
    "FIRST_TOKEN_ID",
    "PAD_ID",
    "QueryLengthDistribution",
    "SegBatch",
    "SegmentationDataset",
    "TokenBatch",
    "TokenDataset",
    "class_palette",
    "query_lengths",
    "synthetic_segmentation",
    "synthetic_token_sequences",
]

PAD_ID = 0
"""Token id used for padding."""
CLS_ID = 1
"""Token id that starts every sequence; the encoder classifies from its output."""
FIRST_TOKEN_ID = 2
"""Smallest id of an ordinary token."""


# --- tokens -------------------------------------------------------------------------------


def _check_lengths(lengths: Sequence[int], where: str) -> list[int]:
    out = [int(x) for x in lengths]
    bad = [x for x in out if x < 1]
    if bad:
        # A sequence with no real token would have every key masked: attention over an
        # empty set is NaN, so refuse it here instead of debugging NaNs later.
        raise ValueError(f"{where}: every length must be >= 1, got {bad[:5]}")
    return out


def synthetic_token_sequences(
    lengths: Sequence[int],
    *,
    vocab_size: int,
    n_classes: int,
    generator: torch.Generator,
) -> tuple[list[Tensor], Tensor]:
    """Random token sequences with a label that depends on their content.

    Each sequence is ``[CLS_ID, t_1, ..., t_{L-1}]`` with ``t_i`` uniform in
    ``[FIRST_TOKEN_ID, vocab_size)``. The label is the most frequent token class
    (``(t - FIRST_TOKEN_ID) % n_classes``; ties go to the smaller class), so a model
    can learn it and the loss means something.

    Args:
        lengths: length of each sequence in tokens, CLS included (each >= 1).
        vocab_size: vocabulary size (> FIRST_TOKEN_ID).
        n_classes: number of labels (>= 2).
        generator: CPU generator the tokens are drawn from.

    Returns:
        ``(sequences, labels)``: int64 CPU tensors of shape ``(L_i,)`` and ``(len(lengths),)``.
    """
    lengths = _check_lengths(lengths, "synthetic_token_sequences.lengths")
    check_int("synthetic_token_sequences", "vocab_size", vocab_size, minimum=FIRST_TOKEN_ID + 1)
    check_int("synthetic_token_sequences", "n_classes", n_classes, minimum=2)
    n = len(lengths)
    words = torch.tensor([x - 1 for x in lengths], dtype=torch.int64)
    flat = torch.randint(FIRST_TOKEN_ID, vocab_size, (int(words.sum()),), generator=generator)
    seq_of_word = torch.repeat_interleave(torch.arange(n), words)
    counts = torch.zeros(n, n_classes, dtype=torch.int64)
    counts.index_put_(
        (seq_of_word, (flat - FIRST_TOKEN_ID) % n_classes), torch.ones_like(flat), accumulate=True
    )
    labels = counts.argmax(dim=1)  # first maximum on ties
    cls = torch.tensor([CLS_ID], dtype=torch.int64)
    seqs = [torch.cat((cls, w)) for w in flat.split(words.tolist())]
    return seqs, labels


class TokenDataset(torch.utils.data.Dataset[dict[str, Tensor]]):
    """Variable-length token sequences with labels, generated once from a seed.

    ``dataset[i]`` is ``{"input_ids": ..., "labels": ...}``: an int64 tensor of shape
    ``(lengths[i],)`` starting with ``CLS_ID`` and a 0-dim int64 label (see
    :func:`synthetic_token_sequences`). Mapping items are what padding collators
    (``torchlevers.bucketing.BucketCollator``, Hugging Face's) take; their output feeds
    :meth:`TokenBatch.from_mapping`. ``dataset.lengths`` gives every length without
    touching the items, which is what a length-bucketing sampler needs.
    """

    def __init__(
        self, lengths: Sequence[int], vocab_size: int, seed: int = 0, *, n_classes: int = 2
    ) -> None:
        """Args:
        lengths: length of each sample in tokens (CLS included, each >= 1).
        vocab_size: vocabulary size; ids are in ``[0, vocab_size)``.
        seed: RNG seed; the same seed gives the same data.
        n_classes: number of labels.
        """
        self.lengths: list[int] = _check_lengths(lengths, "TokenDataset.lengths")
        self.vocab_size = vocab_size
        self.n_classes = n_classes
        g = torch.Generator().manual_seed(seed)
        self._seqs, self._labels = synthetic_token_sequences(
            self.lengths, vocab_size=vocab_size, n_classes=n_classes, generator=g
        )

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        # Clones so that a caller writing into a sample cannot change the dataset.
        return {"input_ids": self._seqs[index].clone(), "labels": self._labels[index].clone()}


@dataclass(frozen=True, eq=False)
class TokenBatch:
    """A right-padded batch of token sequences.

    ``num_tokens`` is computed once on the host when the batch is built, so reading
    tokens/s, or measuring padding from ``num_tokens`` and ``num_positions``, never
    synchronises a GPU.
    """

    input_ids: Tensor
    """``(B, S)`` int64; ``PAD_ID`` on padding."""
    attention_mask: Tensor
    """``(B, S)`` bool; True on real tokens."""
    labels: Tensor
    """``(B,)`` int64 class labels."""
    num_tokens: int
    """Real (non-padding) tokens in the batch."""

    @property
    def num_samples(self) -> int:
        """Sequences in the batch (B)."""
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        """Padded length S, in tokens."""
        return int(self.input_ids.shape[1])

    @property
    def num_positions(self) -> int:
        """Token positions computed, padding included (B * S)."""
        return self.num_samples * self.seq_len

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> TokenBatch:
        """The same batch on ``device``."""
        return TokenBatch(
            input_ids=self.input_ids.to(device, non_blocking=non_blocking),
            attention_mask=self.attention_mask.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            num_tokens=self.num_tokens,
        )

    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Tensor],
        labels: Sequence[int] | Tensor,
        *,
        pad_to: int | None = None,
    ) -> TokenBatch:
        """Right-pad ``sequences`` to ``pad_to`` (default: the longest) with ``PAD_ID``.

        Raises:
            ValueError: no sequences, a label count that differs, or a sequence longer
                than ``pad_to`` (sequences are never truncated silently).
        """
        if not sequences:
            raise ValueError("TokenBatch.from_sequences: no sequences")
        lengths = [int(s.shape[0]) for s in sequences]
        _check_lengths(lengths, "TokenBatch.from_sequences")
        width = max(lengths) if pad_to is None else pad_to
        if max(lengths) > width:
            raise ValueError(
                f"TokenBatch.from_sequences: a sequence of {max(lengths)} tokens does not fit "
                f"pad_to={width}; refusing to truncate"
            )
        labels_t = torch.as_tensor(labels, dtype=torch.int64)
        if labels_t.shape != (len(sequences),):
            raise ValueError(
                f"TokenBatch.from_sequences: expected {len(sequences)} labels, got shape "
                f"{tuple(labels_t.shape)}"
            )
        ids = torch.full((len(sequences), width), PAD_ID, dtype=torch.int64)
        for row, seq in zip(ids, sequences, strict=True):
            row[: seq.shape[0]] = seq
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        return cls(input_ids=ids, attention_mask=mask, labels=labels_t, num_tokens=sum(lengths))

    @classmethod
    def from_mapping(cls, batch: Mapping[str, Tensor]) -> TokenBatch:
        """Adopt a ``{"input_ids", "attention_mask", "labels"}`` dict (what collate functions return).

        Real tokens are counted from ``batch["lengths"]`` when present, else from the
        mask; on a GPU either read synchronises, so convert before the timed region.
        Other keys are ignored.
        """
        missing = {"input_ids", "attention_mask", "labels"} - set(batch)
        if missing:
            raise ValueError(f"TokenBatch.from_mapping: missing keys {sorted(missing)}")
        mask = batch["attention_mask"].bool()
        counted = batch.get("lengths", mask)
        return cls(
            input_ids=batch["input_ids"],
            attention_mask=mask,
            labels=batch["labels"],
            num_tokens=int(counted.sum()),
        )


# --- images -------------------------------------------------------------------------------


def _palette(n_classes: int, in_channels: int, generator: torch.Generator) -> Tensor:
    return torch.rand(n_classes, in_channels, generator=generator) * 2 - 1


def class_palette(n_classes: int, in_channels: int, seed: int = 0) -> Tensor:
    """A fixed colour per class: float32 ``(n_classes, in_channels)`` in [-1, 1)."""
    return _palette(n_classes, in_channels, torch.Generator().manual_seed(seed))


def synthetic_segmentation(
    n: int,
    *,
    image_size: int,
    in_channels: int,
    n_classes: int,
    generator: torch.Generator,
    palette: Tensor | None = None,
    shapes_per_image: int = 5,
    noise_std: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """Images of coloured rectangles and discs on a background, with their class masks.

    Every class has a fixed colour and pixels get Gaussian noise, so per-pixel
    classification is learnable but not trivial.

    Args:
        n: number of images.
        image_size: height and width in pixels.
        in_channels: image channels.
        n_classes: classes, background (0) included (>= 2).
        generator: CPU generator everything is drawn from.
        palette: ``(n_classes, in_channels)`` colour of each class; drawn from
            ``generator`` when omitted. Pass one palette (see :func:`class_palette`)
            to keep a class the same colour across batches.
        shapes_per_image: objects painted per image (later ones cover earlier ones).
        noise_std: standard deviation of the pixel noise.

    Returns:
        ``(images, masks)``: float32 ``(n, C, H, W)`` (contiguous) and int64 ``(n, H, W)``.
    """
    check_int("synthetic_segmentation", "n", n, minimum=1)
    check_int("synthetic_segmentation", "image_size", image_size, minimum=1)
    check_int("synthetic_segmentation", "in_channels", in_channels, minimum=1)
    check_int("synthetic_segmentation", "n_classes", n_classes, minimum=2)
    size = image_size
    if palette is None:
        palette = _palette(n_classes, in_channels, generator)
    elif palette.shape != (n_classes, in_channels):
        raise ValueError(
            f"synthetic_segmentation.palette: expected shape {(n_classes, in_channels)}, "
            f"got {tuple(palette.shape)}"
        )
    masks = torch.zeros(n, size, size, dtype=torch.int64)
    yy = torch.arange(size, dtype=torch.float32).view(1, size, 1)
    xx = torch.arange(size, dtype=torch.float32).view(1, 1, size)
    for _ in range(shapes_per_image):
        cls = torch.randint(1, n_classes, (n, 1, 1), generator=generator)
        cy = torch.rand(n, 1, 1, generator=generator) * size
        cx = torch.rand(n, 1, 1, generator=generator) * size
        half = (0.1 + 0.15 * torch.rand(n, 2, 1, 1, generator=generator)) * size
        disc = torch.rand(n, 1, 1, generator=generator) < 0.5
        in_rect = ((yy - cy).abs() <= half[:, 0]) & ((xx - cx).abs() <= half[:, 1])
        in_disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= half[:, 0] ** 2
        masks = torch.where(torch.where(disc, in_disc, in_rect), cls, masks)
    images = palette[masks].permute(0, 3, 1, 2).contiguous()
    images += noise_std * torch.randn(images.shape, generator=generator)
    return images, masks


class SegmentationDataset(torch.utils.data.Dataset[tuple[Tensor, Tensor]]):
    """``n`` synthetic (image, mask) pairs; item ``i`` depends only on ``(seed, i)``.

    ``dataset[i]`` is ``(image, mask)``: float32 ``(C, H, W)`` and int64 ``(H, W)``.
    """

    def __init__(
        self, n: int, *, image_size: int, in_channels: int = 3, n_classes: int = 4, seed: int = 0
    ) -> None:
        check_int("SegmentationDataset", "n", n, minimum=1)
        check_int("SegmentationDataset", "seed", seed, minimum=0)
        self.n = n
        self.image_size = image_size
        self.in_channels = in_channels
        self.n_classes = n_classes
        self.seed = seed
        self.palette = class_palette(n_classes, in_channels, seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not 0 <= index < self.n:
            raise IndexError(f"SegmentationDataset index {index} out of range [0, {self.n})")
        # One generator per item: the item is the same whatever order items are read in.
        g = torch.Generator().manual_seed((self.seed << 32) + index + 1)
        images, masks = synthetic_segmentation(
            1,
            image_size=self.image_size,
            in_channels=self.in_channels,
            n_classes=self.n_classes,
            generator=g,
            palette=self.palette,
        )
        return images[0], masks[0]


@dataclass(frozen=True, eq=False)
class SegBatch:
    """A batch of images and per-pixel class masks."""

    images: Tensor
    """``(N, C, H, W)`` float32 (channels_last in memory when the workload uses it)."""
    masks: Tensor
    """``(N, H, W)`` int64 class per pixel."""

    @property
    def num_samples(self) -> int:
        """Images in the batch (N)."""
        return int(self.images.shape[0])

    @property
    def num_pixels(self) -> int:
        """Labelled pixels in the batch (N * H * W)."""
        return int(self.masks.numel())

    def to(
        self,
        device: torch.device | str,
        *,
        memory_format: torch.memory_format = torch.contiguous_format,
        non_blocking: bool = False,
    ) -> SegBatch:
        """The same batch on ``device``, images in ``memory_format``."""
        return SegBatch(
            images=self.images.to(device, memory_format=memory_format, non_blocking=non_blocking),
            masks=self.masks.to(device, non_blocking=non_blocking),
        )
