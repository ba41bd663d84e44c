"""A BERT-like encoder classifier and its training step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data import TokenBatch, synthetic_token_sequences
from .layers import NormPosition, TransformerBlock, init_weights
from .sizes import (
    Size,
    check_bool,
    check_choice,
    check_device,
    check_float,
    check_int,
    check_size,
    preset_with_overrides,
)
from .training import (
    GradClipper,
    NormFactory,
    OptimizerFactory,
    PrecisionArg,
    TrainingWorkload,
    resolve_device,
    seeded,
)

__all__ = ["Encoder", "EncoderConfig", "EncoderWorkload"]


@dataclass(frozen=True, kw_only=True)
class EncoderConfig:
    """Geometry, default batch shape and optimiser of the encoder workload."""

    vocab_size: int = 2048
    """Vocabulary size in tokens, special ids (PAD=0, CLS=1) included."""
    max_seq_len: int = 512
    """Rows of the position table: the longest padded batch accepted, in tokens (512 takes
    the whole query-length tail)."""
    d_model: int = 128
    """Hidden width, in features."""
    n_heads: int = 4
    """Attention heads; must divide ``d_model``."""
    d_ff: int = 512
    """FFN inner width, in features."""
    n_layers: int = 2
    """Transformer blocks."""
    n_classes: int = 2
    """Classifier outputs."""
    norm_position: NormPosition = "pre"
    """``pre``: LayerNorm before attention/FFN (stable without warm-up); ``post``: BERT's original."""
    norm_eps: float = 1e-5
    """LayerNorm epsilon."""
    dropout: float = 0.0
    """Dropout probability; 0 by default so steps are deterministic and timing is not
    perturbed by mask generation."""
    extra_ffn_matmul: bool = False
    """Plant a regression: one extra ``aten::mm`` per FFN in forward and one in backward,
    numerically a no-op (see ``layers.PlantedMatmul``)."""
    extra_ffn_width: int = 0
    """Output columns of the planted matmul (0: ``d_model``); smaller plants a smaller,
    graded operator regression."""
    batch_size: int = 8
    """Samples in the default batch (``make_batch()`` without lengths)."""
    seq_len: int = 64
    """Tokens per sample in the default batch."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    seed: int = 0
    """Seed of the weights and of the default batch."""
    device: str = "cpu"
    """Where the workload runs, as a ``torch.device`` string."""

    def __post_init__(self) -> None:
        o = type(self).__name__
        check_int(o, "vocab_size", self.vocab_size, minimum=3)
        for name in (
            "max_seq_len",
            "d_model",
            "n_heads",
            "d_ff",
            "n_layers",
            "batch_size",
            "seq_len",
        ):
            check_int(o, name, getattr(self, name))
        check_int(o, "n_classes", self.n_classes, minimum=2)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"{o}.d_model: expected a multiple of n_heads ({self.n_heads}), got {self.d_model!r}"
            )
        if self.seq_len > self.max_seq_len:
            raise ValueError(
                f"{o}.seq_len: expected <= max_seq_len ({self.max_seq_len}), got {self.seq_len!r}"
            )
        check_choice(o, "norm_position", self.norm_position, ("pre", "post"))
        check_float(o, "norm_eps", self.norm_eps, low=0.0, high=1.0, low_inclusive=False)
        check_float(o, "dropout", self.dropout, low=0.0, high=1.0, high_inclusive=False)
        check_bool(o, "extra_ffn_matmul", self.extra_ffn_matmul)
        check_int(o, "extra_ffn_width", self.extra_ffn_width, minimum=0)
        if self.extra_ffn_width > self.d_model:
            raise ValueError(f"{o}.extra_ffn_width: expected <= d_model ({self.d_model}), got {self.extra_ffn_width!r}")
        check_float(o, "lr", self.lr, low=0.0, high=math.inf, low_inclusive=False)
        check_float(o, "weight_decay", self.weight_decay, low=0.0, high=math.inf)
        check_int(o, "seed", self.seed, minimum=0)
        check_device(o, self.device)

    @classmethod
    def for_size(cls, size: Size, *, device: str = "cpu", **overrides: Any) -> EncoderConfig:
        """The preset for ``size`` on ``device``, with ``overrides`` replacing fields.

        Raises:
            ValueError: unknown size, unknown field in ``overrides``, or a bad value.
        """
        return preset_with_overrides(cls, _ENCODER_PRESETS[check_size(size)], device, overrides)


_ENCODER_PRESETS: dict[str, dict[str, Any]] = {
    # Sized for one CPU thread: tens of milliseconds per training step.
    "tiny": {},
    "small": dict(
        vocab_size=16384,
        max_seq_len=512,
        d_model=256,
        n_heads=4,
        d_ff=1024,
        n_layers=4,
        batch_size=16,
        seq_len=128,
    ),
    # BERT-base geometry (~110M parameters) at its long-sequence pre-training shape. The
    # host spends ~65-73 ms enqueuing a step on an H200 whatever the batch, so the batch
    # is sized for the GPU's work to exceed that: 64x128 tokens left the GPU idle 69 % of
    # the step, 64x512 19 % (benchmarks/gpu-step-probe-h200.md).
    "large": dict(
        vocab_size=30522,
        max_seq_len=512,
        d_model=768,
        n_heads=12,
        d_ff=3072,
        n_layers=12,
        batch_size=128,
        seq_len=512,
        lr=1e-4,
    ),
}


class _Embeddings(nn.Module):
    """Token + learned position embeddings (``tok``, ``pos``; ``norm`` for post-LN)."""

    def __init__(self, config: EncoderConfig, norm_factory: NormFactory) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_seq_len, config.d_model)
        # Post-LN blocks expect normalised input (BERT normalises its embeddings);
        # pre-LN blocks normalise themselves and end with final_norm instead.
        self.norm = (
            norm_factory(config.d_model, eps=config.norm_eps)
            if config.norm_position == "post"
            else None
        )
        self.drop = nn.Dropout(config.dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        s = input_ids.shape[1]
        if s > self.pos.num_embeddings:
            raise ValueError(
                f"Encoder: batch of {s} tokens exceeds max_seq_len {self.pos.num_embeddings}"
            )
        x = self.tok(input_ids) + self.pos(torch.arange(s, device=input_ids.device))
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x)


class Encoder(nn.Module):
    """BERT-like classifier: embeddings, transformer blocks, CLS pooler, classifier head.

    Module names are stable, because per-operator budgets and precision overrides refer
    to them: ``embed.tok``, ``embed.pos``, ``embed.norm`` (post-LN), ``blocks.{i}.norm1``,
    ``blocks.{i}.attn.qkv``, ``blocks.{i}.attn.out``, ``blocks.{i}.norm2``,
    ``blocks.{i}.ffn.fc1``, ``blocks.{i}.ffn.fc2``, ``blocks.{i}.ffn.extra`` (planted),
    ``final_norm`` (pre-LN), ``pooler``, ``head``.
    """

    def __init__(self, config: EncoderConfig, *, norm_factory: NormFactory = nn.LayerNorm) -> None:
        super().__init__()
        self.config = config
        self.embed = _Embeddings(config, norm_factory)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                config.d_model,
                config.n_heads,
                config.d_ff,
                norm_position=config.norm_position,
                norm_factory=norm_factory,
                norm_eps=config.norm_eps,
                dropout=config.dropout,
                extra_ffn_matmul=config.extra_ffn_matmul,
                extra_ffn_width=config.extra_ffn_width,
            )
            for _ in range(config.n_layers)
        )
        self.final_norm = (
            norm_factory(config.d_model, eps=config.norm_eps)
            if config.norm_position == "pre"
            else None
        )
        self.pooler = nn.Linear(config.d_model, config.d_model)
        self.head = nn.Linear(config.d_model, config.n_classes)
        init_weights(self)

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Hidden states.

        Args:
            input_ids: ``(B, S)`` int64.
            attention_mask: ``(B, S)`` bool, True on real tokens; None means no padding.

        Returns:
            ``(B, S, d_model)``; rows at padded positions are meaningless.
        """
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, key_padding_mask=attention_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Class logits ``(B, n_classes)`` from the CLS position (see :meth:`encode`)."""
        cls = self.encode(input_ids, attention_mask)[:, 0]
        return self.head(torch.tanh(self.pooler(cls)))


class EncoderWorkload(TrainingWorkload[TokenBatch]):
    """Training step of :class:`Encoder` with AdamW and cross-entropy.

    Example::

        w = EncoderWorkload(EncoderConfig.for_size("tiny"))
        batch = w.make_batch()                    # or w.make_batch(lengths=[...])
        loss = w.step(batch)

    Args:
        config: the workload's configuration.
        norm_factory: builds every norm layer (``factory(d_model, eps=...)``); default
            ``nn.LayerNorm``.
        precision: optional mixed-precision policy, applied or as a factory applied to
            the model (see ``training.PrecisionArg``), e.g. ``PrecisionPolicy(...).apply``.
        clip: optional gradient clipper, called with ``model.named_parameters()`` between
            backward and step (see ``training.GradClipper``).
        optimizer_factory: builds the optimizer from the model; default AdamW with
            ``config.lr`` and ``config.weight_decay``.
    """

    model: Encoder

    def __init__(
        self,
        config: EncoderConfig,
        *,
        norm_factory: NormFactory | None = None,
        precision: PrecisionArg | None = None,
        clip: GradClipper | None = None,
        optimizer_factory: OptimizerFactory | None = None,
    ) -> None:
        self.config = config
        self.device = resolve_device(config.device, type(config).__name__)
        with seeded(config.seed):
            model = Encoder(config, norm_factory=norm_factory or nn.LayerNorm)
        model.to(self.device)
        super().__init__(
            model,
            precision=precision,
            clip=clip,
            optimizer_factory=optimizer_factory or self._default_optimizer,
        )

    def _default_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        # Fused on CUDA: one kernel for every parameter instead of foreach's several per
        # group (2912 -> 1704 kernels a step on an H200). The CPU keeps the default path.
        return torch.optim.AdamW(
            model.parameters(),
            lr=self.config.lr,
            weight_decay=self.config.weight_decay,
            fused=self.device.type == "cuda",
        )

    @property
    def samples_per_step(self) -> int:
        """Samples in the default batch."""
        return self.config.batch_size

    @property
    def tokens_per_step(self) -> int:
        """Token positions in the default batch (it has no padding)."""
        return self.config.batch_size * self.config.seq_len

    def make_batch(
        self,
        lengths: Sequence[int] | None = None,
        *,
        batch_size: int | None = None,
        seq_len: int | None = None,
        seed: int | None = None,
    ) -> TokenBatch:
        """A batch of synthetic sequences on the workload's device.

        Args:
            lengths: length of each sequence in tokens (CLS included); the batch is
                right-padded. Without it: ``batch_size`` sequences of ``seq_len`` tokens
                (defaults from the config), no padding.
            batch_size: sequences when ``lengths`` is omitted (not allowed with it).
            seq_len: with ``lengths``, the padded width (>= the longest, e.g. a bucket's
                upper bound); without, each sequence's length.
            seed: data seed (default ``config.seed``); the same seed gives the same batch.

        Returns:
            A :class:`TokenBatch`.
        """
        cfg = self.config
        if lengths is None:
            n = cfg.batch_size if batch_size is None else batch_size
            s = cfg.seq_len if seq_len is None else seq_len
            check_int("EncoderWorkload.make_batch", "batch_size", n)
            check_int("EncoderWorkload.make_batch", "seq_len", s)
            lengths = [s] * n
            width = s
        else:
            if batch_size is not None:
                raise ValueError("EncoderWorkload.make_batch: pass lengths or batch_size, not both")
            if not lengths:
                raise ValueError("EncoderWorkload.make_batch: lengths is empty")
            width = max(lengths) if seq_len is None else seq_len
        if width > cfg.max_seq_len:
            raise ValueError(
                f"EncoderWorkload.make_batch: padded length {width} exceeds "
                f"EncoderConfig.max_seq_len ({cfg.max_seq_len})"
            )
        g = torch.Generator().manual_seed(cfg.seed if seed is None else seed)
        seqs, labels = synthetic_token_sequences(
            lengths, vocab_size=cfg.vocab_size, n_classes=cfg.n_classes, generator=g
        )
        return TokenBatch.from_sequences(seqs, labels, pad_to=width).to(self.device)

    def step(self, batch: TokenBatch | Mapping[str, Tensor]) -> Tensor:
        """One training step; also accepts a collated ``{"input_ids", "attention_mask", "labels"}``
        dict (moved to the device here, so convert it beforehand to keep the copy out of
        a timed step)."""
        if not isinstance(batch, TokenBatch):
            batch = TokenBatch.from_mapping(batch).to(self.device)
        return super().step(batch)

    def _model_inputs(self, batch: TokenBatch) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # A batch without padding skips the mask, so SDPA can take its unmasked
        # (faster) kernel, as a real trainer would for fixed-length input.
        mask = None if batch.num_tokens == batch.num_positions else batch.attention_mask
        return (batch.input_ids, mask), {}

    def _loss(self, output: Tensor, batch: TokenBatch) -> Tensor:
        return F.cross_entropy(output, batch.labels)
