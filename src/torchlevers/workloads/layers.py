"""Transformer building blocks shared by the encoder and the decoder, with stable module names."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .training import NormFactory

__all__ = [
    "FeedForward",
    "NormPosition",
    "PlantedMatmul",
    "SelfAttention",
    "TransformerBlock",
    "init_weights",
]

NormPosition = Literal["pre", "post"]


class PlantedMatmul(nn.Module):
    """A matmul by a frozen all-zero ``(d_in, d_out)`` matrix: costs time, changes nothing.

    Planted in the FFN to simulate an operator-level regression: ``fc2(h) + h @ 0`` is
    bit-identical to ``fc2(h)``, so losses and numerical-health budgets stay put and
    only time moves, all of it in ``aten::mm`` (one call in forward, one in backward for
    the input gradient; the matrix is a buffer, so there is no weight gradient). Zeros
    are not skipped by BLAS, so the full ``2 * tokens * d_in * d_out`` FLOPs are paid.
    """

    weight: Tensor

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.zeros(d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:
        # Explicit 2-D mm so the regression shows up as exactly one aten::mm per call,
        # whatever the leading dimensions.
        flat = x.reshape(-1, x.shape[-1])
        return torch.mm(flat, self.weight).view(*x.shape[:-1], -1)


class FeedForward(nn.Module):
    """``fc2(gelu(fc1(x)))``; names ``fc1``, ``fc2`` (and ``extra`` when planted)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        extra_matmul: bool = False,
        extra_width: int = 0,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)
        # extra_width < d_model plants a smaller regression (zero-padded back to d_model).
        self.extra_width = extra_width or d_model
        self.extra = PlantedMatmul(d_ff, self.extra_width) if extra_matmul else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.fc1(x))
        y = self.fc2(h)
        if self.extra is not None:
            e = self.extra(h)
            if self.extra_width != y.shape[-1]:
                e = nn.functional.pad(e, (0, y.shape[-1] - self.extra_width))
            y = y + e
        return self.drop(y)


class SelfAttention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention``.

    Submodules: ``qkv`` (fused input projection) and ``out``. Either a key-padding mask
    (encoder) or causal masking with an optional preallocated key/value buffer
    (decoder serving) applies.
    """

    def __init__(self, d_model: int, n_heads: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"SelfAttention: d_model ({d_model}) must be a multiple of n_heads ({n_heads})"
            )
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        kv_buffers: tuple[Tensor, Tensor] | None = None,
        start: int = 0,
    ) -> Tensor:
        """Attend over ``x`` (and over cached keys/values when ``kv_buffers`` is given).

        Args:
            x: ``(B, T, d_model)``.
            key_padding_mask: ``(B, T)`` bool, True on real tokens; padded keys get no
                attention weight, so real tokens' outputs do not depend on padding.
            causal: each position attends only to itself and earlier positions.
            kv_buffers: ``(keys, values)`` of shape ``(B, H, capacity, head_dim)``; the
                new keys/values are written at ``[start, start + T)`` and attention runs
                over ``[0, start + T)``.
            start: number of positions already in ``kv_buffers``.

        Returns:
            ``(B, T, d_model)``.
        """
        b, t, d = x.shape
        q, k, v = (
            self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        )
        mask: Tensor | None = None
        if kv_buffers is not None:
            keys, values = kv_buffers
            end = start + t
            if end > keys.shape[2]:
                raise ValueError(
                    f"SelfAttention: KV cache holds {keys.shape[2]} positions, need {end}"
                )
            keys[:, :, start:end] = k
            values[:, :, start:end] = v
            k, v = keys[:, :, :end], values[:, :, :end]
            if causal and start > 0:
                # SDPA's is_causal aligns the mask to the top-left corner, which is wrong
                # once queries start after cached keys; build the shifted mask instead.
                # A single new query may see every cached key: no mask at all.
                if t > 1:
                    pos_q = torch.arange(start, end, device=x.device)[:, None]
                    mask = pos_q >= torch.arange(end, device=x.device)[None, :]
                causal = False
        if key_padding_mask is not None:
            if mask is not None or causal:
                raise ValueError(
                    "SelfAttention: key_padding_mask cannot be combined with causal masking"
                )
            mask = key_padding_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal,
        )
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """Attention + FFN with residuals; names ``norm1``, ``attn``, ``norm2``, ``ffn``.

    ``pre``: ``x + attn(norm1(x))`` then ``x + ffn(norm2(x))`` (trains without warm-up,
    the modern default). ``post``: ``norm1(x + attn(x))`` then ``norm2(x + ffn(x))``
    (the original BERT arrangement).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        norm_position: NormPosition,
        norm_factory: NormFactory,
        norm_eps: float,
        dropout: float = 0.0,
        extra_ffn_matmul: bool = False,
        extra_ffn_width: int = 0,
    ) -> None:
        super().__init__()
        self.norm_position = norm_position
        self.norm1 = norm_factory(d_model, eps=norm_eps)
        self.attn = SelfAttention(d_model, n_heads, dropout=dropout)
        self.drop = nn.Dropout(dropout)
        self.norm2 = norm_factory(d_model, eps=norm_eps)
        self.ffn = FeedForward(d_model, d_ff, dropout=dropout, extra_matmul=extra_ffn_matmul,
                               extra_width=extra_ffn_width)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        kv_buffers: tuple[Tensor, Tensor] | None = None,
        start: int = 0,
    ) -> Tensor:
        """See :meth:`SelfAttention.forward` for the arguments."""

        def attend(h: Tensor) -> Tensor:
            return self.drop(
                self.attn(
                    h,
                    key_padding_mask=key_padding_mask,
                    causal=causal,
                    kv_buffers=kv_buffers,
                    start=start,
                )
            )

        if self.norm_position == "pre":
            x = x + attend(self.norm1(x))
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + attend(x))
        return self.norm2(x + self.ffn(x))


def init_weights(module: nn.Module, *, std: float = 0.02) -> None:
    """BERT/GPT-2 initialisation: N(0, std) for linear and embedding weights, zero biases.

    Norm layers keep their own initialisation (weight 1, bias 0 for LayerNorm), so an
    injected norm implementation is not overwritten.
    """
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
